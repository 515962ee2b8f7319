"""ONNX export of a saved model, with an automatic ONNX Runtime parity check and a speed comparison.

`export_onnx(model_dir, out_path)` traces the model (PyTorch's TorchScript-based exporter, which needs no
`onnxscript`) with dynamic batch and sequence axes, writes the file atomically, then runs ONNX Runtime and
PyTorch on the same inputs — two shapes different from the traced one, with padding — and reports the
largest absolute difference of every output. Above `tolerance` (1e-4 in fp32) it raises: an exported
model that answers differently is worse than none (huggingface/transformers#8465). Finally it times both
runtimes on one batch and reports milliseconds per batch.

Inputs are `input_ids`, `token_type_ids`, `attention_mask` (int64 [batch, sequence]; [batch, choices,
sequence] for multiple choice); outputs are named after the model's output fields (`logits`,
`start_logits`/`end_logits`, `last_hidden_state`/`pooled_output`, `mlm_logits`/`nsp_logits`). Both come
from the model's family (`families.registry.for_model`: a bare encoder is the embedding family), which
declares them (`export_outputs`, `input_axes`).
Needs the `export` extra: onnx, onnxruntime.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.errors import BertforgeError, ConfigError
from bertforge.families import registry
from bertforge.families.base import Family
from bertforge.model.bert import BertPretrainedModel

FP32_TOLERANCE = 1e-4
DEFAULT_OPSET = 17
INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")


@dataclass
class ExportReport:
    """What `export_onnx` wrote and measured.

    Attributes:
        path: the .onnx file.
        outputs: output names in order.
        max_abs_diff: per output, the largest |ONNX Runtime - PyTorch| over the check inputs.
        torch_ms, onnxruntime_ms: median milliseconds per batch of `speed_shape` (None if not timed).
        speed_shape: (batch, sequence) of the timed batch.
    """

    path: Path
    outputs: list[str]
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    torch_ms: float | None = None
    onnxruntime_ms: float | None = None
    speed_shape: tuple[int, int] = (8, 128)

    def summary(self) -> str:
        diff = ", ".join(f"{k} {v:.2e}" for k, v in self.max_abs_diff.items())
        speed = ""
        if self.torch_ms is not None and self.onnxruntime_ms is not None:
            speed = (f"; batch {self.speed_shape[0]}x{self.speed_shape[1]}: PyTorch {self.torch_ms:.1f} ms, "
                     f"ONNX Runtime {self.onnxruntime_ms:.1f} ms")
        return f"{self.path}: max |diff| {diff}{speed}"


def output_axes(model: BertPretrainedModel, family: Family) -> dict[str, dict[int, str]]:
    """The family's ONNX outputs that `model` returns, with their dynamic axes (dim -> name); a bare encoder
    built without its pooler has no `pooled_output`, so one probe call on a short input decides."""
    with torch.inference_mode():
        probe = model(*example_inputs(model, family, 1, min(8, model.config.max_position_embeddings), seed=0))
    return {name: dict(axes) for name, axes in family.export_outputs.items() if getattr(probe, name, None) is not None}


class OnnxModule(nn.Module):
    """Positional tensors in, a tuple of named output tensors out: the signature ONNX tracing wants."""

    def __init__(self, model: BertPretrainedModel, names: list[str]):
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, input_ids, token_type_ids, attention_mask):
        out = self.model(input_ids, token_type_ids, attention_mask)
        return tuple(getattr(out, name) for name in self.names)


def example_inputs(model: BertPretrainedModel, family: Family, batch: int, tokens: int, seed: int,
                   pad_from: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random valid inputs; row 1 padded from `pad_from` on, segment B in the second half."""
    generator = torch.Generator().manual_seed(seed)
    rank = len(family.input_axes)
    shape = (batch, 2, tokens) if rank == 3 else (batch, tokens)  # two choices when the inputs are [B, C, T]
    ids = torch.randint(1, model.config.vocab_size, shape, generator=generator)
    types = torch.zeros(shape, dtype=torch.long)
    types[..., tokens // 2:] = 1 if model.config.type_vocab_size > 1 else 0
    mask = torch.ones(shape, dtype=torch.long)
    if pad_from is not None and batch > 1:
        mask[1, ..., pad_from:] = 0
    return ids, types, mask


def feeds(inputs: tuple[torch.Tensor, ...]) -> dict[str, np.ndarray]:
    """ONNX Runtime's input dict for positional model inputs."""
    return {name: tensor.numpy() for name, tensor in zip(INPUT_NAMES, inputs)}


def time_ms(run, repeats: int) -> float:
    """Median wall time of `run()` in milliseconds, after one warm-up call."""
    run()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def write_onnx(wrapper: OnnxModule, family: Family, axes: dict[str, dict[int, str]], out: Path, opset: int) -> None:
    """Trace `wrapper` into `out` (atomically: a checked temporary file, then renamed)."""
    import onnx

    input_axes = dict(family.input_axes)
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".onnx", dir=out.parent)
    os.close(handle)
    try:
        with warnings.catch_warnings():
            # The tracer warns about the encoder's Python-side input checks; they are checks, not data flow.
            warnings.simplefilter("ignore")
            torch.onnx.export(wrapper, example_inputs(wrapper.model, family, 2, 16, seed=0), tmp,
                              input_names=list(INPUT_NAMES), output_names=wrapper.names,
                              dynamic_axes={**{n: input_axes for n in INPUT_NAMES}, **axes},
                              opset_version=opset, dynamo=False)
        onnx.checker.check_model(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_parity(wrapper: OnnxModule, family: Family, session: Any, report: ExportReport, tolerance: float) -> None:
    """Record the largest |ONNX Runtime - PyTorch| of every output in `report`; raise above `tolerance`."""
    positions = wrapper.model.config.max_position_embeddings
    # Shapes other than the traced (2, 16) prove the axes are dynamic; row 1 is padded.
    for batch, tokens, seed in ((3, 37, 1), (1, 9, 2)):
        tokens = min(tokens, positions)
        inputs = example_inputs(wrapper.model, family, batch, tokens, seed, pad_from=tokens - 5)
        with torch.inference_mode():
            expected = wrapper(*inputs)
        got = session.run(wrapper.names, feeds(inputs))
        for name, ours, theirs in zip(wrapper.names, expected, got):
            diff = float(np.abs(ours.numpy() - theirs).max())
            report.max_abs_diff[name] = max(report.max_abs_diff.get(name, 0.0), diff)
    worst = max(report.max_abs_diff.values())
    if worst > tolerance:
        raise BertforgeError(f"{report.path}: ONNX Runtime differs from PyTorch by {worst:.2e} (> {tolerance:.0e}); "
                             f"per output {report.max_abs_diff}. Do not deploy this file; report the model and "
                             "versions")


def time_runtimes(wrapper: OnnxModule, family: Family, session: Any, report: ExportReport, repeats: int) -> None:
    """Median milliseconds per batch of `report.speed_shape` in PyTorch and in ONNX Runtime, into `report`."""
    batch, tokens = report.speed_shape
    inputs = example_inputs(wrapper.model, family, batch, min(tokens, wrapper.model.config.max_position_embeddings),
                            seed=3)
    arrays = feeds(inputs)

    def run_torch() -> Any:
        with torch.inference_mode():
            return wrapper(*inputs)

    report.torch_ms = time_ms(run_torch, repeats)
    report.onnxruntime_ms = time_ms(lambda: session.run(wrapper.names, arrays), repeats)


def export_onnx(model_dir: str | os.PathLike, out_path: str | os.PathLike, *, opset: int = DEFAULT_OPSET,
                check: bool = True, tolerance: float = FP32_TOLERANCE, speed_shape: tuple[int, int] = (8, 128),
                repeats: int = 10) -> ExportReport:
    """Export `model_dir` to ONNX at `out_path`, check it against PyTorch and time both.

    Args:
        model_dir: a saved model directory (any bertforge/Hugging Face BERT class).
        out_path: the .onnx file to write (atomically).
        opset: ONNX opset (>= 14, for scaled dot-product attention).
        check: run the ONNX Runtime parity check and the timing (needs onnxruntime).
        tolerance: largest accepted |difference| of any output (fp32).
        speed_shape: (batch, sequence) of the timed batch; repeats: timed runs per runtime.

    Returns:
        An ExportReport.

    Raises:
        BertforgeError: the outputs differ by more than `tolerance` (the file is still written, for
            inspection). ConfigError: onnx / onnxruntime are missing.
    """
    try:
        import onnx  # noqa: F401  (checked here, before the model loads; `write_onnx` uses it)
    except ImportError:
        raise ConfigError("ONNX export needs the 'export' extra: pip install 'bertforge[export]'") from None
    # The plain path: tracing records one graph, and the padding-free layout's per-sequence loop is not one.
    model, _ = registry.load_model(model_dir, fast_path=False)
    model = model.float().eval()
    family = registry.for_model(model)
    axes = output_axes(model, family)
    wrapper = OnnxModule(model, list(axes)).eval()
    out = Path(out_path)
    write_onnx(wrapper, family, axes, out, opset)
    report = ExportReport(out, list(axes), speed_shape=speed_shape)
    if not check:
        return report
    try:
        import onnxruntime
    except ImportError:
        raise ConfigError("the parity check needs onnxruntime: pip install 'bertforge[export]' "
                          "(or pass check=False)") from None
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    check_parity(wrapper, family, session, report, tolerance)
    time_runtimes(wrapper, family, session, report, repeats)
    return report


__all__ = ["ExportReport", "FP32_TOLERANCE", "export_onnx"]
