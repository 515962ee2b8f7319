"""The layer-graph converter: an encoder's layer stack recorded as TorchScript graphs for CPU inference.

`trace_layers(model)` turns every encoder's layer stack (`model.bert.Encoder`) into a `GraphedEncoder` holding a
`LayerGraph`: graphs traced by `torch.jit.trace` on first use, which then run CPU inference on unmasked input
(every batch-1 call) without Python between the operators; every other call runs the eager layers. Applied by
`engine.build.build_engine` on the CPU (fp32, and after the int8 or bf16 converter, whose layers no longer change).
"""

from __future__ import annotations

import bisect
import threading
import warnings

import torch
from torch import nn

from bertforge.model.bert import BertModel
from bertforge.model.fast_paths import Variant, is_encoder, variant
from bertforge.model.layouts import Padded


class LayerGraph:
    """One encoder's layer stack (`Encoder`, the `encoder.encoder` of a `BertModel`) recorded as TorchScript
    graphs by `torch.jit.trace`, for CPU inference on input without padding.

    Why: at batch 1 the encoder's operators are small and Python between them is a large share of a call.
    Measured on a 2-core AMX Xeon (int8 MiniLM, 6 layers; docs/notes/cpu_inference.md, "On a Xeon with AMX"): the
    stack took 2.16 ms eager / 1.39 ms traced at 2 tokens, 5.75 / 4.38 ms at 95, 6.57 / 5.23 ms at 128. A graph
    runs the same operators in the same order as the eager forward (equal outputs, tested bit for bit), on
    any batch and length: sizes are read from the input, not fixed at tracing.

    Tracing records one branch of every Python `if`. A module whose forward branches on the number of rows
    of its input (batch x tokens) says where, as `small_rows` (int8 layers pick their kernel so,
    `engine.int8.Int8Linear`); the stack gets one graph per interval between those cutoffs, traced on
    the first call that falls in it. Tracing also records the casts autocast makes, so a graph is kept per
    autocast state too (a graph traced under bf16 autocast is not run without it). Only calls the graphs can
    stand for take them (`runs`): the unmasked padded layout (`Padded(None)`), no hidden states or attention
    maps asked for, no gradients, eval mode; every other call takes the eager forward. The graphs share the
    stack's weights, so they are made only for a model whose layers no longer change: one an engine prepared
    (int8, bf16 packed for the CPU, fp32 on the CPU). They are not pickled or copied: a copy runs eager.
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
        """Whether a graph computes this call: CPU, no gradients, the unmasked padded layout (and not while
        tracing the graph itself)."""
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


class GraphedEncoder(Variant):
    """An encoder layer stack that runs the calls its `LayerGraph` stands for through the graph, the others
    through its own layers."""

    prefix = "Graphed"

    def forward(self, x: torch.Tensor, layout, output_hidden_states: bool = False, output_attentions: bool = False):
        graph = self.__dict__.get("graph")  # None in a copy: the graph does not pickle
        if graph is not None and not (output_hidden_states or output_attentions or self.training) \
                and graph.runs(x, layout):
            return graph(x), None, None  # the same layers, traced: no Python between the operators
        return super().forward(x, layout, output_hidden_states, output_attentions)

    def forget(self) -> None:
        """Drop what was traced (the layers are about to change: `model.fast_paths.set_fast_paths`)."""
        graph = self.__dict__.get("graph")
        if graph is not None:
            graph.graphs.clear()


def trace_layers(model: nn.Module) -> nn.Module:
    """Give every encoder inside `model` a `LayerGraph` of its layer stack (in place; idempotent). Puts the model
    in eval mode (the graph is for inference; it runs only calls made without gradients, so the parameters'
    `requires_grad` is left as the caller has it)."""
    model.eval()
    for module in model.modules():
        # BERT's layer stack only: ModernBERT's layers take rotary tables too, and run eagerly.
        if is_encoder(module) and isinstance(module, BertModel) and not has_layer_graph(module):
            stack = module.encoder
            plain = type(stack).plain if isinstance(stack, GraphedEncoder) else type(stack)
            stack.__class__ = variant(GraphedEncoder, plain)
            stack.__dict__["graph"] = LayerGraph(stack)
    return model


def has_layer_graph(encoder: nn.Module) -> bool:
    """Whether an encoder (`BertModel`) runs its layer stack through a `LayerGraph`."""
    return encoder.encoder.__dict__.get("graph") is not None


__all__ = ["GraphedEncoder", "LayerGraph", "has_layer_graph", "trace_layers"]
