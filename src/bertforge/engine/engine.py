"""`Engine`: a model prepared to run, and `TorchEngine`, the PyTorch model with its converters applied.

An engine is model-shaped: it is an `nn.Module` whose forward takes what the wrapped model's forward takes and
returns what it returns, and whose other attributes are the wrapped model's (`engine.config`), so a family's
forward takes an engine where it takes a model and no family changes. `engine.bert` is the encoder, model-shaped
too (a bare encoder's is itself): what the embedding family runs. An engine also knows its plan
(`plan.EnginePlan`: device, precision, kind, threads, why), what was applied to the model (`converters`), and
describes both for `/health` (`describe`). `running()` is the context every run happens in: eval mode,
`torch.inference_mode`, and autocast where the plan's precision runs under it; besides the training loop it is
the only place that enters autocast.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from bertforge import runtime
from bertforge.engine.bf16 import pack_bf16
from bertforge.engine.int8 import quantize_int8
from bertforge.engine.layer_graph import has_layer_graph, trace_layers
from bertforge.engine.plan import EnginePlan
from bertforge.engine.row_chunks import chunk_rows
from bertforge.model.fast_paths import is_encoder, set_value_checks


class Engine(nn.Module):
    """Base of the engines (see the module docstring).

    Class attributes (what `build.plan_engine` checks before any work): `devices`, the device types this kind
    runs on (empty: any); `precisions`, the concrete precisions it runs (empty: any).
    """

    kind: ClassVar[str] = ""
    devices: ClassVar[tuple[str, ...]] = ()
    precisions: ClassVar[tuple[str, ...]] = ()

    def __init__(self, model: nn.Module, plan: EnginePlan, converters: Sequence[str] = ()):
        super().__init__()
        self.model = model
        self.plan = plan
        self.converters = tuple(converters)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)  # the engine's own parameters, buffers and modules
        except AttributeError:
            model = self.__dict__.get("_modules", {}).get("model")
            if model is None:
                raise
            return getattr(model, name)

    @property
    def device(self) -> torch.device:
        return self.plan.device

    @property
    def precision(self) -> str:
        return self.plan.precision

    @property
    def bert(self) -> nn.Module:
        """The encoder, model-shaped: what `families.embedding.encoder_of` runs."""
        return self.model if is_encoder(self.model) else self.model.bert  # BERT's or ModernBERT's

    @classmethod
    def build(cls, model: nn.Module, plan: EnginePlan, source: str | os.PathLike | None = None) -> Engine:
        """The engine of this kind running `model` as `plan` says (called by `build.build_engine` only);
        `source`: the model directory it was loaded from, where known (an engine may keep files beside it)."""
        raise NotImplementedError

    def runs(self, family: Any) -> bool:
        """Whether this engine can run `family`'s forward (PyTorch runs every family)."""
        return True

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def prepare(self, family: Any) -> None:
        """Be ready to run `family`'s forward (an engine that runs an exported graph builds the graph the family
        reads); refuse, naming the fix, a family this engine cannot run. PyTorch runs every family."""

    @contextlib.contextmanager
    def running(self) -> Iterator[Engine]:
        """Eval mode, no autograd, and autocast where the precision runs under it (the wrapped model's training
        mode is restored afterwards)."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode(), runtime.autocast(self.plan.device, self.plan.precision):
                yield self
        finally:
            self.model.train(was_training)

    def describe(self) -> dict[str, Any]:
        """What runs, for `/health` and logs: the plan and the converters applied."""
        return {**self.plan.describe(), "converters": list(self.converters)}

    def extra_repr(self) -> str:
        return f"kind={self.plan.kind}, device={self.plan.device}, precision={self.plan.precision}, " \
               f"threads={self.plan.threads}, converters={list(self.converters)}"


class TorchEngine(Engine):
    """The PyTorch model, converted in place for its plan, on any device PyTorch runs on, at any precision.

    The converters (`build`): on the CPU, int8 quantizes the encoder's linears (`int8`) and bf16 casts and packs
    them once (`bf16`); every CPU precision then runs unmasked calls through a traced layer graph (`layer_graph`:
    equal outputs, bit for bit, with less Python between the operators; measured on 2 AMX cores, fp32 batch 1 at
    16-128 tokens 4-5% faster) and large batches in row chunks (`row_chunks`), at the plan's thread count. On a
    GPU, fp32, fp16 and bf16 run the model as it is, under autocast (`running`), without reading the ids' values.
    """

    kind = "torch"

    @classmethod
    def build(cls, model: nn.Module, plan: EnginePlan, source: str | os.PathLike | None = None) -> TorchEngine:
        model = model.to(plan.device).eval()
        converters: list[str] = []
        if plan.device.type != "cpu":
            set_value_checks(model, False)  # reading the ids' range would synchronise the device on every call
            return cls(model, plan, converters)
        if plan.threads is not None and plan.threads != torch.get_num_threads():
            torch.set_num_threads(plan.threads)
        if plan.precision == "int8":
            quantize_int8(model)
            converters.append("int8")
        elif plan.precision == "bf16":
            pack_bf16(model)
            converters.append("bf16")
        chunk_rows(trace_layers(model))
        # (BERT's layer stacks are traced; ModernBERT's, whose layers take rotary tables too, run eagerly)
        graphed = any(has_layer_graph(m) for m in model.modules() if is_encoder(m))
        return cls(model, plan, [*converters, *(["layer_graph"] if graphed else []), "row_chunks"])


__all__ = ["Engine", "TorchEngine"]
