"""torchrun's variables have one reader, `processes.Ranks.from_env`, for `embed`/`predict` and for training's
DDP setup (`training.distributed.setup`): a value torchrun could not have written is one `ConfigError` that
names the variable(s) and says to launch with torchrun.
"""

from __future__ import annotations

import pytest

from bertforge.errors import ConfigError
from bertforge.processes import Ranks
from bertforge.training import distributed

VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def torchrun_env(monkeypatch):
    """A clean slate of torchrun's variables; returns a setter."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def set_env(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return set_env


def test_ranks_from_env_reads_torchrun_place(torchrun_env):
    torchrun_env(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", GROUP_RANK="1", MASTER_ADDR="n1", MASTER_PORT="29500")
    ranks = Ranks.from_env()
    assert (ranks.rank, ranks.world_size, ranks.local_rank) == (3, 4, 1)
    assert (ranks.node, ranks.master) == (1, "n1:29500")
    assert ranks == Ranks(3, 4, 1)  # the place in messages takes no part in comparisons


def test_ranks_from_env_without_torchrun_is_one_process(torchrun_env):
    ranks = Ranks.from_env()
    assert ranks == Ranks(0, 1, 0) and ranks.node is None and ranks.master is None
    torchrun_env(RANK="", WORLD_SIZE="", LOCAL_RANK="")  # empty counts as unset, as before
    assert Ranks.from_env() == Ranks(0, 1, 0)


@pytest.mark.parametrize("name, value", [("RANK", "one"), ("WORLD_SIZE", "-2"), ("LOCAL_RANK", " 1"),
                                         ("WORLD_SIZE", "1.0"), ("GROUP_RANK", "node0"), ("RANK", "²")])
def test_ranks_from_env_rejects_a_value_that_is_not_a_whole_number(torchrun_env, name, value):
    torchrun_env(**{"RANK": "0", "WORLD_SIZE": "2", name: value})
    with pytest.raises(ConfigError) as caught:
        Ranks.from_env()
    assert str(caught.value) == (f"environment variable {name}={value!r} must be a whole number (0, 1, ...); "
                                 "launch with torchrun, which sets it")


@pytest.mark.parametrize("values, message", [
    ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4 must be below WORLD_SIZE=4 (ranks count from 0)"),
    ({"RANK": "1"}, "RANK=1 must be below WORLD_SIZE=1 (ranks count from 0)"),
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 but RANK is not set: every process needs its own RANK"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "environment variable WORLD_SIZE=0 must be at least 1"),
])
def test_ranks_from_env_rejects_an_impossible_place(torchrun_env, values, message):
    torchrun_env(**values)
    with pytest.raises(ConfigError) as caught:
        Ranks.from_env()
    assert str(caught.value) == (message + "; launch with torchrun, which sets them, or unset RANK and WORLD_SIZE "
                                 "to run as one process")


def test_ranks_from_env_errors_stop_training_setup_too(torchrun_env):
    """Training's DDP setup reads the same variables through the same checks, before joining any group."""
    torchrun_env(RANK="2", WORLD_SIZE="2")
    with pytest.raises(ConfigError, match="RANK=2 must be below WORLD_SIZE=2"):
        distributed.setup("cpu")
    torchrun_env(RANK="x")
    with pytest.raises(ConfigError, match="RANK='x' must be a whole number"):
        distributed.setup("cpu")


def test_ranks_from_env_place_reaches_training_context(torchrun_env):
    torchrun_env(GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29400")
    context = distributed.setup("cpu")
    assert (context.rank, context.world_size, context.node, context.master) == (0, 1, 0, "127.0.0.1:29400")
    assert "(local rank 0, node 0, host " in distributed.describe_place(context)
    assert ", master 127.0.0.1:29400, none on cpu)" in distributed.describe_place(context)
    torchrun_env(MASTER_ADDR="", MASTER_PORT="", GROUP_RANK="")
    context = distributed.setup("cpu")
    assert "node ?, " in distributed.describe_place(context)
    assert ", master ?:?, " in distributed.describe_place(context)
