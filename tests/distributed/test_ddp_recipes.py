"""DDP with the loop's recipes: 2 CPU processes (gloo) with batch B each train exactly like 1 process with
batch B and 2 accumulation steps, with FGM, R-Drop, EMA and layer-wise lr decay on.

That is the equivalence FGM promises: its perturbation follows each micro-batch's own gradient, which under
DDP is the rank's gradient before the all-reduce (the clean backward runs under no_sync). R-Drop's two
forward passes per backward exercise DDP's reducer, which is prepared once per backward. Dropout is 0 (the
ranks' RNG streams differ), so R-Drop's term is 0 here but both passes still run.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from conftest import free_port, spawn_workers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_training_recipes import Objective, Source, config_for, tiny_classifier, train_values  # noqa: E402

from bertforge.checkpoint_format import load_model  # noqa: E402
from bertforge.families.classification import BertForSequenceClassification  # noqa: E402
from bertforge.training import distributed  # noqa: E402
from bertforge.training.loop import train  # noqa: E402

BATCH = 3
STEPS = 4
BATCHES_PER_EPOCH = 3  # 4 steps cross an epoch boundary
TOLERANCE = 1e-5  # fp32; only the order of summation differs
TIMEOUT_S = 240  # spawn + torch import per worker; generous for a loaded 2-core CI machine
RECIPES = dict(fgm_epsilon=0.5, rdrop_alpha=1.0, ema_decay=0.9, layer_lr_decay=0.8)


def worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    try:
        context = distributed.setup("cpu")
        source = Source(BATCHES_PER_EPOCH, BATCH, rank=context.rank, world_size=context.world_size)
        config = config_for(Path(out_dir), steps=STEPS, batch_size=BATCH, **RECIPES)
        model = tiny_classifier(seed=rank)  # rank 1 starts elsewhere: DDP's broadcast must make them equal
        result = train(model, source, Objective(), config, context=context)
        with open(Path(out_dir) / f"history-{rank}.json", "w", encoding="utf-8") as handle:
            json.dump(result.history, handle)
        torch.save(model.state_dict(), Path(out_dir) / f"model-{rank}.pt")  # the EMA weights train returned
    finally:
        distributed.teardown()


def test_ddp_recipes_match_one_process_with_accumulation(tmp_path):
    spawn_workers(worker, (2, free_port(), str(tmp_path / "ddp")), 2, TIMEOUT_S)

    torch.set_num_threads(1)
    single = train(tiny_classifier(seed=0), Source(2 * BATCHES_PER_EPOCH, BATCH), Objective(),
                   config_for(tmp_path / "single", steps=STEPS, batch_size=BATCH, grad_accumulation=2, **RECIPES))
    for rank in (0, 1):
        history = json.loads((tmp_path / "ddp" / f"history-{rank}.json").read_text(encoding="utf-8"))
        for key in ("loss", "loss_ce", "loss_rdrop", "adv_ce", "accuracy", "grad_norm"):
            assert train_values(history, key) == pytest.approx(train_values(single.history, key), abs=TOLERANCE), \
                (rank, key)

    # The checkpoint and every rank's returned model hold the same EMA weights as the single process.
    single_model, _ = load_model(single.checkpoint, BertForSequenceClassification)
    expected = single_model.state_dict()
    ddp_model, _ = load_model(tmp_path / "ddp" / f"checkpoint-{STEPS:06d}", BertForSequenceClassification)
    returned = [torch.load(tmp_path / "ddp" / f"model-{rank}.pt", weights_only=True) for rank in (0, 1)]
    for state in (ddp_model.state_dict(), *returned):
        for name, tensor in expected.items():
            torch.testing.assert_close(state[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
