"""Fast paths, applied to a built model from outside (as torchtitan applies parallelism and compile).

Each function transforms a model instance in place and returns it; none changes what the model computes
beyond rounding (tests/unit/test_fast_paths.py holds every one to the plain path, outputs and gradients),
and none changes `state_dict()` keys, so checkpoints and the Hugging Face key tables are unaffected.

- unpadding: `BertModel.unpad`, read by `layouts.choose_layout` (padding tokens skip every matmul).
- fused QKV: each `SelfAttention` becomes a `FusedSelfAttention`, whose three [H, H] query/key/value
  projections are one [3H, H] weight and [3H] bias (one matmul instead of three). `state_dict()` still
  holds `query.weight`, `key.weight`, ... and `load_state_dict` accepts them.
- activation checkpointing: each `Layer` becomes a `CheckpointedLayer`, which in training (with
  gradients) keeps only its input and recomputes itself in the backward pass.

How a model is prepared to run (int8 or bf16 linears, a traced layer graph, CPU row chunks) is not a fast path of
the model: it is `bertforge.engine`'s, whose converters use the variant machinery here (`Variant`, `variant`) and
the encoder's conventions (`is_encoder`, `is_attention`, `is_layer`).

`BertPretrainedModel.from_pretrained` applies unpadding + fused QKV; `BertModel(config)` starts unpadded,
unfused.

This module imports nothing of the model: it finds what it transforms by the encoder's conventions (an
encoder has an `unpad` switch; an attention module has `projections()` and `query`/`key`/`value`
projections; a layer has `attention` and `feed_forward`) and makes each fast variant as a subclass of the
module's own class, so `model/bert.py` can offer `from_pretrained` on the fast path without a cycle. The plain
reference path is one call away: `set_fast_paths(model, unpad=False, fused_qkv=False)`.
Fusing and un-fusing replace parameters: apply them before building an optimizer. AdamW and LAMB's
elementwise update treat one [3H, H] tensor exactly as three [H, H] ones; LAMB's trust ratio is per
tensor, so it differs for the fused tensor.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint
from torch import nn

from bertforge.errors import ConfigError

PROJECTIONS = ("query", "key", "value")


class Variant:
    """Base of the fast variants: a variant of class C is a subclass of (the variant's mixin, C).

    Variants are made on demand (`variant`), one per plain class, and pickle as "the plain class's variant"
    so a pickled model loads in a process that has not made the variant yet.
    """

    plain: type[nn.Module]

    def __reduce_ex__(self, protocol):
        return rebuild, (type(self).__mro__[1], type(self).plain, self.__getstate__())


_VARIANTS: dict[tuple[type, type], type] = {}


def variant(mixin: type, plain: type[nn.Module]) -> type[nn.Module]:
    """The class `mixin` + `plain` (made once), named e.g. FusedSelfAttention."""
    key = (mixin, plain)
    if key not in _VARIANTS:
        _VARIANTS[key] = type(f"{mixin.prefix}{plain.__name__}", (mixin, plain), {"plain": plain, "__module__": __name__})
    return _VARIANTS[key]


def rebuild(mixin: type, plain: type[nn.Module], state: dict) -> nn.Module:
    module = nn.Module.__new__(variant(mixin, plain))
    module.__setstate__(state)
    return module


def is_encoder(module: nn.Module) -> bool:
    return hasattr(module, "unpad") and hasattr(module, "encoder")


def is_attention(module: nn.Module) -> bool:
    return callable(getattr(type(module), "projections", None))


def is_layer(module: nn.Module) -> bool:
    return hasattr(module, "attention") and hasattr(module, "feed_forward")


class FusedSelfAttention(Variant):
    """Makes a self-attention's query, key and value projections one [3H, H] matmul.

    Holds `qkv_weight` [3H, H] (query rows, then key, then value) and `qkv_bias` [3H] in place of the
    three `nn.Linear`s; saves and loads them under the separate names. (`isinstance(m, FusedSelfAttention)`
    tells a fused module.)
    """

    prefix = "Fused"

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = nn.functional.linear(x, self.qkv_weight, self.qkv_bias).chunk(3, dim=-1)  # [..., 3H] -> 3 x [..., H]
        return q, k, v

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        # The separate tensors, in the plain module's order; copies, as safetensors refuses shared storage.
        for name, weight, bias in zip(PROJECTIONS, self.qkv_weight.chunk(3), self.qkv_bias.chunk(3)):
            for role, part in (("weight", weight), ("bias", bias)):
                destination[f"{prefix}{name}.{role}"] = part if keep_vars else part.detach().clone()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        for role in ("weight", "bias"):
            keys = [f"{prefix}{name}.{role}" for name in PROJECTIONS]
            fused = getattr(self, f"qkv_{role}")
            if all(key in state_dict for key in keys):
                state_dict[f"{prefix}qkv_{role}"] = torch.cat([state_dict.pop(key) for key in keys])
                continue
            # A partial state dict (strict=False): copy the parts it has, report the others by their names.
            for key, part in zip(keys, fused.detach().chunk(3)):
                if key not in state_dict:
                    missing_keys.append(key)
                elif state_dict[key].shape != part.shape:
                    error_msgs.append(f"size mismatch for {key}: copying a param with shape "
                                      f"{tuple(state_dict.pop(key).shape)}, the model has {tuple(part.shape)}")
                else:
                    with torch.no_grad():
                        part.copy_(state_dict.pop(key))
            state_dict[f"{prefix}qkv_{role}"] = fused.detach()  # already in place: copied onto itself
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


def is_packed(module: nn.Module) -> bool:
    return getattr(module, "packed", False)


def fuse_qkv(attention: nn.Module) -> None:
    """Turn one self-attention module into its fused variant, holding the same numbers."""
    if isinstance(attention, FusedSelfAttention) or is_packed(attention):
        return  # already one projection (a packed one is fused: `engine.linears.PackedSelfAttention`)
    parts = [getattr(attention, name) for name in PROJECTIONS]
    with torch.no_grad():
        weight = torch.cat([p.weight for p in parts])  # 3 x [H, H] -> [3H, H]
        bias = torch.cat([p.bias for p in parts])  # 3 x [H] -> [3H]
    requires_grad = parts[0].weight.requires_grad
    for name in PROJECTIONS:
        delattr(attention, name)
    attention.__class__ = variant(FusedSelfAttention, type(attention))
    attention.qkv_weight = nn.Parameter(weight, requires_grad=requires_grad)
    attention.qkv_bias = nn.Parameter(bias, requires_grad=requires_grad)


def unfuse_qkv(attention: nn.Module) -> None:
    """Turn a fused self-attention back into its plain class (three `nn.Linear`s, same numbers)."""
    if is_packed(attention):
        raise ConfigError("a model prepared for int8 or bf16 inference (by its engine) has no float QKV weights "
                          "to un-fuse; load the model again for the plain fp32 path")
    if not isinstance(attention, FusedSelfAttention):
        return
    weight, bias = attention.qkv_weight, attention.qkv_bias
    requires_grad = weight.requires_grad
    del attention.qkv_weight, attention.qkv_bias
    attention.__class__ = type(attention).plain
    others = dict(attention._modules)
    attention._modules.clear()  # query, key, value first again: the plain module's parameter order
    hidden = weight.shape[1]
    for name, w, b in zip(PROJECTIONS, weight.detach().chunk(3), bias.detach().chunk(3)):
        linear = nn.utils.skip_init(nn.Linear, hidden, hidden, device=weight.device, dtype=weight.dtype)
        linear.weight = nn.Parameter(w.clone(), requires_grad=requires_grad)  # [H, H]
        linear.bias = nn.Parameter(b.clone(), requires_grad=requires_grad)  # [H]
        setattr(attention, name, linear.train(attention.training))
    attention._modules.update(others)


class CheckpointedLayer(Variant):
    """Makes a layer, in training with gradients, recompute itself in the backward pass.

    Activation memory drops from every layer's intermediates to its input, for about a third more compute.
    Dropout masks are replayed exactly (the RNG state is saved with each checkpoint), so gradients equal
    those of the plain path.
    """

    prefix = "Checkpointed"

    def forward(self, x, *args):
        if self.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(super().forward, x, *args, use_reentrant=False)
        return super().forward(x, *args)


def set_fast_paths(model: nn.Module, *, unpad: bool = True, fused_qkv: bool = True) -> nn.Module:
    """Switch unpadding and fused QKV for every encoder inside `model` (a task model holds one as `.bert`).

    Idempotent; `unpad=False, fused_qkv=False` restores the plain reference path (weights un-fused).
    """
    for module in model.modules():
        if is_encoder(module):
            module.unpad = bool(unpad)
            forget_graphs(module)  # fusing or un-fusing QKV replaces modules a traced graph holds
    for module in list(model.modules()):
        if is_attention(module):
            (fuse_qkv if fused_qkv else unfuse_qkv)(module)
    return model


def set_value_checks(model: nn.Module, enabled: bool) -> nn.Module:
    """Check (or not) the values of every encoder's input ids against its vocabulary (`BertModel.check_inputs`):
    off where the model runs on an accelerator or compiled (reading the ids' range would synchronise the
    device on every step, or break the compiled graph)."""
    for module in model.modules():
        if is_encoder(module):
            module.check_values = bool(enabled)
    return model


def forget_graphs(encoder: nn.Module) -> None:
    """Drop what an engine traced of an encoder's layer stack (`engine.layer_graph`; its layers are about to
    change): the next call traces anew."""
    forget = getattr(encoder.encoder, "forget", None)
    if forget is not None:
        forget()


def set_activation_checkpointing(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Recompute every encoder layer inside `model` in the backward pass (or stop, with `enabled=False`)."""
    for module in model.modules():
        if is_encoder(module):
            forget_graphs(module)  # its layers change class below
        if is_layer(module):
            plain = type(module).plain if isinstance(module, CheckpointedLayer) else type(module)
            module.__class__ = variant(CheckpointedLayer, plain) if enabled else plain
    return model


def fast_paths_enabled(model: nn.Module) -> dict[str, bool]:
    """Which fast paths every encoder inside `model` runs: {"unpad", "fused_qkv", "activation_checkpointing"}."""
    modules = list(model.modules())

    def every(kind, test) -> bool:
        found = [m for m in modules if kind(m)]
        return bool(found) and all(test(m) for m in found)

    return {"unpad": every(is_encoder, lambda m: m.unpad),
            "fused_qkv": every(is_attention, lambda m: isinstance(m, FusedSelfAttention)),
            "activation_checkpointing": every(is_layer, lambda m: isinstance(m, CheckpointedLayer))}
