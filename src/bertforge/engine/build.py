"""Choosing how a model runs: `plan_engine` (a user's device, precision, engine kind and threads -> a plan, or a
refusal), `build_engine` (a loaded model + a plan -> an engine: the only place converters and engines are chosen),
`as_engine` (what a runner holds: an engine, or a model wrapped as it is) and `check_precision`.

`ENGINES` maps an engine kind to its class (`engine.Engine`); a kind declares the devices and precisions it runs,
which `plan_engine` checks before any work, and `auto` (the default, `choose_kind`) picks one of them, and builds itself for a plan (`Engine.build(model, plan)`, which only
`build_engine` calls: `TorchEngine.build` chooses PyTorch's converters). Adding an engine is its own file plus one
line here. A figure labelled int8 is always one measured with int8 layers (`check_precision`), and a model
prepared for bf16 never runs without autocast.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

import torch
from torch import nn

from bertforge.engine.bf16 import is_bf16
from bertforge.engine.engine import Engine, TorchEngine
from bertforge.engine.int8 import is_quantized
from bertforge.engine.onnxruntime import OrtEngine
from bertforge.engine.plan import EnginePlan, plan_precision, plan_threads
from bertforge.errors import ConfigError
from bertforge.runtime import DEFAULT_PRECISION, resolve_device

log = logging.getLogger(__name__)

# Engine kind -> its class (`Engine.build(model, plan)` makes one). The first runs everything.
ENGINES: dict[str, type[Engine]] = {
    "torch": TorchEngine,
    "onnxruntime": OrtEngine,
}
TORCH_KIND = "torch"
AUTO_KIND = "auto"
KINDS = (AUTO_KIND, *ENGINES)
DEFAULT_KIND = AUTO_KIND
# What `auto` picks for every run when set (a deployment that pins its engine), else `choose_kind`'s rule.
ENGINE_VARIABLE = "BERTFORGE_ENGINE"


CPUINFO = Path("/proc/cpuinfo")


def cpu_kind(cpuinfo: str | None = None) -> tuple[str, set[str]]:
    """(vendor, feature flags) of this machine's CPU from /proc/cpuinfo (("", set()) where it is unreadable)."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return fields.get("vendor_id", ""), set(fields.get("flags", "").split())


def choose_kind(device: torch.device, precision: str, cpuinfo: str | None = None) -> tuple[str, str]:
    """(engine kind, why) for `--engine auto` (`ENGINE_VARIABLE` names a kind for every run instead).

    The rule, from whole `bertforge embed` / `predict` commands measured against each other
    (docs/benchmarks.md, "A shared CPU"): on an Intel CPU with AVX-512 our PyTorch path (MKL/oneDNN kernels,
    padding skipped in every matmul) used less CPU time and wall time than ONNX Runtime's fused graph, idle and
    beside CPU-bound processes, so it runs there; on other CPUs (an AVX2 AMD EPYC in issue #48: onnxruntime
    1.45x a sentence-transformers script beside a busy process where torch was 1.03x; batch 1 2.0x transformers
    against torch's 1.1x, docs/cpu_inference.md) ONNX Runtime runs fp32 where the `export` extra is installed.
    Its graph is held to PyTorch within 1e-4 (the tests over `ENGINES`) and exported once per model, cached.
    At int8 PyTorch's own kernels were faster on both CPUs; bf16 and the GPU are PyTorch's alone.
    """
    pinned = os.environ.get(ENGINE_VARIABLE, "").strip()
    if pinned and pinned != AUTO_KIND:
        if pinned not in ENGINES:
            raise ConfigError(f"{ENGINE_VARIABLE}={pinned!r} is not an engine; set it to one of {', '.join(ENGINES)}"
                              f", or unset it")
        return pinned, f"engine {pinned}: {ENGINE_VARIABLE}"
    if device.type != "cpu":
        return TORCH_KIND, f"engine auto: torch (on {device.type}; onnxruntime runs on the CPU only)"
    if precision != "fp32":
        return TORCH_KIND, f"engine auto: torch (at {precision}; PyTorch's kernels were the faster there)"
    vendor, flags = cpu_kind(cpuinfo)
    if vendor == "GenuineIntel" and "avx512f" in flags:
        return TORCH_KIND, ("engine auto: torch (an Intel CPU with AVX-512: our PyTorch path ran embed and "
                            "predict with less CPU and wall time than onnxruntime, idle and beside busy processes)")
    missing = [name for name in ("onnx", "onnxruntime") if importlib.util.find_spec(name) is None]
    if missing:
        return TORCH_KIND, (f"engine auto: torch ({' and '.join(missing)} not installed; onnxruntime runs fp32 "
                            "faster on this CPU: pip install 'bertforge[export]')")
    return "onnxruntime", (f"engine auto: onnxruntime (fp32 on a {vendor or 'CPU'} without Intel's AVX-512 "
                           "kernels: its fused graph, held to PyTorch within 1e-4, ran faster than our PyTorch "
                           "path beside busy processes; exported once per model and cached)")


def plan_engine(device: str | torch.device | None = "auto", precision: str = DEFAULT_PRECISION,
                kind: str = DEFAULT_KIND, threads: int | None = None, *, where: str = "precision") -> EnginePlan:
    """The plan every command makes from its flags (`--device`, `--precision`, `--engine`, `--threads`) before any
    work: the one precision rule (`plan.plan_precision`), the engine kind (`auto`: `choose_kind`), what the
    kind runs, and the threads (`plan.plan_threads`: the cores this process may use).

    Raises:
        ConfigError: an unknown device or kind, a precision the device cannot honour, a device or precision
            the kind does not run, a thread count that is not a positive integer.
    """
    run_device = resolve_device(device)
    if kind not in KINDS:
        raise ConfigError(f"unknown engine {kind!r}; use one of {', '.join(KINDS)}")
    chosen, why = plan_precision(precision, run_device, where)
    reasons, auto = [why], kind == AUTO_KIND
    if auto:
        kind, kind_why = choose_kind(run_device, chosen)
        reasons.append(kind_why)
    engine = ENGINES[kind]
    if engine.devices and run_device.type not in engine.devices:
        raise ConfigError(f"engine {kind} runs on {' or '.join(engine.devices)}, and this run is on "
                          f"{run_device.type}; use --device {engine.devices[0]}, or --engine {TORCH_KIND}")
    if engine.precisions and chosen not in engine.precisions:
        raise ConfigError(f"engine {kind} runs at {' or '.join(engine.precisions)}, not {chosen}; use --precision "
                          f"{engine.precisions[0]}, or --engine {TORCH_KIND} for {chosen}")
    count, tokenizer_threads, threads_why = plan_threads(threads, run_device)
    return EnginePlan(run_device, chosen, kind, count, "; ".join([*reasons, threads_why]), tokenizer_threads, auto)


def build_engine(model: nn.Module | Engine, plan: EnginePlan, source: str | os.PathLike | None = None) -> Engine:
    """The engine that runs `model` as `plan` says; the model is converted in place (load it again for another
    plan). `source`: the model directory `model` was loaded from, where known (named in what an engine
    reports; an engine that exports a graph keys its cache by the weights, not by this folder). An engine already built for this plan is returned as it is (pipelines sharing
    one loaded model share its engine).

    Raises:
        ConfigError: an engine built for another plan, or a model already prepared for another precision.
    """
    if isinstance(model, Engine):
        if model.plan != plan:
            raise ConfigError(f"this engine runs {model.plan.describe()}, not {plan.describe()}; load the model "
                              "again for another plan")
        return model
    check_precision(model, plan.precision, unprepared_ok=True)
    return ENGINES[plan.kind].build(model, plan, source)


def as_engine(model: nn.Module | Engine, *, device: torch.device | str | None = None,
              precision: str = DEFAULT_PRECISION) -> Engine:
    """What a runner holds: `model` itself when it is an engine (refused at another precision), else the model
    as it is wrapped in a `TorchEngine` (no converter applied: a model being trained runs as it trains), on
    `device` (default: the model's) at a concrete `precision`.

    Raises:
        ConfigError: the engine or model was prepared for another precision, or int8 for a model not quantized.
    """
    check_precision(model, precision)
    if isinstance(model, Engine):
        return model
    where = torch.device(device) if device is not None else next(model.parameters()).device
    return TorchEngine(model, EnginePlan(where, precision, reason="the model as given"))


def prepared_precision(model: nn.Module | Engine) -> str | None:
    """The precision `model` was prepared for ("int8", "bf16"; an engine's plan precision), None if unprepared."""
    if isinstance(model, Engine):
        return model.plan.precision
    if is_quantized(model):
        return "int8"
    return "bf16" if is_bf16(model) else None


def check_precision(model: nn.Module | Engine, precision: str, unprepared_ok: bool = False) -> None:
    """Refuse to run a model at a precision it was not prepared for: an engine runs at its plan's precision, a
    model prepared for int8 or bf16 runs at that precision only, and int8 needs an int8 model (unless
    `unprepared_ok`: an engine is about to prepare it)."""
    prepared = prepared_precision(model)
    if prepared is not None and prepared != precision:
        raise ConfigError(f"precision {precision} was asked for, but the model is prepared for {prepared} "
                          f"inference; run it at {prepared}, or load it again for {precision}")
    if precision == "int8" and prepared is None and not unprepared_ok:
        raise ConfigError("precision int8 was asked for, but the model is not int8-quantized; build its engine "
                          "first: bertforge.engine.build_engine(model, plan_engine('cpu', 'int8'))")


__all__ = ["AUTO_KIND", "DEFAULT_KIND", "ENGINES", "ENGINE_VARIABLE", "KINDS", "TORCH_KIND", "choose_kind", "cpu_kind", "as_engine", "build_engine", "check_precision", "plan_engine",
           "prepared_precision"]
