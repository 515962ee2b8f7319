"""In-batch negatives across processes: 2 CPU processes (gloo) with batch B each give the loss and the gradients
of 1 process with batch 2B, because every rank scores its anchors against the candidates of both ranks,
gathered with their gradients (`families.contrastive.gather`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_families_contrastive import groups_batch  # noqa: E402

from bertforge.families.contrastive import ContrastiveLoss, ContrastiveObjective  # noqa: E402
from bertforge.families.embedding import BertForSentenceEmbedding  # noqa: E402
from conftest import free_port, spawn_workers  # noqa: E402

BATCH = 6  # per process
TOLERANCE = 1e-5
TIMEOUT_S = 240


def run(settings: ContrastiveLoss, rank: int, world: int, texts: int) -> tuple[float, dict[str, list[float]]]:
    """This rank's share of the loss of the whole batch, and its gradients summed over ranks."""
    from conftest import make_tiny_config

    whole = groups_batch(BATCH * 2, seed=3, texts=texts)
    # Uneven shares (7 and 5 examples), as an epoch's last, short batch gives one rank.
    bounds = [0, BATCH + 1, BATCH * 2] if world == 2 else [0, BATCH * 2]
    rows = slice(bounds[rank], bounds[rank + 1])
    mine = type(whole)(whole.input_ids[rows], whole.token_type_ids[rows], whole.attention_mask[rows],
                       whole.feature_index[rows])
    torch.manual_seed(0)
    model = BertForSentenceEmbedding(make_tiny_config()).train()
    objective = ContrastiveObjective(settings)
    total, _ = objective.loss_terms(model(**mine.model_inputs()), mine)["contrastive"]
    (total / (BATCH * 2)).backward()
    loss = total.detach() / (BATCH * 2)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if world > 1:
        dist.all_reduce(loss)
        for grad in grads:
            dist.all_reduce(grad)
    names = [n for n, p in model.named_parameters() if p.grad is not None]
    return float(loss), {n: g.flatten()[:50].tolist() + [float(g.norm())] for n, g in zip(names, grads)}


def worker(rank: int, world: int, port: int, out: str, symmetric: bool, texts: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        loss, grads = run(ContrastiveLoss(loss="mnrl", symmetric=symmetric), rank, world, texts)
        if rank == 0:
            Path(out).write_text(json.dumps({"loss": loss, "grads": grads}), encoding="utf-8")
    finally:
        dist.destroy_process_group()


# Pairs, plus triplets (their hard negatives must sit after every positive of their rank in the gathered
# candidates, so that each target is a positive), with the ranks holding 7 and 5 examples.
@pytest.mark.parametrize("symmetric, texts", [(False, 2), (True, 2), (False, 4)])
def test_embedding_two_processes_gather_negatives_like_one_with_double_batch(tmp_path, symmetric, texts):
    torch.set_num_threads(1)
    single_loss, single_grads = run(ContrastiveLoss(loss="mnrl", symmetric=symmetric), 0, 1, texts)
    out = tmp_path / "ddp.json"
    spawn_workers(worker, (2, free_port(), str(out), symmetric, texts), 2, TIMEOUT_S)
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["loss"] == pytest.approx(single_loss, abs=TOLERANCE)
    assert result["grads"].keys() == single_grads.keys()
    for name, values in single_grads.items():
        assert result["grads"][name] == pytest.approx(values, abs=TOLERANCE), name
