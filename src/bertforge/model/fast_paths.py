"""Fast paths, applied to a built model from outside (as torchtitan applies parallelism and compile).

Each function transforms a model instance in place and returns it; none changes what the model computes
beyond rounding (tests/unit/test_fast_paths.py holds every one to the plain path, outputs and gradients),
and none changes `state_dict()` keys, so checkpoints and the Hugging Face key tables are unaffected.

- unpadding: `BertModel.unpad`, read by `layouts.choose_layout` (padding tokens skip every matmul).
- row chunks: `BertModel.row_chunk_tokens`, read by `BertModel.rows_per_chunk` (a large CPU inference batch
  runs in chunks of rows; follows unpadding unless set apart).
- fused QKV: each `SelfAttention` becomes a `FusedSelfAttention`, whose three [H, H] query/key/value
  projections are one [3H, H] weight and [3H] bias (one matmul instead of three). `state_dict()` still
  holds `query.weight`, `key.weight`, ... and `load_state_dict` accepts them.
- activation checkpointing: each `Layer` becomes a `CheckpointedLayer`, which in training (with
  gradients) keeps only its input and recomputes itself in the backward pass.
- layer graph: `trace_layers` gives an encoder's layer stack a `LayerGraph`, TorchScript graphs traced on
  first use, which then run CPU inference on unmasked input (every batch-1 call) without Python between the
  operators. Applied to models prepared for int8 (`model.precision.apply_precision`), which no longer change.

`BertPretrainedModel.from_pretrained` applies unpadding + fused QKV; `BertModel(config)` starts unpadded,
unfused.

This module imports nothing of the model but its token layouts (`layouts.Padded`, which the layer graph
runs): it finds what it transforms by the encoder's conventions (an
encoder has an `unpad` switch; an attention module has `projections()` and `query`/`key`/`value`
projections; a layer has `attention` and `feed_forward`) and makes each fast variant as a subclass of the
module's own class, so `model/bert.py` can offer `from_pretrained` on the fast path without a cycle. The plain reference path is one call away: `set_fast_paths(model, unpad=False, fused_qkv=False)`.
Fusing and un-fusing replace parameters: apply them before building an optimizer. AdamW and LAMB's
elementwise update treat one [3H, H] tensor exactly as three [H, H] ones; LAMB's trust ratio is per
tensor, so it differs for the fused tensor.
"""

from __future__ import annotations

import bisect
import threading
import warnings
from collections.abc import Callable

import torch
import torch.utils.checkpoint
from torch import nn

from bertforge.errors import ConfigError
from bertforge.model.layouts import Padded

PROJECTIONS = ("query", "key", "value")
# A CPU inference batch runs in row chunks (`BertModel.rows_per_chunk`) whose largest intermediate, the
# [tokens, I] feed-forward activation, holds at most this many bytes in fp32: 2,048 tokens for MiniLM
# (I = 1,536), 1,024 for BERT-base (3,072), 768 for BERT-large. In one piece, a 32 x 512 batch makes fresh
# 100-200 MB tensors in every layer, above glibc's 32 MB mmap threshold: each is new memory the kernel faults
# in and zeroes page by page, and none of it is in cache. Measured on the 2-core EPYC, int8, one 32 x 512
# batch (docs/cpu_inference.md, "Row chunks"): MiniLM 2.93 s in chunks of 4,096 tokens, 2.44 at 2,048, 2.45
# at 1,024, 2.66 at 512; BERT-base 14.1 s at 2,048, 13.2-13.5 at 1,024 and 512.
ROW_CHUNK_BYTES = 12 * 2**20


def row_chunk_tokens(config) -> int:
    """The token budget of one row chunk for a model of this config (`ROW_CHUNK_BYTES`)."""
    return max(1, ROW_CHUNK_BYTES // (4 * config.intermediate_size))


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


class PackedSelfAttention(Variant):
    """A fused self-attention whose [3H, H] query/key/value projection is one inference-only module `qkv`
    (an int8 `Int8Linear`, model/quantization.py, or a packed `Bf16Linear`, model/bf16.py): its float
    weights are gone, so it stays fused."""

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


def is_packed(module: nn.Module) -> bool:
    return getattr(module, "packed", False)


def fuse_qkv(attention: nn.Module) -> None:
    """Turn one self-attention module into its fused variant, holding the same numbers."""
    if isinstance(attention, FusedSelfAttention) or is_packed(attention):
        return  # already one projection (a packed one is fused: `PackedSelfAttention`)
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
        raise ConfigError("a model prepared for int8 or bf16 inference (model.precision.apply_precision) has no "
                          "float QKV weights to un-fuse; load the model again for the plain fp32 path")
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

    def forward(self, x, layout, return_probs=False):
        if self.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(super().forward, x, layout, return_probs, use_reentrant=False)
        return super().forward(x, layout, return_probs)


class LayerGraph:
    """One encoder's layer stack (`Encoder`, the `encoder.encoder` of a `BertModel`) recorded as TorchScript
    graphs by `torch.jit.trace`, for CPU inference on input without padding.

    Why: at batch 1 the encoder's operators are small and Python between them is a large share of a call.
    Measured on a 2-core AMX Xeon (int8 MiniLM, 6 layers; docs/cpu_inference.md, "On a Xeon with AMX"): the stack
    took 2.16 ms eager / 1.39 ms traced at 2 tokens, 5.75 / 4.38 ms at 95, 6.57 / 5.23 ms at 128. A graph
    runs the same operators in the same order as the eager forward (equal outputs, tested bit for bit), on
    any batch and length: sizes are read from the input, not fixed at tracing.

    Tracing records one branch of every Python `if`. A module whose forward branches on the number of rows
    of its input (batch x tokens) says where, as `small_rows` (int8 layers pick their kernel so,
    `model.quantization.Int8Linear`); the stack gets one graph per interval between those cutoffs, traced on
    the first call that falls in it. Tracing also records the casts autocast makes, so a graph is kept per
    autocast state too (a graph traced under bf16 autocast is not run without it). Only calls the graphs can
    stand for take them (`runs`): the unmasked padded layout (`Padded(None)`), no hidden states or attention
    maps asked for, no gradients, eval mode; every other call takes the eager forward. The graphs share the
    stack's weights, so they are made only for a model whose layers no longer change: one prepared for inference
    by `model.precision.apply_precision` (int8, bf16 packed for the CPU, fp32 on the CPU). They are not pickled
    or copied: a copy runs eager.
    """

    def __init__(self, stack: nn.Module):
        class Unmasked(nn.Module):  # the stack as a module of x alone, which is what tracing takes
            def __init__(self):
                super().__init__()
                self.stack = stack

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.stack(x, Padded(None))[0]  # [B, T, H] -> [B, T, H]

        self.unmasked = Unmasked().eval()
        self.cutoffs = sorted({m.small_rows for m in stack.modules() if getattr(m, "small_rows", 0)})
        # (interval of rows (bisect of cutoffs), autocast dtype or None) -> graph
        self.graphs: dict[tuple[int, torch.dtype | None], torch.jit.ScriptModule] = {}
        self.lock = threading.Lock()  # a server's threads may meet the same new interval at once

    def runs(self, x: torch.Tensor, layout) -> bool:
        """Whether a graph computes this call: CPU, no gradients, the unmasked padded layout."""
        return isinstance(layout, Padded) and layout.mask is None and x.device.type == "cpu" \
            and not torch.is_grad_enabled() and not torch.jit.is_tracing()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        interval = bisect.bisect_left(self.cutoffs, x.numel() // x.shape[-1])  # rows <= cutoff: that interval
        key = (interval, torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        graph = self.graphs.get(key)
        if graph is None:
            with self.lock, warnings.catch_warnings():
                # torch.jit warns that TorchScript is deprecated; it is still PyTorch 2.13's (pinned) way to run
                # a graph with the quantized operators' packed weights and no compiler (torch.compile breaks its
                # graph at them and measured slower).
                warnings.simplefilter("ignore")
                graph = self.graphs.get(key) or torch.jit.trace(self.unmasked, x, check_trace=False)
                self.graphs[key] = graph
        return graph(x)

    def __reduce__(self):
        return _no_graph, ()  # a ScriptModule does not pickle; a copy of the model runs eager


def _no_graph() -> None:
    return None


def trace_layers(model: nn.Module) -> nn.Module:
    """Give every encoder inside `model` a `LayerGraph` of its layer stack (in place; idempotent). Puts the model
    in eval mode (the graph is for inference; it runs only calls made without gradients, so the parameters'
    `requires_grad` is left as the caller has it)."""
    model.eval()
    for module in model.modules():
        if is_encoder(module) and getattr(module.encoder, "graph", None) is None:
            module.encoder.graph = LayerGraph(module.encoder)
    return model


def set_fast_paths(model: nn.Module, *, unpad: bool = True, fused_qkv: bool = True,
                   row_chunks: bool | None = None) -> nn.Module:
    """Switch unpadding, fused QKV and row chunks for every encoder inside `model` (a task model holds one as
    `.bert`). `row_chunks` (CPU inference batches in row chunks, `BertModel.rows_per_chunk`) follows `unpad`
    unless given.

    Idempotent; `unpad=False, fused_qkv=False` restores the plain reference path (weights un-fused).
    """
    chunks = unpad if row_chunks is None else row_chunks
    for module in model.modules():
        if is_encoder(module):
            module.unpad = bool(unpad)
            module.row_chunk_tokens = row_chunk_tokens(module.config) if chunks else 0
            forget_graphs(module)  # fusing or un-fusing QKV replaces modules a traced graph holds
    for module in list(model.modules()):
        if is_attention(module):
            (fuse_qkv if fused_qkv else unfuse_qkv)(module)
    return model


def forget_graphs(encoder: nn.Module) -> None:
    """Drop what an encoder's `LayerGraph` traced (its layers are about to change): the next call traces anew."""
    graph = getattr(encoder.encoder, "graph", None)
    if graph is not None:
        graph.graphs.clear()


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
    """Which fast paths every encoder inside `model` runs: {"unpad", "row_chunks", "fused_qkv",
    "activation_checkpointing", "layer_graph"}."""
    modules = list(model.modules())

    def every(kind, test) -> bool:
        found = [m for m in modules if kind(m)]
        return bool(found) and all(test(m) for m in found)

    return {"unpad": every(is_encoder, lambda m: m.unpad),
            "row_chunks": every(is_encoder, lambda m: bool(getattr(m, "row_chunk_tokens", 0))),
            "fused_qkv": every(is_attention, lambda m: isinstance(m, FusedSelfAttention)),
            "activation_checkpointing": every(is_layer, lambda m: isinstance(m, CheckpointedLayer)),
            "layer_graph": every(is_encoder, lambda m: getattr(m.encoder, "graph", None) is not None)}
