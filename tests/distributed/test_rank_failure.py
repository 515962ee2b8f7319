"""A rank that dies or hangs: the others stop within the collective timeout (`training.distributed_timeout_s`)
with one line naming the lost rank, and the last complete checkpoint is intact.

Two torchrun "nodes" (c10d rendezvous on localhost) of one process each, as on a cluster: there the agent of
the failed node cannot stop the other node's workers, so what they say is what the user reads. The failure
is injected with `BERTFORGE_FAULT` (`training.distributed.inject_fault`): rank 1 SIGKILLs itself, or
SIGSTOPs itself (a hung process), after step 5, whose checkpoint was not due (checkpoints every 3 steps).
"""

from __future__ import annotations

import re
import time

import pytest
import torch
from launch import environment, finish, kill_session, make_pretraining_data, pretrain_args, start_nodes

from bertforge.families.pretraining import BertForPretraining
from bertforge.training.checkpoint import list_checkpoints, load_training_state
from bertforge.training.distributed import DistributedContext, RankLostError, raise_if_rank_lost

LOST = re.compile(r"^bertforge pretrain: error: rank 0 of 2: a collective failed \(.*\); lost rank 1 \(host \S+, "
                  r"node 1, local rank 0\): its process died, hung past the timeout or its node became "
                  r"unreachable\. .*resume=auto.*$", re.MULTILINE)


@pytest.fixture(scope="module")
def pretraining_data(tmp_path_factory):
    return make_pretraining_data(tmp_path_factory.mktemp("failure"))


def failing_run(data, out, fault: str, timeout_s: int):
    args = pretrain_args(data, out, 30, 4, "--training.save_every=3", "--training.keep_last=0",
                         f"--training.distributed_timeout_s={timeout_s}")
    return start_nodes(2, args, env=environment(BERTFORGE_FAULT=fault))


def check_intact(out) -> None:
    """The checkpoints before the failure are complete and load; none after it."""
    assert [step for step, _ in list_checkpoints(out)] == [3]
    path = list_checkpoints(out)[0][1]
    assert load_training_state(path)["step"] == 3
    BertForPretraining.from_pretrained(path)


@pytest.mark.slow  # two torchrun launches with a tiny pretraining each: about 80 s on 2 cores
def test_rank_failure_a_killed_rank_is_named_by_the_others(pretraining_data, tmp_path):
    node0, node1 = failing_run(pretraining_data, tmp_path / "run", "5:1", timeout_s=120)
    (code1, output1), = finish([node1])
    died = time.monotonic()
    (code0, output0), = finish([node0])
    waited = time.monotonic() - died
    assert code1 != 0 and code0 != 0
    assert LOST.search(output0), output0[-3000:]
    assert "Traceback" not in output0.split("bertforge pretrain: error:")[0][-2000:]
    print(f"killed rank 1: rank 0 stopped {waited:.1f} s after node 1 exited; its line: "
          f"{LOST.search(output0).group(0)[:400]}")
    assert waited < 120
    check_intact(tmp_path / "run")


@pytest.mark.slow  # about 70 s: startup, 5 steps, then the 20 s timeout
def test_rank_failure_a_hung_rank_is_named_after_the_timeout(pretraining_data, tmp_path):
    timeout_s = 20
    node0, node1 = failing_run(pretraining_data, tmp_path / "run", "5:1:hang", timeout_s=timeout_s)
    try:
        started = time.monotonic()
        (code0, output0), = finish([node0], timeout_s=240)
        elapsed = time.monotonic() - started
    finally:
        kill_session(node1)  # its worker is stopped, its agent still waits
        finish([node1], timeout_s=30)
    assert code0 != 0
    assert LOST.search(output0), output0[-3000:]
    assert "Timed out" in output0 or "timed out" in output0.lower()
    print(f"hung rank 1: rank 0 stopped after {elapsed:.1f} s in all (timeout {timeout_s} s); its line: "
          f"{LOST.search(output0).group(0)[:400]}")
    check_intact(tmp_path / "run")


def test_rank_failure_message_is_one_line_naming_every_lost_rank():
    # Without a process group nobody can mark itself a survivor: ranks 1 and 2 are both lost (after the
    # survivors' grace period).
    context = DistributedContext(rank=0, world_size=3, local_rank=0, device=torch.device("cpu"))
    failure = RuntimeError("[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
                           "[127.0.0.1]:221: Connection reset by peer")
    with pytest.raises(RankLostError) as caught:
        raise_if_rank_lost(failure, context, timeout_s=30)
    message = str(caught.value)
    assert "\n" not in message and "pair.cc" not in message and "Connection reset by peer" in message
    assert "lost rank 1:" in message and "lost rank 2:" in message and "resume=auto" in message
    raise_if_rank_lost(ValueError("a mistake of this rank's own"), context, timeout_s=30)  # not a lost rank
