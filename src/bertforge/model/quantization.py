"""int8 inference on CPU: dynamic quantization of the encoder's linear layers, applied from outside the model.

`quantize_int8(model)` replaces, in every encoder layer, the fused query/key/value projection, the
attention output projection and the feed-forward's up and down projections by `Int8Linear`: weights int8
with one scale per output channel (symmetric), activations quantized per tensor at run time from their own
range, int32 accumulation, fp32 output with the fp32 bias added. Embeddings, LayerNorms, the softmax
(scaled-dot-product attention), the pooler and every task head stay fp32: they are a small share of the
time and the most sensitive to rounding.

Why this kernel: `torch.ops.quantized.linear_dynamic` (PyTorch's fbgemm / oneDNN dynamic quantized
linear, the kernel behind `torch.ao.quantization.quantize_dynamic`) was measured on a 2-core AMD EPYC
(AVX2, no AVX-512, no VNNI, no AMX) against the alternatives PyTorch 2.13 offers on a
CPU (docs/cpu_inference.md, "Choosing the int8 kernel"): `torch._int_mm` and
`aten._weight_int8pack_mm` fall back to reference loops there (10-100x slower than fp32), and the
inductor int8 flow needs the PT2E quantizer, which PyTorch no longer ships (it moved to torchao). We call
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

With per-tensor activation scales, BERT's few outlier channels at the output of its LayerNorms set the
range and crush the other channels; SmoothQuant's rescaling (`smoothing_scales`) moves them into the
weights for the two projections that read a LayerNorm (QKV and feed-forward up) and for the feed-forward
down projection, which reads the GELU output (a few of its channels are large too), with activation ranges
from a synthetic calibration batch (`input_ranges`). Smoothing the down projection as well was measured on
fine-tuned MiniLM models (docs/cpu_inference.md): STS-B Pearson 73.61 -> 75.26 (fp32 75.51), SQuAD F1 on
four held-apart articles 21.68 -> 22.09 (fp32 22.52). The attention output projection, which reads the
attention context, is quantized without it.

A quantized model is for inference only: it has no int8 training path and refuses to be saved (save the
fp32 model; quantize at load with `--precision int8`). `is_quantized` tells a quantized model;
`int8_linears` lists its int8 layers.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch
from torch import nn

from bertforge.errors import ConfigError
from bertforge.model.fast_paths import is_attention, is_encoder, is_layer, pack_qkv

# The packed weights' engine, the first of these this build supports: oneDNN first on a CPU with AMX tiles
# (its int8 matmul runs on them: 1.2-1.5x PyTorch's x86 engine end to end on BERT-base, 1.3-3.5x per matmul,
# measured on a 2-core Sapphire Rapids-class Xeon, docs/cpu_inference.md); elsewhere PyTorch's x86 engine
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
# SmoothQuant's migration strength, and the synthetic calibration batch [B, T] its activation ranges come from.
SMOOTHING_ALPHA = 0.75
CALIBRATION_SHAPE = (8, 64)
CALIBRATION_FIRST_ID = 1000


# The operator itself, not its overload packet: the packet's Python dispatch costs ~6 us a call.
LINEAR_DYNAMIC = torch.ops.quantized.linear_dynamic.default


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
    """y = x W^T + b with W int8 per output channel and x quantized per tensor at run time.

    Args:
        weight: float [O, I]; bias: float [O] or None; engine_name: the quantized engine to pack for.
        smoothing: SmoothQuant's per-input-channel scales [I] (`smoothing_scales`), or None.
        small_rows, small_engine: calls of at most `small_rows` rows (input elements / I) run on a second
            pack for `small_engine` (`small_rows(config, engine)` chooses both; 0 / None: one pack).
    Input [..., I] float32, output [..., O] float32.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, engine_name: str,
                 smoothing: torch.Tensor | None = None, small_rows: int = 0, small_engine: str | None = None):
        super().__init__()
        weight = weight.detach().float()
        # x W^T = (x / s)(W s)^T: dividing the input's channels by s moves their outliers into the weights.
        self.register_buffer("input_scale", None if smoothing is None else (1.0 / smoothing).float(), persistent=False)
        if smoothing is not None:
            weight = weight * smoothing  # [O, I] * [I]
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        # Symmetric per-channel scales; an all-zero row gets scale 1 (its int8 row is zeros either way).
        scales = weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0  # [O]
        with warnings.catch_warnings(), engine(engine_name):
            # PyTorch 2.13 marks quantized-tensor constructors deprecated; they are still the input the
            # packing operator takes (pinned torch==2.13.0).
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(weight, scales.double(), torch.zeros_like(scales, dtype=torch.long),
                                                 0, torch.qint8)
            bias = None if bias is None else bias.detach().float()
            self._packed = torch.ops.quantized.linear_prepack(qweight, bias)
        self._small = None  # the same int8 weight packed for `small_engine`, for calls of <= small_rows rows
        if small_rows and small_engine is not None and small_engine != engine_name:
            with warnings.catch_warnings(), engine(small_engine):
                warnings.simplefilter("ignore", UserWarning)
                self._small = torch.ops.quantized.linear_prepack(qweight, bias)
        self.small_rows = small_rows if self._small is not None else 0
        self.engine, self.small_engine = engine_name, small_engine if self._small is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            x = x.float()  # under an outer autocast the int8 kernel still takes fp32 activations
        if self.input_scale is not None:
            x = x * self.input_scale  # [..., I]
        small = self._small is not None and x.numel() <= self.small_rows * self.in_features
        return LINEAR_DYNAMIC(x, self._small if small else self._packed, REDUCE_RANGE)  # [..., I] -> [..., O]

    def int8_weight(self) -> torch.Tensor:
        """The packed weight as an int8 tensor [O, I] (for tests and inspection)."""
        weight, _ = torch.ops.quantized.linear_unpack(self._packed)
        return weight.int_repr()

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        raise ConfigError("an int8-quantized model cannot be saved (its weights are packed for one CPU engine); "
                          "save the fp32 model and load it with --precision int8")

    def extra_repr(self) -> str:
        small = f", {self.small_engine} up to {self.small_rows} rows" if self._small is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, engine={self.engine}{small}, int8"


def input_ranges(model: nn.Module, seed: int = 0) -> dict[nn.Module, torch.Tensor]:
    """Per-channel max |x| at the input of every self-attention and feed-forward [H] and of every feed-forward's
    down projection [I] inside `model`, from one fp32 pass of each encoder over a synthetic batch of random
    vocabulary ids (`CALIBRATION_SHAPE`, a fixed seed: the same model always gets the same scales). No data is needed: BERT's outlier channels are a
    property of the weights (the LayerNorms before these inputs), and show on any input."""
    ranges: dict[nn.Module, torch.Tensor] = {}

    def record(module: nn.Module, args: tuple) -> None:
        x = args[0].detach()
        amax = x.abs().reshape(-1, x.shape[-1]).amax(0)  # [..., H] -> [H]
        ranges[module] = torch.maximum(ranges[module], amax) if module in ranges else amax

    targets = [m for m in model.modules() if is_attention(m)]
    targets += [m.feed_forward for m in model.modules() if is_layer(m)]
    targets += [m.feed_forward.down for m in model.modules() if is_layer(m)]  # the activation's output [..., I]
    hooks = [m.register_forward_pre_hook(record) for m in targets]
    generator = torch.Generator().manual_seed(seed)
    try:
        with torch.inference_mode():
            for encoder in [m for m in model.modules() if is_encoder(m)]:
                vocab = encoder.config.vocab_size
                low = min(CALIBRATION_FIRST_ID, vocab // 2)  # past BERT vocabularies' specials and [unused]
                encoder(torch.randint(low, vocab, CALIBRATION_SHAPE, generator=generator))
    finally:
        for hook in hooks:
            hook.remove()
    return ranges


def smoothing_scales(input_max: torch.Tensor, weight: torch.Tensor, alpha: float | None = None) -> torch.Tensor:
    """SmoothQuant's per-input-channel s = max|x|^alpha / max|W|^(1 - alpha), [I] (Xiao et al., 2023);
    alpha defaults to `SMOOTHING_ALPHA`."""
    alpha = SMOOTHING_ALPHA if alpha is None else alpha
    weight_max = weight.detach().abs().amax(dim=0).float().clamp_min(1e-5)  # [O, I] -> [I]
    return (input_max.float().clamp_min(1e-5) ** alpha / weight_max ** (1 - alpha)).clamp(1e-2, 1e2)


def quantize_int8(model: nn.Module, *, smooth: bool = True) -> nn.Module:
    """Quantize, in place, every encoder layer's linear layers inside `model` (see the module docstring).

    `smooth` (default on) rescales the inputs of the QKV and feed-forward-up projections (the outputs of a
    LayerNorm, whose outlier channels dominate a per-tensor int8 range) by `smoothing_scales`. Idempotent.
    The model is put in eval mode with gradients off: a quantized model only infers.

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
    ranges = input_ranges(model) if smooth else {}
    for encoder in [m for m in model.modules() if is_encoder(m)]:
        rows, small = small_rows(encoder.config, name)

        def int8(weight, bias, scale=None, rows=rows, small=small):
            return Int8Linear(weight, bias, name, scale, small_rows=rows, small_engine=small)

        for module in list(encoder.modules()):
            if is_attention(module):
                scale = ranges.get(module)
                pack_qkv(module, lambda weight, bias, scale=scale: int8(
                    weight, bias, None if scale is None else smoothing_scales(scale, weight)))  # [3H, H]
                module.output = int8(module.output.weight, module.output.bias)
            if is_layer(module):
                ff = module.feed_forward
                ff.up = int8(ff.up.weight, ff.up.bias, smoothing_scales(ranges[ff], ff.up.weight) if ff in ranges
                             else None)
                ff.down = int8(ff.down.weight, ff.down.bias, smoothing_scales(ranges[ff.down], ff.down.weight)
                               if ff.down in ranges else None)
    return model


def int8_linears(model: nn.Module) -> list[str]:
    """Names of the `Int8Linear` modules inside `model`."""
    return [name for name, module in model.named_modules() if isinstance(module, Int8Linear)]


def is_quantized(model: nn.Module) -> bool:
    return any(isinstance(module, Int8Linear) for module in model.modules())


def float_linears(model: nn.Module) -> list[str]:
    """Names of the float `nn.Linear` modules left inside `model` (pooler, heads)."""
    return [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]


__all__ = ["Int8Linear", "float_linears", "int8_linears", "is_quantized", "quantization_engine", "quantize_int8"]
