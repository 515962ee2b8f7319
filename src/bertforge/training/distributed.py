"""Data-parallel training across processes: torchrun/DDP setup from the environment and the few collectives
the loop needs.

Launch with `torchrun --nproc_per_node=N -m bertforge ...`: torchrun sets RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT, and `setup` joins the group (NCCL on GPUs, gloo on CPU). Without those
variables everything here degrades to a single process: collectives return their input, `is_main()` is True.
Model code stays single-device; `wrap_model` puts DistributedDataParallel around it.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bertforge.errors import ConfigError
from bertforge.runtime import resolve_device


@dataclass(frozen=True)
class DistributedContext:
    """Where this process sits: its rank among `world_size` processes and the device it trains on."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} must be an integer (set by torchrun)") from None


def setup(device: str = "auto", timeout_minutes: float = 30.0) -> DistributedContext:
    """Join the process group described by the environment (idempotent); return this process's context.

    Args:
        device: `auto`, `cpu`, `cuda`...; under torchrun with CUDA, each rank takes `cuda:LOCAL_RANK`.
        timeout_minutes: how long a collective may wait for a straggler before failing.
    """
    world_size = env_int("WORLD_SIZE", 1)
    rank = env_int("RANK", 0)
    local_rank = env_int("LOCAL_RANK", 0)
    base = resolve_device(device)
    if world_size > 1 and base.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} GPUs are visible; "
                              "start at most that many processes per node")
        base = torch.device("cuda", local_rank)
        torch.cuda.set_device(base)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if base.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(minutes=timeout_minutes))
    if dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
    return DistributedContext(rank=rank, world_size=world_size, local_rank=local_rank, device=base)


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
