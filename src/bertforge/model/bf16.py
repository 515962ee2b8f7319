"""bf16 inference on CPU: the encoder's linear layers with their weights cast to bf16 once, and packed once
for oneDNN's bf16 matmul (AMX tiles or AVX-512 bf16) where PyTorch's oneDNN has bf16 kernels on this CPU.

Why: under `torch.autocast` alone, a CPU bf16 forward casts every fp32 weight to bf16 again on every call,
and oneDNN reorders each plain [O, I] weight into its blocked layout on every call too. Measured on a 2-core
Xeon with AMX (docs/cpu_inference.md, "bf16 on CPU"): the casts were 43% of a MiniLM batch-1 call; casting
once took BERT-base batch 1 from 45 to 26 ms, and the packed weight halves a batch-1 matmul again
(BERT-base's [70, 768] x [768, 3072]: 390 -> 204 us).

The numbers are autocast's: the same bf16-rounded weights and bias, the same oneDNN matmul with fp32
accumulation, a bf16 output; tests hold a prepared model to the autocast-only one. The model still runs
under autocast (`runtime.autocast`): embeddings, LayerNorm, softmax, the pooler and the heads do what autocast
does with them; only these linears skip the casts. `pack_bf16` is applied by
`model.precision.apply_precision` for bf16 on the CPU; a packed model is for inference only (no gradients)
and refuses to be saved (save the fp32 model; prepare it at load with `--precision bf16`).
"""

from __future__ import annotations

import torch
from torch import nn

from bertforge.errors import ConfigError
from bertforge.model.fast_paths import is_attention, is_layer, pack_qkv
from bertforge.model.row_buckets import rows_from_bucket, rows_to_bucket


def onednn_bf16() -> bool:
    """Whether PyTorch's oneDNN has bf16 matmul kernels on this CPU (AVX-512 bf16 or AMX): the packed path."""
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return torch.backends.mkldnn.is_available() and probe is not None and bool(probe())


class Bf16Linear(nn.Module):
    """y = x W^T + b in bf16 (fp32 accumulation), W and b cast to bf16 once and W packed once for oneDNN.

    Args:
        weight: float [O, I]; bias: float [O] or None; packed: pack W for oneDNN (default: where
            `onednn_bf16`), else keep it as a plain bf16 tensor.
    Input [..., I] any float dtype (cast to bf16), output [..., O] bf16.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, packed: bool | None = None):
        super().__init__()
        weight = weight.detach().to(torch.bfloat16).contiguous()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.bfloat16), persistent=False)
        self.packed = onednn_bf16() if packed is None else packed
        # The packed weight is an opaque oneDNN tensor: kept as a plain attribute, not a parameter or buffer.
        self._weight = torch.ops.mkldnn._reorder_linear_weight(weight, None) if self.packed else weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.bfloat16)
        if self.packed:  # oneDNN compiles a kernel per row count: run at the row bucket (`model.row_buckets`)
            y = torch.ops.mkldnn._linear_pointwise(rows_to_bucket(x), self._weight, self.bias, "none", [], "")
            return rows_from_bucket(y, x)  # [P, O] -> [..., O]
        return nn.functional.linear(x, self._weight, self.bias)  # [..., I] -> [..., O]

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        raise ConfigError("a model prepared for bf16 inference cannot be saved (its weights are packed for this "
                          "CPU); save the fp32 model and load it with --precision bf16")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed={self.packed}, bf16"


def pack_bf16(model: nn.Module) -> nn.Module:
    """Replace, in place, every encoder layer's linear layers inside `model` by `Bf16Linear` (the fused QKV
    projection as one). Idempotent; puts the model in eval mode with gradients off.

    Raises:
        ConfigError: the model is not on the CPU (on a GPU, autocast's casts are cached and cheap).
    """
    devices = {p.device.type for p in model.parameters()}
    if devices - {"cpu"}:
        raise ConfigError(f"bf16 packing is for the CPU; this model is on {', '.join(sorted(devices - {'cpu'}))}")
    model.eval().requires_grad_(False)
    if is_bf16(model):
        return model
    for module in list(model.modules()):
        if is_attention(module):
            pack_qkv(module, Bf16Linear)  # [3H, H]
            module.output = Bf16Linear(module.output.weight, module.output.bias)
        if is_layer(module):
            ff = module.feed_forward
            ff.up = Bf16Linear(ff.up.weight, ff.up.bias)
            ff.down = Bf16Linear(ff.down.weight, ff.down.bias)
    return model


def is_bf16(model: nn.Module) -> bool:
    return any(isinstance(module, Bf16Linear) for module in model.modules())


__all__ = ["Bf16Linear", "is_bf16", "onednn_bf16", "pack_bf16"]
