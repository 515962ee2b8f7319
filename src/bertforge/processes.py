"""This process's place among torchrun processes (`Ranks`) and the gloo group of a few collectives (`Group`).

Shared by every command that splits work across torchrun processes without training a model: `embed` and
`predict` (`inference`) take their share of a corpus by rank and meet in a gloo group at the start and the
end. Without torchrun's variables everything degrades to one process (rank 0 of 1; collectives do nothing).
Training's DDP setup (`training.distributed`) reads the same variables for its own process group.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from bertforge import runtime
from bertforge.errors import BertforgeError, ConfigError

# The collectives wait for the slowest rank, which may be a whole shard behind; a rank that dies is
# reaped by torchrun (which stops the others), so a long wait never hangs a failed run.
GROUP_TIMEOUT = datetime.timedelta(hours=24)


@dataclass(frozen=True)
class Ranks:
    """This process's place among the torchrun processes (a single process: rank 0 of 1)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> Ranks:
        """RANK, WORLD_SIZE and LOCAL_RANK as torchrun sets them (absent: a single process)."""
        values = [os.environ.get(name) or default for name, default in (("RANK", "0"), ("WORLD_SIZE", "1"),
                                                                        ("LOCAL_RANK", "0"))]
        if not all(value.isdigit() for value in values) or int(values[0]) >= int(values[1]):
            raise ConfigError(f"RANK={values[0]!r}, WORLD_SIZE={values[1]!r}, LOCAL_RANK={values[2]!r} must be "
                              "integers with RANK < WORLD_SIZE; launch with torchrun, which sets them")
        return cls(*map(int, values))

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
