"""Data-parallel training across processes and machines: torchrun/DDP setup from the environment, the few
collectives the loop needs, and what a run says when a rank is lost.

Launch with `torchrun --nproc_per_node=N -m bertforge ...` on one machine, or on each of several machines
`torchrun --nnodes M --node_rank i --nproc_per_node N --rdzv_backend c10d --rdzv_endpoint HOST:PORT ...`:
torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK (the node), MASTER_ADDR and MASTER_PORT (read and
checked by `processes.Ranks.from_env`, as for `embed` and `predict`), `setup` joins the group (NCCL on GPUs,
gloo on CPU) with the run's collective timeout, and every rank logs its place once. Without those variables
everything here degrades to a single process: collectives return their input, `is_main()` is True. Model
code stays single-device; `wrap_model` puts DistributedDataParallel around it.

A rank that dies (or hangs past the timeout) makes a collective fail on the others; the loop turns that
failure into one `RankLostError` line naming the lost rank(s) and their host (`raise_if_rank_lost`): each
surviving rank marks itself in the group's key-value store, and the ranks without a mark are the lost ones.
`BERTFORGE_FAULT` injects such a failure for tests (`inject_fault`).
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import signal
import socket
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bertforge.errors import BertforgeError, ConfigError
from bertforge.processes import Ranks
from bertforge.runtime import resolve_device

log = logging.getLogger("bertforge.training")

DEFAULT_TIMEOUT_S = 600.0
FAULT_ENV = "BERTFORGE_FAULT"
# How long a rank that saw a collective fail waits for the other survivors to mark themselves.
SURVIVOR_GRACE_S = 3.0
_STORE_PREFIX = "bertforge/"


class RankLostError(BertforgeError, RuntimeError):
    """A collective failed because another rank died, hung past the timeout or became unreachable."""


@dataclass(frozen=True)
class DistributedContext:
    """Where this process sits: its rank among `world_size` processes and the device it trains on; `node`
    and `master` as `Ranks` has them (None outside torchrun)."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    node: int | None = None
    master: str | None = None

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(device: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S) -> DistributedContext:
    """Join the process group described by the environment (idempotent); return this process's context.
    The process that joins logs its place once (`describe_place`).

    Args:
        device: `auto`, `cpu`, `cuda`...; under torchrun with CUDA, each rank takes `cuda:LOCAL_RANK`.
        timeout_s: how long a collective may wait for a straggler before failing
            (`training.distributed_timeout_s`).
    """
    ranks = Ranks.from_env()
    rank, world_size, local_rank = ranks.rank, ranks.world_size, ranks.local_rank
    base = resolve_device(device)
    if world_size > 1 and base.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} GPUs are visible; "
                              "start at most that many processes per node")
        base = torch.device("cuda", local_rank)
        torch.cuda.set_device(base)
    joined = False
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if base.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        joined = True
    if dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
    context = DistributedContext(rank=rank, world_size=world_size, local_rank=local_rank, device=base,
                                 node=ranks.node, master=ranks.master)
    if joined:
        store_call("set", f"place/{rank}", f"host {socket.gethostname()}, node {_shown(context.node)}, "
                                           f"local rank {local_rank}")
        log.info("%s; collective timeout %g s", describe_place(context), timeout_s)
    return context


def describe_place(context: DistributedContext) -> str:
    """This process's place, as every rank logs it once: rank, local rank, world size, node, host, master."""
    backend = dist.get_backend() if dist.is_initialized() else "none"
    return (f"rank {context.rank} of {context.world_size} (local rank {context.local_rank}, node "
            f"{_shown(context.node)}, host {socket.gethostname()}, master {_shown(context.master, '?:?')}, "
            f"{backend} on {context.device})")


def _shown(value: Any, missing: str = "?") -> str:
    """`value` as a message shows it: `missing` where torchrun did not say."""
    return missing if value is None else str(value)


def store_call(method: str, key: str, *args: Any) -> Any:
    """`method` of the process group's key-value store on `bertforge/<key>` (None when there is no group or
    the store cannot be reached: this is bookkeeping for messages, never a reason to fail)."""
    if not dist.is_initialized():
        return None
    try:
        store = dist.distributed_c10d._get_default_store()
        if method == "check":
            return store.check([_STORE_PREFIX + key])
        value = getattr(store, method)(_STORE_PREFIX + key, *args)
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    except Exception:  # a lost store host, a closed connection: the message goes without this detail
        return None


def is_collective_failure(exc: BaseException) -> bool:
    """Whether `exc` is a collective (or DDP's gradient all-reduce) failing on a lost or hung peer."""
    if isinstance(exc, RankLostError):
        return False
    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(marker in text for marker in (
        "gloo", "nccl", "connection closed", "connection reset", "connection refused", "broken pipe",
        "timed out", "timeout", "socket", "peer"))


def lost_ranks(context: DistributedContext, grace_s: float = SURVIVOR_GRACE_S) -> tuple[list[int], dict[int, str]]:
    """(ranks that are gone, {rank: error} of ranks that stopped on an error of their own), after a failed
    collective: this rank marks itself a survivor, then waits up to `grace_s` for the others' marks."""
    store_call("set", f"survivor/{context.rank}", "1")
    deadline = time.monotonic() + grace_s
    while True:
        others = [r for r in range(context.world_size) if r != context.rank]
        failed = {r: store_call("get", f"error/{r}") for r in others if store_call("check", f"error/{r}")}
        missing = [r for r in others if r not in failed and not store_call("check", f"survivor/{r}")]
        if not missing or time.monotonic() > deadline:
            return missing, failed
        time.sleep(0.1)


def rank_lost_error(exc: BaseException, context: DistributedContext, timeout_s: float) -> RankLostError:
    """The one-line error a surviving rank stops with, naming the lost ranks and their place."""
    missing, failed = lost_ranks(context)
    parts = []
    for rank in missing:
        place = store_call("get", f"place/{rank}") if store_call("check", f"place/{rank}") else None
        parts.append(f"lost rank {rank}" + (f" ({place})" if place else "")
                     + ": its process died, hung past the timeout or its node became unreachable")
    parts += [f"rank {rank} stopped with an error: {message}" for rank, message in failed.items()]
    if not parts:
        parts.append("the lost rank could not be named (the rendezvous store is unreachable: the node of rank 0 "
                     "may be the lost one)")
    # The backend's own words, without its source location: "Connection reset by peer", "Timed out ...".
    cause = re.sub(r"\[[^\]]*\.(?:cc|cpp|hpp):\d+\]\s*", "", " ".join(str(exc).split()))
    cause = cause.split(". ", 1)[0].rstrip(".")[:160]
    return RankLostError(f"rank {context.rank} of {context.world_size}: a collective failed ({cause}); "
                         f"{'; '.join(parts)}. Stopping this rank (training.distributed_timeout_s="
                         f"{timeout_s:g}); the last complete checkpoint is intact: restart with "
                         "--training.resume=auto, on any number of processes")


def raise_if_rank_lost(exc: Exception, context: DistributedContext, timeout_s: float) -> None:
    """Called with an exception that stops this rank's training: if a collective failed because a peer is
    gone, raise `RankLostError` naming it; otherwise leave the error's first line in the store for the other
    ranks to name, and return (the caller re-raises `exc`)."""
    if not context.is_distributed or isinstance(exc, RankLostError):
        return
    if is_collective_failure(exc):
        raise rank_lost_error(exc, context, timeout_s) from None
    first = (str(exc).splitlines() or [""])[0][:200]
    store_call("set", f"error/{context.rank}", f"{type(exc).__name__}: {first}")


def inject_fault(step: int, context: DistributedContext) -> None:
    """A test hook: with `BERTFORGE_FAULT=STEP[:RANK[:KIND]]`, after optimizer step STEP (and its checkpoint)
    the process of rank RANK (every rank when absent) is killed (KIND `kill`, SIGKILL: a crash) or stopped
    (`hang`, SIGSTOP: a hung process, for the collective timeout)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    fields = spec.split(":")
    at, target, kind = int(fields[0]), fields[1] if len(fields) > 1 else "", fields[2] if len(fields) > 2 else "kill"
    if step == at and (target == "" or int(target) == context.rank):
        os.kill(os.getpid(), signal.SIGSTOP if kind == "hang" else signal.SIGKILL)


def teardown() -> None:
    """Leave the process group (safe to call when none was joined)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    """True on rank 0 (the process that writes files and logs)."""
    return rank() == 0


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` over all ranks, in place, and return it."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Average `tensor` over all ranks, in place, and return it."""
    all_reduce_sum(tensor)
    return tensor.div_(world_size())


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (a one-element list in a single process)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s `obj` on every rank."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def wrap_model(model: nn.Module, context: DistributedContext) -> nn.Module:
    """DistributedDataParallel around `model` when there is more than one process; `model` otherwise.

    DDP broadcasts rank 0's parameters at wrap time, so every rank starts from identical weights, and
    averages gradients over ranks in backward.
    """
    if not context.is_distributed:
        return model
    device_ids = [context.device.index] if context.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain model inside DDP and/or torch.compile wrappers."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model
