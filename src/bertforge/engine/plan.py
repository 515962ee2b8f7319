"""How a model will run: `EnginePlan` (device, precision, engine kind, threads, and why), and the one precision
rule every command applies before any work (`plan_precision`).

The rule is `runtime`'s (`choose_precision`: `auto` is bf16 on a CUDA device with bf16 support, else fp32; int8
on the CPU only; bf16 on a GPU only where it is native) plus the refusal of a precision a user asked for that
the device cannot honour (`check_user_precision`: fp16 off a CUDA GPU). Every command that runs a model
(evaluate, predict, embed, serve, search and the Python pipelines) plans through `build.plan_engine`, which
calls this and then the engine kind's own limits, so the same flags are accepted or refused the same way by
each of them, with the same words.

Threads are `threads`'s rule (`plan_threads`): on the CPU the cores the process may use (affinity, cgroup quota,
`OMP_NUM_THREADS` and friends), intra-op and tokenizer threads together within them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from bertforge import runtime
from bertforge.engine.threads import plan_cpu_threads
from bertforge.errors import ConfigError


@dataclass(frozen=True)
class EnginePlan:
    """What an engine is built for.

    Attributes:
        device: where the model runs.
        precision: a concrete precision (`runtime.PRECISIONS` without `auto`).
        kind: the engine kind (`build.ENGINES`: "torch", "onnxruntime").
        threads: intra-op threads on the CPU (None on a GPU), always a number there: a silent default thread
            count makes two runtimes' figures incomparable.
        reason: why this engine, precision and thread count (for `/health` and logs).
        tokenizer_threads: threads that tokenize beside the model (`evaluation.run_streamed`); 0: the inputs
            are tokenized in the calling thread between model calls, so the intra-op threads have the cores.
        auto: the kind was chosen by `--engine auto` (a call its engine cannot take then runs on PyTorch rather
            than being refused, since the user never asked for that engine).
    """

    device: torch.device
    precision: str
    kind: str = "torch"
    threads: int | None = None
    reason: str = "requested"
    tokenizer_threads: int = 1
    auto: bool = False

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "device": str(self.device), "precision": self.precision,
                "threads": self.threads, "tokenizer_threads": self.tokenizer_threads, "reason": self.reason}


def plan_precision(precision: str, device: torch.device, where: str = "precision") -> tuple[str, str]:
    """(concrete precision, why) for a requested precision on `device`: the one rule of every command.

    Raises:
        ConfigError: an unknown name, fp16 off a CUDA GPU, bf16 on a GPU without it, int8 off the CPU.
    """
    runtime.check_user_precision(precision, device, where)
    return runtime.choose_precision(precision, device)


def plan_threads(threads: int | None, device: torch.device) -> tuple[int | None, int, str]:
    """(intra-op threads, tokenizer threads, why): on the CPU `threads.plan_cpu_threads` (the count asked for,
    else the environment's, else every core the process may use, within PyTorch's count; a tokenizer thread
    only where a core is left for it); on an accelerator (None, 1: the tokenizer streams beside the device).

    Raises:
        ConfigError: a count that is not a positive integer (here or in `OMP_NUM_THREADS` and friends).
    """
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"threads must be a positive integer, got {threads!r}")
    if device.type != "cpu":
        return None, 1, f"threads: {device.type} (no CPU thread count; the tokenizer streams beside it)"
    chosen = plan_cpu_threads(threads, torch.get_num_threads())
    return chosen.intra_op, chosen.tokenizer, chosen.why


__all__ = ["EnginePlan", "plan_precision", "plan_threads"]
