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
The graph is traced from the plain path (padded, separate query/key/value projections: the fused-QKV and
padding-free fast paths are never exported) in the form ONNX Runtime's BERT optimizer recognizes
(`graph_form`): attention as HF's eager attention spells it (scores / sqrt(D) + (1 - mask) * min, softmax,
@ V) instead of one scaled-dot-product call whose boolean mask its matcher does not know, and position ids
expanded to the input's shape. `onnx_graph.export_optimized` then fuses it (Attention, EmbedLayer-
Normalization, SkipLayerNormalization, BiasGelu) and quantizes it. The embedding family also exports its
sentence vector (`sentence_embedding`: the directory's pooling, normalized when it says so).
A ModernBERT is traced as it runs on the padded path (fused Wqkv, rotary tables, a masked SDPA call, GeGLU): its
local layers' banded mask is built inside the graph from the input's length (`layouts.Padded.mask_for` keeps it
while tracing, even at a traced length within the window), so the graph holds the window at any length; ONNX
Runtime's BERT fusions find little to fuse there, and the graph is held to PyTorch by the same check.
Needs the `export` extra: onnx, onnxruntime.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertforge.errors import BertforgeError, ConfigError
from bertforge.families import registry
from bertforge.families.base import Family
from bertforge.families.embedding import Embedding, pool
from bertforge.interop.sentence_transformers import SentenceSettings, read_settings
from bertforge.model.bert import BertPretrainedModel, Embeddings, SelfAttention
from bertforge.model.fast_paths import FusedSelfAttention, Variant, variant
from bertforge.model.layouts import Padded

FP32_TOLERANCE = 1e-4
DEFAULT_OPSET = 17
INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")
SENTENCE_OUTPUT = "sentence_embedding"


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
    """Positional tensors in, a tuple of named output tensors out: the signature ONNX tracing wants.

    With `sentence` (pooling name, normalize) the last output is the sentence vector [B, D] pooled from
    `last_hidden_state` by `families.embedding.pool`, the function the `embed` pipeline runs.
    """

    def __init__(self, model: BertPretrainedModel, names: list[str], sentence: tuple[str, bool] | None = None):
        super().__init__()
        self.model = model
        self.names = names
        self.sentence = sentence

    def forward(self, input_ids, token_type_ids, attention_mask):
        out = self.model(input_ids, token_type_ids, attention_mask)
        outputs = [getattr(out, name) for name in self.names if name != SENTENCE_OUTPUT]
        if self.sentence is not None:
            pooling, normalize = self.sentence
            vectors = pool(out.last_hidden_state, attention_mask, pooling)  # [B, T, H] -> [B, D]
            outputs.append(F.normalize(vectors, dim=-1) if normalize else vectors)
        return tuple(outputs)


def sentence_output(model_dir: str | os.PathLike, family: Family,
                    axes: dict[str, dict[int, str]]) -> tuple[str, bool] | None:
    """The embedding family's (pooling, normalize): the directory's sentence-transformers settings, else the
    family's defaults (mean, not normalized); None for other families."""
    if not isinstance(family, Embedding) or "last_hidden_state" not in axes:
        return None
    settings = read_settings(model_dir) or SentenceSettings(pooling=family.options["pooling"],
                                                            normalize=family.options["normalize"])
    return settings.pooling, settings.normalize


class OnnxAttention(Variant):
    """Self-attention spelled the way ONNX Runtime's BERT optimizer recognizes it (its `FusionAttention`).

    The plain path calls scaled dot-product attention with a boolean mask; traced, that becomes a
    Where(mask, 0, -inf) the matcher knows in none of its patterns, and no Attention node is fused. This form
    is Hugging Face's eager BERT attention: MatMul(Q, K^T) / sqrt(D) + (1 - mask) * min, Softmax, MatMul V,
    over the three separate projections. Same numbers as the plain path up to rounding (the export's parity
    check holds every output within 1e-4); used only while tracing (`graph_form`).
    """

    prefix = "Onnx"

    def forward(self, x: torch.Tensor, layout: Padded, return_probs: bool = False):
        if not isinstance(layout, Padded):
            raise BertforgeError("ONNX export traces the padded plain path; load the model with fast_path=False")
        q, k, v = self.projections(x)  # [B, T, H] each
        batch, tokens, hidden = q.shape
        size = hidden // self.num_heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, tokens, self.num_heads, size).transpose(1, 2)  # [B, T, H] -> [B, N, T, D]

        scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(size)  # [B, N, T, T]
        if layout.mask is not None:  # bool [B, 1, 1, T] -> additive 0 / min
            scores = scores + (1.0 - layout.mask.to(scores.dtype)) * torch.finfo(scores.dtype).min
        context = scores.softmax(dim=-1) @ split(v)  # [B, N, T, D]
        context = context.transpose(1, 2).reshape(batch, tokens, hidden)  # [B, N, T, D] -> [B, T, H]
        return self.norm(x + self.dropout(self.output(context))), None


class OnnxEmbeddings(Variant):
    """Embeddings whose position ids are expanded to the shape of `input_ids` ([1, T] -> [B, T]): the position
    path ONNX Runtime's `FusionEmbedLayerNormalization` matches (Range -> Unsqueeze -> Expand(Shape(ids)))."""

    prefix = "Onnx"

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, position_ids: torch.Tensor):
        return super().forward(input_ids, token_type_ids, position_ids.expand_as(input_ids))


@contextmanager
def graph_form(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, `model`'s attention and embedding modules are their ONNX forms (same parameters,
    same numbers); afterwards the plain classes again."""
    swapped = []
    for module in model.modules():
        if isinstance(module, FusedSelfAttention):
            raise BertforgeError("ONNX export needs separate query/key/value projections: load the model with "
                                 "fast_path=False")
        for mixin, plain in ((OnnxAttention, SelfAttention), (OnnxEmbeddings, Embeddings)):
            if type(module) is plain:
                module.__class__ = variant(mixin, plain)
                swapped.append((module, plain))
    try:
        yield model
    finally:
        for module, plain in swapped:
            module.__class__ = plain


def example_inputs(model: BertPretrainedModel, family: Family, batch: int, tokens: int, seed: int,
                   pad_from: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random valid inputs; row 1 padded from `pad_from` on, segment B in the second half."""
    generator = torch.Generator().manual_seed(seed)
    rank = len(family.input_axes)
    shape = (batch, 2, tokens) if rank == 3 else (batch, tokens)  # two choices when the inputs are [B, C, T]
    ids = torch.randint(1, model.config.vocab_size, shape, generator=generator)
    types = torch.zeros(shape, dtype=torch.long)
    types[..., tokens // 2:] = 1 if getattr(model.config, "type_vocab_size", 1) > 1 else 0  # (ModernBERT: none)
    mask = torch.ones(shape, dtype=torch.long)
    if pad_from is not None and batch > 1:
        mask[1, ..., pad_from:] = 0
    return ids, types, mask


def feeds(inputs: tuple[torch.Tensor, ...], session: Any = None) -> dict[str, np.ndarray]:
    """ONNX Runtime's input dict for positional model inputs; with `session`, only the inputs its graph takes (a
    model that ignores an input, ModernBERT its token types, is exported without it)."""
    taken = None if session is None else {i.name for i in session.get_inputs()}
    return {name: tensor.numpy() for name, tensor in zip(INPUT_NAMES, inputs) if taken is None or name in taken}


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
    """Trace `wrapper` in its ONNX form (`graph_form`) into `out` (atomically: a checked temporary file, then
    renamed). The TorchScript exporter (`dynamo=False`): its graph keeps the Q/K/V MatMul -> Add -> Reshape
    -> Transpose chains ONNX Runtime's matcher walks, and it needs no `onnxscript`."""
    import onnx

    input_axes = dict(family.input_axes)
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".onnx", dir=out.parent)
    os.close(handle)
    try:
        with warnings.catch_warnings(), graph_form(wrapper.model):
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


def parity_inputs(model: BertPretrainedModel, family: Family) -> Iterator[tuple[torch.Tensor, ...]]:
    """The check inputs: shapes other than the traced (2, 16), so the axes must be dynamic; row 1 padded."""
    positions = model.config.max_position_embeddings
    for batch, tokens, seed in ((3, 37, 1), (1, 9, 2)):
        tokens = min(tokens, positions)
        yield example_inputs(model, family, batch, tokens, seed, pad_from=tokens - 5)


def max_differences(reference: OnnxModule, family: Family, session: Any) -> dict[str, float]:
    """Per output, the largest |ONNX Runtime - PyTorch| over `parity_inputs`."""
    worst: dict[str, float] = {}
    for inputs in parity_inputs(reference.model, family):
        with torch.inference_mode():
            expected = reference(*inputs)
        got = session.run(reference.names, feeds(inputs, session))
        for name, ours, theirs in zip(reference.names, expected, got):
            worst[name] = max(worst.get(name, 0.0), float(np.abs(ours.numpy() - theirs).max()))
    return worst


def check_parity(path: Path, differences: dict[str, float], tolerance: float) -> None:
    """Raise when any output differs from PyTorch by more than `tolerance`."""
    worst = max(differences.values())
    if worst > tolerance:
        raise BertforgeError(f"{path}: ONNX Runtime differs from PyTorch by {worst:.2e} (> {tolerance:.0e}); "
                             f"per output {differences}. Do not deploy this file; report the model and "
                             "versions")


def time_runtimes(wrapper: OnnxModule, family: Family, session: Any, report: ExportReport, repeats: int) -> None:
    """Median milliseconds per batch of `report.speed_shape` in PyTorch and in ONNX Runtime, into `report`."""
    batch, tokens = report.speed_shape
    inputs = example_inputs(wrapper.model, family, batch, min(tokens, wrapper.model.config.max_position_embeddings),
                            seed=3)
    arrays = feeds(inputs, session)

    def run_torch() -> Any:
        with torch.inference_mode():
            return wrapper(*inputs)

    report.torch_ms = time_ms(run_torch, repeats)
    report.onnxruntime_ms = time_ms(lambda: session.run(wrapper.names, arrays), repeats)


def session_of(path: Path) -> Any:
    """An ONNX Runtime CPU session on `path` (ConfigError when onnxruntime is missing)."""
    try:
        import onnxruntime
    except ImportError:
        raise ConfigError("the parity check needs onnxruntime: pip install 'bertforge[export]' "
                          "(or pass check=False)") from None
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def trace_module(model: BertPretrainedModel, family: Family, out: Path, opset: int = DEFAULT_OPSET,
                 sentence: tuple[str, bool] | None = None) -> OnnxModule:
    """Write the ONNX graph of `model` (a model on the plain path: padded, separate Q/K/V projections) with the
    outputs `family` declares (and, with `sentence`, the sentence vector) to `out`; the PyTorch reference
    wrapper of what was traced."""
    axes = output_axes(model, family)
    if sentence is not None:
        axes[SENTENCE_OUTPUT] = {0: "batch"}
    wrapper = OnnxModule(model, list(axes), sentence).eval()
    write_onnx(wrapper, family, axes, out, opset)
    return wrapper


def traced_model(model_dir: str | os.PathLike, out: Path, opset: int) -> tuple[OnnxModule, Family]:
    """Load `model_dir` on the plain path, write its ONNX graph to `out`; the PyTorch reference wrapper and
    the model's family."""
    try:
        import onnx  # noqa: F401  (checked here, before the model loads; `write_onnx` uses it)
    except ImportError:
        raise ConfigError("ONNX export needs the 'export' extra: pip install 'bertforge[export]'") from None
    # The plain path: tracing records one graph, and the padding-free layout's per-sequence loop is not one;
    # ONNX Runtime's matcher needs the three separate projections, not the fused QKV matmul.
    model, _ = registry.load_model(model_dir, fast_path=False)
    model = model.float().eval()
    family = registry.for_model(model)
    sentence = sentence_output(model_dir, family, output_axes(model, family))
    return trace_module(model, family, out, opset, sentence), family


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
    out = Path(out_path)
    wrapper, family = traced_model(model_dir, out, opset)
    report = ExportReport(out, list(wrapper.names), speed_shape=speed_shape)
    if not check:
        return report
    session = session_of(out)
    report.max_abs_diff = max_differences(wrapper, family, session)
    check_parity(out, report.max_abs_diff, tolerance)
    time_runtimes(wrapper, family, session, report, repeats)
    return report


__all__ = ["ExportReport", "FP32_TOLERANCE", "export_onnx"]
