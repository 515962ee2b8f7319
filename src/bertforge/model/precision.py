"""Preparing a model for the precision it will run at, and refusing to run it at another.

`runtime.choose_precision` picks the precision (fp32, bf16, fp16, int8); `apply_precision` makes the model
ready for it, in place: int8 quantizes the encoder's linears (`model.quantization`), bf16 on the CPU casts and
packs them once (`model.bf16`); on the CPU every precision then runs unmasked calls through a traced layer graph
(`fast_paths.LayerGraph`); fp32, fp16 and bf16 on a GPU run the model as it is, under autocast.
`check_precision` is asked before a run, so a figure labelled int8 is always one measured with int8 layers,
and a model prepared for bf16 never runs without autocast.
"""

from __future__ import annotations

from torch import nn

from bertforge.errors import ConfigError
from bertforge.model.bf16 import is_bf16, pack_bf16
from bertforge.model.fast_paths import trace_layers
from bertforge.model.quantization import is_quantized, quantize_int8


def apply_precision(model: nn.Module, precision: str) -> nn.Module:
    """The model to run, for inference, at a concrete precision: quantized in place for int8, its encoder linears
    packed in bf16 for bf16 on the CPU, as it is for fp32; on the CPU each then with its layer stack traced as one
    graph for unmasked input (`fast_paths.trace_layers`: equal outputs, bit for bit, with less Python between
    the operators; measured on 2 AMX cores, fp32 batch 1 at 16-128 tokens 4-5% faster). On a GPU, fp32, fp16 and
    bf16 run the model as it is, under autocast."""
    on_cpu = {p.device.type for p in model.parameters()} == {"cpu"}
    if precision == "int8":
        return trace_layers(quantize_int8(model))
    if precision == "bf16" and on_cpu:
        return trace_layers(pack_bf16(model))
    if precision == "fp32" and on_cpu:
        return trace_layers(model)
    return model


def prepared_precision(model: nn.Module) -> str | None:
    """The precision `model` was prepared for by `apply_precision` ("int8", "bf16"), None if unprepared."""
    if is_quantized(model):
        return "int8"
    return "bf16" if is_bf16(model) else None


def check_precision(model: nn.Module, precision: str) -> None:
    """Refuse to run a model at a precision it was not prepared for: int8 needs an int8 model, and a model
    prepared for int8 or bf16 runs at that precision only (an unprepared model may run under autocast)."""
    prepared = prepared_precision(model)
    if prepared is not None and prepared != precision:
        raise ConfigError(f"precision {precision} was asked for, but the model is prepared for {prepared} "
                          f"inference; run it at {prepared}, or load it again for {precision}")
    if precision == "int8" and prepared is None:
        raise ConfigError("precision int8 was asked for, but the model is not int8-quantized; prepare it with "
                          "bertforge.model.precision.apply_precision(model, 'int8') first")


__all__ = ["apply_precision", "check_precision", "prepared_precision"]
