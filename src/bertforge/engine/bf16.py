"""The bf16 converter for the CPU: the encoder's linear layers with their weights cast to bf16 once, and packed
once for oneDNN's bf16 matmul (AMX tiles or AVX-512 bf16) where PyTorch's oneDNN has bf16 kernels on this CPU
(replaced through `engine.linears.replace_linears`, the walk int8 shares).

Why: under `torch.autocast` alone, a CPU bf16 forward casts every fp32 weight to bf16 again on every call,
and oneDNN reorders each plain [O, I] weight into its blocked layout on every call too. Measured on a 2-core
Xeon with AMX (docs/notes/cpu_inference.md, "bf16 on CPU"): the casts were 43% of a MiniLM batch-1 call; casting
once took BERT-base batch 1 from 45 to 26 ms, and the packed weight halves a batch-1 matmul again
(BERT-base's [70, 768] x [768, 3072]: 390 -> 204 us).

The numbers are autocast's: the same bf16-rounded weights and bias, the same oneDNN matmul with fp32
accumulation, a bf16 output; tests hold a prepared model to the autocast-only one. One difference, on the
packed path: the feed-forward's activation (exact GELU, ReLU) runs inside the up projection's oneDNN call, on
its fp32 result before the one rounding to bf16, where autocast rounds the matmul's output, applies GELU to it
and rounds again. A bf16 GELU on its own cost more than the fp32 one (45 against 25 us at 72 x 1536 on 2 AMX
cores), and fused, a MiniLM batch-1 call was 5% faster, with the outputs as close to fp32 as before
(docs/notes/cpu_inference.md, "bf16 at batch 1"). The model still runs
under autocast (its engine's `running`): embeddings, LayerNorm, softmax, the pooler and the heads do what
autocast does with them; only these linears skip the casts. `pack_bf16` is applied by `engine.build.build_engine`
for bf16 on the CPU, which also gives the model a traced layer graph (`engine.layer_graph`, as int8 has): a
packed model is for inference only (no gradients) and refuses to be saved (save the fp32 model; prepare it at
load with `--precision bf16`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from bertforge.engine.linears import Site, replace_linears
from bertforge.engine.row_buckets import rows_from_bucket, rows_to_bucket, scripted
from bertforge.errors import ConfigError


def onednn_bf16() -> bool:
    """Whether PyTorch's oneDNN has bf16 matmul kernels on this CPU (AVX-512 bf16 or AMX): the packed path."""
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return torch.backends.mkldnn.is_available() and probe is not None and bool(probe())


# Activations oneDNN applies inside its linear (`_linear_pointwise`'s post-op and its algorithm), by the function
# `model.bert.activation` returns for a config's hidden_act; any other runs after the linear.
POST_OPS = {F.gelu: ("gelu", "none"), F.relu: ("relu", "")}  # "none": the exact erf GELU, not tanh's


def _bucketed_linear_bf16(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, post_op: str,
                          algorithm: str) -> torch.Tensor:
    """oneDNN's bf16 linear with a packed weight (and a post-op: "none", "gelu", "relu"), on x's rows padded to
    their row bucket (oneDNN compiles a kernel per row count: `engine.row_buckets`); compiled by
    `row_buckets.scripted` so a traced layer graph pads each call by its own size.
    [..., I] any float dtype -> [..., O] bf16."""
    x = x.to(torch.bfloat16)
    scalars: list[int | float | complex | None] = []  # the post-op's arguments: none (TorchScript's type)
    y = torch.ops.mkldnn._linear_pointwise(rows_to_bucket(x), weight, bias, post_op, scalars, algorithm)  # [P, O]
    return rows_from_bucket(y, x)


class Bf16Linear(nn.Module):
    """y = act(x W^T + b) in bf16 (fp32 accumulation), W and b cast to bf16 once and W packed once for oneDNN.

    Args:
        weight: float [O, I]; bias: float [O] or None; packed: pack W for oneDNN (default: where
            `onednn_bf16`), else keep it as a plain bf16 tensor; activation: None, or a function of the output
            (`model.bert.activation`), run by oneDNN on the fp32 result where it is one of `POST_OPS` and W is
            packed, else on the bf16 output.
    Input [..., I] any float dtype (cast to bf16), output [..., O] bf16.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, packed: bool | None = None,
                 activation=None):
        super().__init__()
        weight = weight.detach().to(torch.bfloat16).contiguous()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.bfloat16), persistent=False)
        self.packed = onednn_bf16() if packed is None else packed
        # A buffer (not saved) rather than a plain attribute: a traced layer graph reads buffers from the module,
        # where it would have to copy a plain tensor into the graph as a constant (and cannot, for an opaque
        # oneDNN tensor).
        self.register_buffer("_weight", torch.ops.mkldnn._reorder_linear_weight(weight, None) if self.packed
                             else weight, persistent=False)
        fused = self.packed and activation in POST_OPS
        self.post_op, self.algorithm = POST_OPS[activation] if fused else ("none", "")
        self.activation = None if fused else activation  # what still runs after the linear
        self.applies_activation = activation is not None  # the layer's own is then the identity (`linears`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:  # [..., I] -> [..., O]
            y = scripted(_bucketed_linear_bf16)(x, self._weight, self.bias, self.post_op, self.algorithm)
        else:
            y = F.linear(x.to(torch.bfloat16), self._weight, self.bias)
        return y if self.activation is None else self.activation(y)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        raise ConfigError("a model prepared for bf16 inference cannot be saved (its weights are packed for this "
                          "CPU); save the fp32 model and load it with --precision bf16")

    def extra_repr(self) -> str:
        fused = f", {self.post_op} fused" if self.post_op != "none" else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, packed={self.packed}, bf16{fused}"


def pack_bf16(model: nn.Module) -> nn.Module:
    """Replace, in place, every encoder layer's linear layers inside `model` by `Bf16Linear` (the fused QKV
    projection as one; the feed-forward's activation moves into the up projection). Idempotent; puts the model
    in eval mode with gradients off.

    Raises:
        ConfigError: the model is not on the CPU (on a GPU, autocast's casts are cached and cheap).
    """
    devices = {p.device.type for p in model.parameters()}
    if devices - {"cpu"}:
        raise ConfigError(f"bf16 packing is for the CPU; this model is on {', '.join(sorted(devices - {'cpu'}))}")
    model.eval().requires_grad_(False)
    if is_bf16(model):
        return model

    def bf16(site: Site) -> Bf16Linear:
        # (a gated feed-forward's activation runs on half of the up projection's output: it stays outside)
        fused = site.role == "up" and not site.gated
        return Bf16Linear(site.weight, site.bias, activation=site.activation if fused else None)

    return replace_linears(model, bf16)


def is_bf16(model: nn.Module) -> bool:
    return any(isinstance(module, Bf16Linear) for module in model.modules())


__all__ = ["Bf16Linear", "is_bf16", "onednn_bf16", "pack_bf16"]
