"""DDP: 2 CPU processes (gloo) with batch B each train exactly like 1 process with batch 2B.

Both runs see the same instances in every step (the synthetic source slices each global batch by rank)
with uneven masked-token counts per rank, so this checks the global count normalisation and the
world-size scaling of the loss under DDP's gradient averaging. Dropout is 0: the ranks' RNG streams differ.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from conftest import free_port, spawn_workers

# The synthetic batch source and tiny model live with the loop's unit tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_training_loop import SyntheticSource, config_for, losses, single_thread, tiny_model  # noqa: E402, F401

from bertforge.families.pretraining import BertForPretraining, PretrainingObjective  # noqa: E402
from bertforge.training import distributed  # noqa: E402
from bertforge.training.loop import train  # noqa: E402

BATCH = 3
STEPS = 5
BATCHES_PER_EPOCH = 4  # 5 steps cross an epoch boundary
TOLERANCE = 1e-5  # fp32; only the order of summation differs
TIMEOUT_S = 240  # spawn + torch import per worker; generous for a loaded 2-core CI machine


def worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    try:
        context = distributed.setup("cpu")
        source = SyntheticSource(BATCHES_PER_EPOCH, BATCH, rank=context.rank, world_size=context.world_size)
        config = config_for(Path(out_dir), steps=STEPS, batch_size=BATCH)
        result = train(tiny_model(seed=rank), source, PretrainingObjective(), config)
        with open(Path(out_dir) / f"history-{rank}.json", "w", encoding="utf-8") as handle:
            json.dump(result.history, handle)
    finally:
        distributed.teardown()


def test_ddp_two_processes_match_one_process_with_double_batch(tmp_path):
    spawn_workers(worker, (2, free_port(), str(tmp_path / "ddp")), 2, TIMEOUT_S)

    single = train(tiny_model(seed=0), SyntheticSource(BATCHES_PER_EPOCH, 2 * BATCH), PretrainingObjective(),
                   config_for(tmp_path / "single", steps=STEPS, batch_size=2 * BATCH))

    for rank in (0, 1):
        history = json.loads((tmp_path / "ddp" / f"history-{rank}.json").read_text(encoding="utf-8"))
        ddp_losses, single_losses = losses(history), losses(single.history)
        assert len(ddp_losses) == len(single_losses) == STEPS
        for (step, a), (_, b) in zip(ddp_losses, single_losses, strict=True):
            for key in b:
                assert a[key] == pytest.approx(b[key], abs=TOLERANCE), (rank, step, key)

    # Rank 1 started from other weights (seed=rank): DDP's broadcast from rank 0 made them equal.
    ddp_model = BertForPretraining.from_pretrained(tmp_path / "ddp" / f"checkpoint-{STEPS:06d}")
    single_model = BertForPretraining.from_pretrained(single.checkpoint)
    for (name, a), b in zip(ddp_model.state_dict().items(), single_model.state_dict().values()):
        torch.testing.assert_close(a, b, atol=TOLERANCE, rtol=0, msg=name)
