"""ONNX Runtime's side of the export: fuse the exported graph, quantize it to int8, report how each answers.

`export_optimized(model_dir, out_path, quantize="int8")` writes, beside `out_path` (say `model.onnx`):

- `model.onnx`: the plain export (`onnx_export.traced_model`: the plain path in the form ONNX Runtime matches);
- `model.optimized.onnx`: that graph after ONNX Runtime's BERT optimizer (`onnxruntime.transformers.
  optimizer`, model type "bert"): one Attention node per layer, EmbedLayerNormalization,
  SkipLayerNormalization, BiasGelu (FastGelu for the tanh GELU). Its outputs are checked against PyTorch's
  plain path: above `tolerance` (1e-4 in fp32) it raises;
- `model.int8.onnx` (with `quantize="int8"`): the optimized graph after ONNX Runtime's dynamic quantization
  (`quantize_dynamic`: int8 weights with per-channel scales, activations quantized per tensor at run time;
  Attention becomes QAttention). int8 changes the numbers, so it is reported against the fp32 optimized
  graph on 16 short English texts (random ids without a tokenizer), not held to a tolerance: max
  |difference|, the smallest cosine between corresponding vectors (per row; per real token for token-level
  outputs) and, for outputs named `*logits` with more than one class, how often the argmax agrees;
- `model.report.json`: the fused operator counts and these figures (`OptimizedExport.as_dict`).

ONNX Runtime's fusions and quantizer need only the `export` extra (onnx, onnxruntime).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge import checkpoint_format
from bertforge.engine.onnx_export import (
    DEFAULT_OPSET,
    FP32_TOLERANCE,
    OnnxModule,
    check_parity,
    example_inputs,
    feeds,
    max_differences,
    session_of,
    time_ms,
    traced_model,
)
from bertforge.errors import ConfigError
from bertforge.families.base import Family
from bertforge.storage import atomic_path, write_json

QUANTIZATIONS = ("int8",)
# The operators ONNX Runtime's BERT optimizer fuses, as `get_fused_operator_statistics` names them.
FUSED_OPERATORS = ("Attention", "EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu", "FastGelu", "Gelu")
# The int8 report's inputs (16 texts, an even count: multiple choice pairs them).
REPORT_TEXTS = (
    "A man is eating food.", "A cat sits on the mat.", "The stock market fell sharply today.",
    "Where was the treaty signed, and by whom?", "John Smith lives in London and works for the BBC.",
    "The film was a tedious, overlong mess.", "An absolute delight from start to finish!",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "She plays the violin in an orchestra.", "The committee postponed its decision until next spring.",
    "It rained all day, so the match was cancelled.", "Paris is the capital of France.",
    "The new phone's battery lasts two days.", "Two dogs are running through a field.",
    "The recipe calls for three eggs and a cup of flour.", "He did not expect the results to be so good.",
)


@dataclass
class OptimizedExport:
    """What `export_optimized` wrote and measured.

    Attributes:
        plain, optimized, int8, report: the files (int8 None without quantization).
        outputs: output names in order. layers: the encoder's layers (the Attention count to expect).
        fused: per fused operator type, how many nodes the optimized graph holds.
        max_abs_diff: per output, the largest |optimized fp32 ONNX Runtime - PyTorch plain path|.
        int8_max_abs_diff, int8_min_cosine, int8_agreement: per output, int8 against the optimized fp32 graph
            (the agreement only for `*logits` outputs with more than one class on the last axis).
        onnxruntime_ms: median milliseconds per batch of `speed_shape`, per graph ("optimized", "int8").
    """

    plain: Path
    optimized: Path
    int8: Path | None
    report: Path
    outputs: list[str]
    layers: int
    fused: dict[str, int] = field(default_factory=dict)
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    int8_max_abs_diff: dict[str, float] = field(default_factory=dict)
    int8_min_cosine: dict[str, float] = field(default_factory=dict)
    int8_agreement: dict[str, float] = field(default_factory=dict)
    onnxruntime_ms: dict[str, float] = field(default_factory=dict)
    speed_shape: tuple[int, int] = (8, 128)

    @property
    def fully_fused(self) -> bool:
        """One Attention per layer, the embeddings' LayerNorm fused, every residual LayerNorm fused, a GELU."""
        fused = self.fused
        return (fused.get("Attention") == self.layers and fused.get("EmbedLayerNormalization") == 1
                and fused.get("SkipLayerNormalization") == 2 * self.layers
                and fused.get("BiasGelu", 0) + fused.get("FastGelu", 0) == self.layers)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("plain", "optimized", "int8", "report"):
            data[key] = None if data[key] is None else str(data[key])
        data["fully_fused"] = self.fully_fused
        return data

    def summary(self) -> str:
        def figures(values: dict[str, float], form: str) -> str:
            return ", ".join(f"{name} {value:{form}}" for name, value in values.items())

        lines = [f"wrote {self.plain}, {self.optimized}" + (f", {self.int8}" if self.int8 else "") + f", {self.report}",
                 "fused: " + ", ".join(f"{op} {n}" for op, n in self.fused.items() if n)
                 + f" ({self.layers} layers{'' if self.fully_fused else '; NOT fully fused'})",
                 f"max |optimized fp32 - torch|: {figures(self.max_abs_diff, '.2e')}"]
        if self.int8 is not None:
            lines.append(f"int8 vs fp32: max |diff| {figures(self.int8_max_abs_diff, '.2e')}; "
                         f"min cosine {figures(self.int8_min_cosine, '.5f')}"
                         + (f"; argmax agreement {figures(self.int8_agreement, '.3f')}" if self.int8_agreement else ""))
        if self.onnxruntime_ms:
            batch, tokens = self.speed_shape
            lines.append(f"ONNX Runtime, batch {batch}x{tokens}: "
                         + ", ".join(f"{name} {ms:.1f} ms" for name, ms in self.onnxruntime_ms.items()))
        return "\n".join(lines)


def sibling(path: Path, kind: str, suffix: str = ".onnx") -> Path:
    """`model.onnx` -> `model.<kind><suffix>` in the same folder."""
    return path.with_name(f"{path.stem}.{kind}{suffix}")


@contextlib.contextmanager
def quiet_onnxruntime() -> Iterator[None]:
    """ONNX Runtime's optimizer and quantizer log every fusion and tensor at INFO (the quantizer on the root
    logger, with a warning to pre-process a graph that is already optimized): dozens of lines that say nothing
    to a user. Errors still show; the counts and the parity that matter are in our own report."""
    loggers = [logging.getLogger(), logging.getLogger("onnxruntime")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def fuse(plain: Path, out: Path, num_heads: int, hidden_size: int) -> dict[str, int]:
    """Run ONNX Runtime's BERT optimizer on `plain` into `out` (atomically); the fused operator counts."""
    from onnxruntime.transformers import optimizer

    # Python fusions only (opt_level 0): ONNX Runtime's own graph optimizations run when a session loads the
    # file, and a file optimized for this machine's instruction set would not be portable.
    with quiet_onnxruntime():
        model = optimizer.optimize_model(str(plain), model_type="bert", num_heads=num_heads,
                                         hidden_size=hidden_size, opt_level=0)
        statistics = model.get_fused_operator_statistics()
        with atomic_path(out) as tmp:
            model.save_model_to_file(str(tmp))
    return {op: int(statistics.get(op, 0)) for op in FUSED_OPERATORS}


def quantize_int8(optimized: Path, out: Path) -> None:
    """ONNX Runtime's dynamic int8 quantization of `optimized` into `out` (atomically)."""
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Per-channel weight scales: on all-MiniLM-L6-v2's sentence vectors (16 texts) the smallest cosine to fp32
    # was 0.988 per channel against 0.953 per tensor (and 0.846 with reduce_range). ONNX's shape inference
    # does not know the fused com.microsoft operators, so the quantizer cannot infer the type of their
    # outputs; in this graph every such activation is float32.
    with atomic_path(out) as tmp, quiet_onnxruntime():
        quantize_dynamic(str(optimized), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
                         extra_options={"DefaultTensorType": TensorProto.FLOAT})


def text_inputs(model_dir: str | os.PathLike, family: Family) -> tuple[torch.Tensor, ...] | None:
    """`REPORT_TEXTS` as model inputs ([B, T], or [B, 2, T] in pairs of choices), encoded by the directory's
    tokenizer; None when it has none. Quantization error depends on the activations, which random ids do
    not resemble."""
    tokenizer = checkpoint_format.read_directory(model_dir).tokenizer
    if tokenizer is None:
        return None
    encodings = tokenizer.encode_batch(REPORT_TEXTS, padding="longest")
    ids, types, mask = (torch.tensor([getattr(e, name) for e in encodings])
                        for name in ("ids", "type_ids", "attention_mask"))  # [B, T] each
    if len(family.input_axes) == 3:
        return tuple(t.view(-1, 2, t.shape[-1]) for t in (ids, types, mask))  # [B, T] -> [B/2, 2, T]
    return ids, types, mask


def int8_figures(reference: OnnxModule, token_level: set[str], fp32: Any, int8: Any, result: OptimizedExport,
                 inputs: tuple[torch.Tensor, ...]) -> None:
    """int8 against fp32 ONNX Runtime on `inputs`, into `result`; outputs in `token_level` ([B, T, ...]) count
    real tokens only (what padding positions hold is never read): a vector per real token, or per row for
    [B, T] outputs."""
    arrays = feeds(inputs, fp32)
    real = inputs[2].reshape(-1, inputs[2].shape[-1]).numpy().astype(bool)  # [B(*C), T]
    for name, a, b in zip(reference.names, fp32.run(reference.names, arrays), int8.run(reference.names, arrays)):
        a, b = a.astype(np.float64), b.astype(np.float64)
        if name in token_level and a.ndim == 2:  # [B, T] (QA's start/end): one vector per row, padding zeroed
            a, b = np.where(real, a, 0.0), np.where(real, b, 0.0)
        elif name in token_level:
            a, b = a[real], b[real]  # [B, T, ...] -> [R, ...]: one vector per real token
        a, b = a.reshape(len(a), -1), b.reshape(len(b), -1)  # one vector per row or token
        result.int8_max_abs_diff[name] = float(np.abs(a - b).max())
        norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
        result.int8_min_cosine[name] = float(((a * b).sum(1) / np.maximum(norms, 1e-12)).min())
        if name.endswith("logits") and a.shape[-1] > 1:
            result.int8_agreement[name] = float((a.argmax(1) == b.argmax(1)).mean())


def export_optimized(model_dir: str | os.PathLike, out_path: str | os.PathLike, *, quantize: str | None = None,
                     opset: int = DEFAULT_OPSET, tolerance: float = FP32_TOLERANCE,
                     speed_shape: tuple[int, int] | None = (8, 128), repeats: int = 5) -> OptimizedExport:
    """Export `model_dir` to ONNX, fuse it with ONNX Runtime's BERT optimizer, optionally quantize it to int8.

    Args:
        model_dir: a saved model directory (any bertforge/Hugging Face BERT class).
        out_path: the plain .onnx file; the others are written beside it (see the module docstring).
        quantize: None, or "int8" (ONNX Runtime dynamic quantization of the optimized graph).
        opset: ONNX opset of the export.
        tolerance: largest accepted |optimized fp32 - PyTorch| of any output.
        speed_shape: (batch, sequence) to time each graph in ONNX Runtime (None: no timing); repeats: timed runs.

    Returns:
        An OptimizedExport (also written as JSON to `model.report.json`).

    Raises:
        BertforgeError: the optimized graph differs from PyTorch by more than `tolerance` (the files stay,
            for inspection). ConfigError: an unknown `quantize`; onnx / onnxruntime missing.
    """
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ConfigError(f"quantize must be one of {list(QUANTIZATIONS)} or None, got {quantize!r}")
    plain = Path(out_path)
    reference, family = traced_model(model_dir, plain, opset)
    config = reference.model.config
    result = OptimizedExport(plain, sibling(plain, "optimized"), sibling(plain, "int8") if quantize else None,
                             sibling(plain, "report", ".json"), list(reference.names), config.num_hidden_layers,
                             speed_shape=speed_shape or (0, 0))
    result.fused = fuse(plain, result.optimized, config.num_attention_heads, config.hidden_size)
    fp32 = session_of(result.optimized)
    result.max_abs_diff = max_differences(reference, family, fp32)
    sessions = {"optimized": fp32}
    if result.int8 is not None:
        quantize_int8(result.optimized, result.int8)
        sessions["int8"] = session_of(result.int8)
        tokens = min(64, config.max_position_embeddings)
        inputs = text_inputs(model_dir, family) or example_inputs(reference.model, family, 8, tokens, seed=4,
                                                                  pad_from=tokens - 20)
        token_level = {name for name, axes in family.export_outputs.items() if axes.get(1) == "sequence"}
        int8_figures(reference, token_level, fp32, sessions["int8"], result, inputs)
    if speed_shape is not None:
        batch, tokens = speed_shape
        arrays = feeds(example_inputs(reference.model, family, batch, min(tokens, config.max_position_embeddings),
                                      seed=3), fp32)
        for name, session in sessions.items():
            result.onnxruntime_ms[name] = time_ms(lambda s=session: s.run(reference.names, arrays), repeats)
    write_json(result.report, result.as_dict())
    check_parity(result.optimized, result.max_abs_diff, tolerance)
    return result


__all__ = ["FUSED_OPERATORS", "OptimizedExport", "QUANTIZATIONS", "export_optimized"]
