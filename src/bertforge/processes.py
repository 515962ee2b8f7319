"""This process's place among torchrun processes (`Ranks`) and the gloo group of a few collectives (`Group`).

`Ranks.from_env` is the one reader of torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK,
MASTER_ADDR, MASTER_PORT) and the one place that checks them. `embed` and `predict` (`inference`) take their
share of a corpus by rank and meet in a gloo group at the start and the end; training's DDP setup
(`training.distributed`) joins its own process group with the same `Ranks`. Without torchrun's variables
everything degrades to one process (rank 0 of 1; collectives do nothing).
"""

from __future__ import annotations

import datetime
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from bertforge import runtime
from bertforge.errors import BertforgeError, ConfigError

# The collectives wait for the slowest rank, which may be a whole shard behind; a rank that dies is
# reaped by torchrun (which stops the others), so a long wait never hangs a failed run.
GROUP_TIMEOUT = datetime.timedelta(hours=24)


# torchrun writes plain decimal numbers; `int()` alone would also take "-1", " 2" or "1_0".
_WHOLE_NUMBER = re.compile(r"[0-9]+")
_LAUNCH_HINT = "launch with torchrun, which sets them, or unset RANK and WORLD_SIZE to run as one process"


def _env_number(name: str) -> int | None:
    """The whole number in environment variable `name` (None when unset or empty)."""
    value = os.environ.get(name, "")
    if value == "":
        return None
    if not _WHOLE_NUMBER.fullmatch(value):
        raise ConfigError(f"environment variable {name}={value!r} must be a whole number (0, 1, ...); launch "
                          "with torchrun, which sets it")
    return int(value)


@dataclass(frozen=True)
class Ranks:
    """This process's place among the torchrun processes (a single process: rank 0 of 1). `node` (torchrun's
    GROUP_RANK) and `master` (MASTER_ADDR:MASTER_PORT) describe the place in messages; they are None outside
    torchrun and take no part in comparisons."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    node: int | None = field(default=None, compare=False)
    master: str | None = field(default=None, compare=False)

    @classmethod
    def from_env(cls) -> Ranks:
        """RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK, MASTER_ADDR and MASTER_PORT as torchrun sets them (absent:
        a single process). A value torchrun could not have written is one `ConfigError` naming the variables."""
        rank, world_size, local_rank = _env_number("RANK"), _env_number("WORLD_SIZE"), _env_number("LOCAL_RANK")
        if world_size == 0:
            raise ConfigError("environment variable WORLD_SIZE=0 must be at least 1; " + _LAUNCH_HINT)
        if rank is None and world_size is not None and world_size > 1:
            raise ConfigError(f"WORLD_SIZE={world_size} but RANK is not set: every process needs its own RANK; "
                              + _LAUNCH_HINT)
        rank, world_size = rank or 0, world_size or 1
        if rank >= world_size:
            raise ConfigError(f"RANK={rank} must be below WORLD_SIZE={world_size} (ranks count from 0); "
                              + _LAUNCH_HINT)
        address, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        master = f"{address or '?'}:{port or '?'}" if address or port else None
        return cls(rank, world_size, local_rank or 0, node=_env_number("GROUP_RANK"), master=master)

    def owns(self, shard: int) -> bool:
        """Rank r of N takes shards r, r + N, r + 2N, ..."""
        return shard % self.world_size == self.rank

    def device(self, device: str) -> torch.device:
        """The device this rank runs on: under torchrun a bare "cuda" (or "auto" on a GPU machine) means
        the GPU of its LOCAL_RANK."""
        resolved = runtime.resolve_device(device)
        if self.world_size > 1 and resolved.type == "cuda" and resolved.index is None:
            return torch.device("cuda", self.local_rank % max(1, torch.cuda.device_count()))
        return resolved


class Group:
    """The gloo process group of the ranks, for the few collectives a run needs (none in one process)."""

    def __init__(self, ranks: Ranks):
        self.ranks, self.created = ranks, False

    def __enter__(self) -> Group:
        if self.ranks.world_size > 1 and not dist.is_initialized():
            dist.init_process_group("gloo", rank=self.ranks.rank, world_size=self.ranks.world_size,
                                    timeout=GROUP_TIMEOUT)
            self.created = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.created:
            dist.destroy_process_group()

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order (waits for all of them)."""
        gathered = [value] * self.ranks.world_size
        self.collective(dist.all_gather_object, gathered, value)
        return gathered

    def collective(self, call: Callable[..., Any], *args: Any) -> None:
        if self.ranks.world_size == 1:
            return
        try:
            call(*args)
        except RuntimeError:  # gloo's word for "a peer is gone": that rank has printed why
            raise ConfigError(f"rank {self.ranks.rank}: another rank stopped (its error is above); fix that and "
                              "rerun the same command to resume") from None

    def from_main(self, work: Callable[[], Any]) -> Any:
        """`work()` run on rank 0; its result, or the user error it raised, on every rank."""
        outcome: list[Any] = [None]
        if self.ranks.rank == 0:
            try:
                outcome = [(None, work())]
            except BertforgeError as error:
                if self.ranks.world_size == 1:
                    raise
                outcome = [(error, None)]
        self.collective(dist.broadcast_object_list, outcome, 0)
        if outcome[0][0] is not None:
            raise outcome[0][0]
        return outcome[0][1]


__all__ = ["GROUP_TIMEOUT", "Group", "Ranks"]
