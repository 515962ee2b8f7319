"""The int8 converter: dynamic quantization of the encoder's linear layers for CPU inference.

`quantize_int8(model)` replaces (through `engine.linears.replace_linears`, the walk bf16 shares), in every encoder
layer, the fused query/key/value projection, the
attention output projection and the feed-forward's up and down projections by `Int8Linear`: weights int8
with one scale per output channel (symmetric), activations quantized at run time from their own range (per
tensor; per token for the down projection, below), int32 accumulation, fp32 output with the fp32 bias added.
Embeddings, LayerNorms, the softmax (scaled-dot-product attention), the pooler and every task head stay fp32:
they are a small share of the time and the most sensitive to rounding.

Why this kernel: `torch.ops.quantized.linear_dynamic` (PyTorch's fbgemm / oneDNN dynamic quantized
linear, the kernel behind `torch.ao.quantization.quantize_dynamic`) was measured on a 2-core AMD EPYC
(AVX2, no AVX-512, no VNNI, no AMX) against the alternatives PyTorch 2.13 offers on a
CPU (docs/notes/cpu_inference.md, "Choosing the int8 kernel"): `torch._int_mm` and
`aten._weight_int8pack_mm` fall back to reference loops there (10-100x slower than fp32), and the
inductor int8 flow needs the PT2E quantizer, which PyTorch no longer ships (it moved to torchao). On the AMX
Xeon `torch._int_mm` is the fastest int8 product (a third to two thirds of `linear_dynamic`'s time at 24-128
rows), but quantizing its input and scaling its output back takes PyTorch operators that cost more than it
saves (docs/notes/cpu_inference.md, "The int8 matmul call is where short inputs lose"). We call
the operator directly rather than through `quantize_dynamic` because the fused QKV projection is a
parameter pair, not an `nn.Linear`, and so the quantized model keeps the encoder's own classes. The
engine the weights are packed for is chosen per CPU (`quantization_engine`): oneDNN where AMX is present.
On such a CPU each layer also keeps a pack for PyTorch's x86 engine, used for calls of few rows
(`small_rows`): oneDNN's dynamic int8 linear costs some 30 us more per call than fbgemm's, which decides a
batch-1 call of a short text.

Activations use the full 8 bits (`REDUCE_RANGE = False`). PyTorch's own default for x86 is 7 bits, because
on AVX2 without VNNI the int8 dot product (vpmaddubsw) sums pairs in saturating int16; measured here, the
kernel's 8-bit outputs equal a float simulation of the same rounding (no saturation seen) and 7 bits doubled
the error (MiniLM embeddings: min cosine 0.972 with 7 bits, 0.992 with 8).

The kernel quantizes its input with one scale per call (per tensor). That suits the three projections that
read a LayerNorm's or the attention's output, whose tokens have similar ranges; it does not suit the
feed-forward down projection, which reads the GELU's output: there a few tokens run far above the rest
(all-MiniLM-L6-v2 on 32 SST-2 sentences: in layers 0-3 the largest value of a token is 14-25 for [CLS] and
a median 2.3-3.5 for the others), and one scale for all gives a typical token about a seventh of the int8
range. So the down projection's activations are quantized per token (`per_token`): each row is divided by its
own max |x| (or a cheaper bound from the activation's least value, `least_value`) before the kernel, which then
quantizes rows already on one scale, and the output rows are multiplied back, bias added after:
x W^T + b = r (x / r) W^T + b, exactly, for any r > 0. This was measured on
the accuracy budget's fine-tuned MiniLM models (docs/notes/cpu_inference.md, "Per-token scales for the down
projection"): SQuAD exact match went from -1.08 to -0.29 points of fp32 and STS-B Spearman from -0.89 to
-0.21, for 3-7% more int8 time; per token on all four projections was little closer and cost 18-34%.
SmoothQuant's per-channel rescaling, which int8 used before, is gone: once the down projection was per token,
adding it back scored no better (STS-B Spearman -0.34 with it, -0.20 without), and it needed a calibration
pass at load.

A quantized model is for inference only: it has no int8 training path and refuses to be saved (save the
fp32 model; quantize at load with `--precision int8`). `is_quantized` tells a quantized model;
`int8_linears` lists its int8 layers.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator

import torch
from torch import nn

from bertforge.engine.linears import Site, replace_linears, replaced_by
from bertforge.engine.row_buckets import rows_from_bucket, rows_to_bucket, scripted
from bertforge.errors import ConfigError

# The packed weights' engine, the first of these this build supports: oneDNN first on a CPU with AMX tiles
# (its int8 matmul runs on them: 1.2-1.5x PyTorch's x86 engine end to end on BERT-base, 1.3-3.5x per matmul,
# measured on a 2-core Sapphire Rapids-class Xeon, docs/notes/cpu_inference.md); elsewhere PyTorch's x86 engine
# (fbgemm's AVX2 / AVX-512 kernels), which oneDNN did not beat on the 2-core AVX2 EPYC.
PREFERRED_ENGINES = ("x86", "fbgemm", "onednn")
AMX_PREFERRED_ENGINES = ("onednn", "x86", "fbgemm")
REDUCE_RANGE = False
# On an AMX CPU, a call of at most SMALL_WORK / sqrt(in x out) rows runs on the x86 engine's pack (fbgemm), more
# on oneDNN's. Measured per linear on a 2-core Sapphire Rapids-class Xeon (benchmarks/cpu_int8_rows.py): oneDNN
# is the faster from 40 rows on [384 -> 1536] (MiniLM's feed-forward), 48 on [384 -> 1152], 40 on [768 -> 768],
# 16-24 on [768 -> 3072] (BERT-base's): about 32,768 / sqrt(in x out) each. One cutoff per model, from its
# feed-forward shape (`small_rows`), so a call runs every layer on one engine.
SMALL_WORK = 32_768
# A per-token scale's floor: a row of zeros divides by it (and stays zeros) instead of by 0.
PER_TOKEN_FLOOR = 1e-12


# The operator itself, not its overload packet: the packet's Python dispatch costs ~6 us a call.
LINEAR_DYNAMIC = torch.ops.quantized.linear_dynamic.default


def _bucketed_linear_dynamic(x: torch.Tensor, packed: torch.classes.quantized.LinearPackedParamsBase,
                             reduce_range: bool) -> torch.Tensor:
    """LINEAR_DYNAMIC on x's rows padded to their row bucket (`engine.row_buckets`: oneDNN compiles a kernel per
    row count). Compiled by TorchScript (`row_buckets.scripted`) so that a traced layer graph pads each call
    by its own size rather than by the size it was traced at."""
    y = torch.ops.quantized.linear_dynamic(rows_to_bucket(x), packed, reduce_range)  # [P, I] -> [P, O]
    return rows_from_bucket(y, x)  # [..., O]


def bucketed_linear_dynamic(x: torch.Tensor, packed) -> torch.Tensor:
    """A oneDNN pack's call: at the row bucket, so oneDNN compiles no kernel for a new row count."""
    return scripted(_bucketed_linear_dynamic)(x, packed, REDUCE_RANGE)


def plain_linear_dynamic(x: torch.Tensor, packed) -> torch.Tensor:
    """A fbgemm pack's call: fbgemm compiles nothing per row count, so no padding."""
    return LINEAR_DYNAMIC(x, packed, REDUCE_RANGE)


def engine_call(engine_name: str):
    """How an `Int8Linear` calls a pack made for `engine_name`."""
    return bucketed_linear_dynamic if engine_name == "onednn" else plain_linear_dynamic


def quantization_engine() -> str:
    """The quantized engine `quantize_int8` packs for; ConfigError where this PyTorch build has none."""
    supported = torch.backends.quantized.supported_engines
    for engine in AMX_PREFERRED_ENGINES if has_amx() else PREFERRED_ENGINES:
        if engine in supported:
            return engine
    raise ConfigError("precision int8 needs PyTorch's x86/fbgemm quantized engine, which this PyTorch build "
                      f"lacks (it has {supported}); use --precision fp32")


def small_rows(config, engine_name: str) -> tuple[int, str | None]:
    """(rows, engine): calls of at most `rows` rows run on `engine`'s pack (`SMALL_WORK`); (0, None) where
    one engine serves every call (no AMX, or no x86 engine in this build)."""
    if engine_name != "onednn" or "x86" not in torch.backends.quantized.supported_engines:
        return 0, None
    return int(SMALL_WORK / (config.hidden_size * config.intermediate_size) ** 0.5), "x86"


def has_amx() -> bool:
    """Whether this CPU has AMX tiles (Intel Sapphire Rapids and later) that PyTorch's oneDNN can use."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)  # private: absent from some builds
    return bool(probe is not None and probe())


@contextlib.contextmanager
def engine(name: str) -> Iterator[None]:
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = previous


class Int8Linear(nn.Module):
    """y = x W^T + b with W int8 per output channel and x quantized at run time, per tensor or per token.

    Args:
        weight: float [O, I]; bias: float [O] or None; engine_name: the quantized engine to pack for.
        per_token: quantize each row of x on its own scale (see the module docstring), else one per call.
        least_input: with per_token, the least value x can take, where known (`least_value`), or None.
        small_rows, small_engine: calls of at most `small_rows` rows (input elements / I) run on a second
            pack for `small_engine` (`small_rows(config, engine)` chooses both; 0 / None: one pack).
    Input [..., I] float32, output [..., O] float32.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, engine_name: str, *,
                 per_token: bool = False, least_input: float | None = None, small_rows: int = 0,
                 small_engine: str | None = None):
        super().__init__()
        weight = weight.detach().float()
        self.per_token = per_token
        # Where the input is known to be >= least_input (an activation's output: GELU >= -0.17, ReLU >= 0), a
        # row's scale max(row max, -least_input) bounds its |x| without computing |x| (one pass less).
        self.floor = None if least_input is None else max(-least_input, PER_TOKEN_FLOOR)
        bias = None if bias is None else bias.detach().float()
        # Per token, the bias is added after the rows are scaled back, so the packed weight goes without it.
        self.register_buffer("bias", bias if per_token else None, persistent=False)
        packed_bias = None if per_token else bias
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        # Symmetric per-channel scales; an all-zero row gets scale 1 (its int8 row is zeros either way).
        scales = weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0  # [O]
        with warnings.catch_warnings(), engine(engine_name):
            # PyTorch 2.13 marks quantized-tensor constructors deprecated; they are still the input the
            # packing operator takes (pinned torch==2.13.0).
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(weight, scales.double(), torch.zeros_like(scales, dtype=torch.long),
                                                 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(qweight, packed_bias)
        self._small = None  # the same int8 weight packed for `small_engine`, for calls of <= small_rows rows
        if small_rows and small_engine is not None and small_engine != engine_name:
            with warnings.catch_warnings(), engine(small_engine):
                warnings.simplefilter("ignore", UserWarning)
                self._small = torch.ops.quantized.linear_prepack(qweight, packed_bias)
        self.small_rows = small_rows if self._small is not None else 0
        self.engine, self.small_engine = engine_name, small_engine if self._small is not None else None
        self._call, self._small_call = engine_call(self.engine), engine_call(self.small_engine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            x = x.float()  # under an outer autocast the int8 kernel still takes fp32 activations
        small = self._small is not None and x.numel() <= self.small_rows * self.in_features
        packed, linear = (self._small, self._small_call) if small else (self._packed, self._call)
        if not self.per_token:
            return linear(x, packed)  # [..., I] -> [..., O]
        if self.floor is None:
            r = x.abs().amax(-1, keepdim=True).clamp_min_(PER_TOKEN_FLOOR)  # [..., 1]: each row's max |x|
        else:
            r = x.amax(-1, keepdim=True).clamp_min_(self.floor)  # [..., 1]: >= each row's max |x|
        y = linear(x / r, packed)  # rows on one scale -> [..., O]
        return y * r if self.bias is None else torch.addcmul(self.bias, y, r)

    def int8_weight(self) -> torch.Tensor:
        """The packed weight as an int8 tensor [O, I] (for tests and inspection)."""
        weight, _ = torch.ops.quantized.linear_unpack(self._packed)
        return weight.int_repr()

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        raise ConfigError("an int8-quantized model cannot be saved (its weights are packed for one CPU engine); "
                          "save the fp32 model and load it with --precision int8")

    def extra_repr(self) -> str:
        small = f", {self.small_engine} up to {self.small_rows} rows" if self._small is not None else ""
        rows = ", per token" if self.per_token else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, engine={self.engine}{small}, "
                f"int8{rows}")


def quantize_int8(model: nn.Module) -> nn.Module:
    """Quantize, in place, every encoder layer's linear layers inside `model` (see the module docstring): the
    fused QKV, attention output and feed-forward up projections per tensor, the feed-forward down projection
    per token. Idempotent. The model is put in eval mode with gradients off: a quantized model only infers.

    Raises:
        ConfigError: the model is not on the CPU, or PyTorch has no quantized engine.
    """
    devices = {p.device.type for p in model.parameters()}
    if devices - {"cpu"}:
        raise ConfigError(f"precision int8 runs on the CPU only (PyTorch's dynamic int8 kernels are CPU kernels); "
                          f"this model is on {', '.join(sorted(devices - {'cpu'}))}: use --device cpu, or "
                          "--precision bf16 / fp16 on a GPU")
    name = quantization_engine()
    model.eval().requires_grad_(False)
    if is_quantized(model):
        return model

    def int8(site: Site) -> Int8Linear:
        rows, small = small_rows(site.config, name)
        down = site.role == "down"  # per token, bounded below by the activation it reads (module docstring;
        # a gated feed-forward's activation x gate has no such bound)
        return Int8Linear(site.weight, site.bias, name, per_token=down,
                          least_input=least_value(site.activation) if down and not site.gated else None,
                          small_rows=rows,
                          small_engine=small)

    return replace_linears(model, int8)


@functools.cache
def least_value(function) -> float | None:
    """The least value an elementwise `function` takes (exact GELU -0.16997, ReLU 0), found on a grid of
    [-50, 50]; None where the least value on the grid lies at its ends (not bounded below, as far as it shows)."""
    grid = torch.linspace(-50.0, 50.0, 100_001)  # steps of 0.001
    values = function(grid)
    least = float(values.min())
    if least >= 0:
        return 0.0
    if int(values.argmin()) in (0, grid.numel() - 1):
        return None
    return least * 1.001  # below the grid's least value by more than the grid can miss near a smooth minimum


def int8_linears(model: nn.Module) -> list[str]:
    """Names of the `Int8Linear` modules inside `model`."""
    return replaced_by(model, Int8Linear)


def is_quantized(model: nn.Module) -> bool:
    return any(isinstance(module, Int8Linear) for module in model.modules())


def float_linears(model: nn.Module) -> list[str]:
    """Names of the float `nn.Linear` modules left inside `model` (pooler, heads)."""
    return [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]


__all__ = ["Int8Linear", "float_linears", "int8_linears", "is_quantized", "quantization_engine", "quantize_int8"]
