"""The one walk that replaces the encoder's linear layers, in place: what the int8 (`engine.int8`) and packed
bf16 (`engine.bf16`) converters share.

Every encoder layer has four projections: the query/key/value projection (BERT's three fused into one [3H, H]
weight first, `model.fast_paths.fuse_qkv`; ModernBERT's `Wqkv` is one linear already), the attention output,
and the feed-forward's up and down projections (ModernBERT's up projection is gated, GeGLU: [2I, H], the
activation on one half times the other). `replace_linears(model, make)` hands each to `make` as a `Site` (its
role, weight, bias, the encoder's config, the layer's activation and whether the feed-forward is gated) and puts
the module `make` returns in its place. A replacement that applies the
feed-forward's activation itself (`applies_activation = True`: bf16's oneDNN call fuses it) takes the layer's
activation with it, and the layer's own becomes the identity. Embeddings, LayerNorms, the pooler and the heads
stay as they are. The attention whose QKV projection was replaced becomes a `PackedSelfAttention`: its float
weights are gone, so it stays fused. The parameters of the replaced layers are gone too; a model is replaced
once (a second converter is refused: load the model again).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from bertforge.errors import ConfigError
from bertforge.model.fast_paths import (
    Variant,
    fuse_qkv,
    is_attention,
    is_encoder,
    is_layer,
    is_packed,
    variant,
)

ROLES = ("qkv", "output", "up", "down")


@dataclass(frozen=True)
class Site:
    """One projection to replace: role (one of `ROLES`), weight [O, I], bias [O] or None, the encoder's config,
    the feed-forward's activation (a function of a tensor, `model.bert.activation`), and `gated`: the
    feed-forward is gated (GeGLU), so the activation runs on half the up projection's output, not on all of it,
    and the down projection reads activation x gate, which no activation bounds."""

    role: str
    weight: torch.Tensor
    bias: torch.Tensor | None
    config: object
    activation: Callable[[torch.Tensor], torch.Tensor]
    gated: bool = False


class PackedSelfAttention(Variant):
    """A fused self-attention whose [3H, H] query/key/value projection is one inference-only module `qkv` (an
    int8 `Int8Linear`, or a packed `Bf16Linear`): its float weights are gone, so it stays fused."""

    prefix = "Packed"
    packed = True

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # [..., 3H] -> 3 x [..., H]
        return q, k, v


def pack_qkv(attention: nn.Module, make: Callable[[torch.Tensor, torch.Tensor], nn.Module]) -> None:
    """Fuse `attention`'s projections, then replace the fused weight and bias by `make(weight, bias)`."""
    fuse_qkv(attention)
    qkv = make(attention.qkv_weight, attention.qkv_bias)  # [3H, H]
    del attention.qkv_weight, attention.qkv_bias
    attention.__class__ = variant(PackedSelfAttention, type(attention).plain)  # the attention's own class
    attention.qkv = qkv


def replace_linears(model: nn.Module, make: Callable[[Site], nn.Module]) -> nn.Module:
    """Replace the four projections of every encoder layer inside `model` by `make(site)` (module docstring).
    Puts the model in eval mode with gradients off: a replaced model only infers.

    Raises:
        ConfigError: the model's linears were already replaced (by another converter).
    """
    model.eval().requires_grad_(False)
    for encoder in [m for m in model.modules() if is_encoder(m)]:
        config = encoder.config
        for layer in [m for m in encoder.modules() if is_layer(m)]:
            attention, ff = layer.attention, layer.feed_forward
            own_qkv = isinstance(getattr(attention, "qkv", None), nn.Linear)  # one fused linear of its own
            if not (own_qkv or is_attention(attention)) or is_packed(attention) or not isinstance(ff.up, nn.Linear):
                raise ConfigError("this model's linear layers were already replaced for another precision; "
                                  "load the model again to prepare it for this one")
            act = ff.act
            gated = ff.up.out_features == 2 * ff.down.in_features  # GeGLU: up gives value and gate, I each

            def site(role, linear=None, weight=None, bias=None, config=config, act=act, gated=gated):
                weight = linear.weight if linear is not None else weight
                bias = linear.bias if linear is not None else bias
                return Site(role, weight, bias, config, act, gated)

            if own_qkv:
                attention.qkv = make(site("qkv", attention.qkv))
            else:
                pack_qkv(attention, lambda w, b, site=site: make(site("qkv", weight=w, bias=b)))
            attention.output = make(site("output", attention.output))
            ff.up = make(site("up", ff.up))
            if getattr(ff.up, "applies_activation", False):
                ff.act = nn.Identity()  # the activation moved into the up projection
            ff.down = make(site("down", ff.down))
    return model


def replaced_by(model: nn.Module, cls: type) -> list[str]:
    """Names of the modules of class `cls` inside `model` (which projections a converter replaced)."""
    return [name for name, module in model.named_modules() if isinstance(module, cls)]


__all__ = ["PackedSelfAttention", "ROLES", "Site", "pack_qkv", "replace_linears", "replaced_by"]
