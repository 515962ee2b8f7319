"""Fine-tuning ColBERT through the one training loop: pairs and triplets (in-batch negatives by MaxSim) from a
plain BERT directory train a `BertForColBERT` whose loss falls, whose dev retrieval is scored by MaxSim, and whose
best directory is a PyLate ColBERT directory that `evaluate` (the same figures) and the embed-multi-vector route
read back."""

from __future__ import annotations

import json

import pytest
import torch
from tests.e2e.test_finetune_embedding import PAIRS, write_pairs

from bertforge.cli import main
from bertforge.families.colbert import BertForColBERT, ColbertObjective, GroupVectors
from bertforge.families.registry import load_model
from bertforge.inference.pipelines import load_pipeline


def test_colbert_objective_is_cross_entropy_over_maxsim_in_batch():
    torch.manual_seed(0)
    queries = torch.nn.functional.normalize(torch.randn(2, 3, 4), dim=-1)
    documents = torch.nn.functional.normalize(torch.randn(4, 5, 4), dim=-1)  # 2 examples x (positive, negative)
    scored = torch.ones(4, 5, dtype=torch.bool)
    scored[1, 3:] = False
    output = GroupVectors(queries, torch.ones(2, 3, dtype=torch.bool), documents, scored)

    class Batch:
        input_ids = torch.zeros(2, 3, 7, dtype=torch.long)

    by_hand = torch.stack([torch.stack([(q @ d[s].T).max(1).values.sum() for d, s in zip(documents, scored)])
                           for q in queries])  # [2, 4]
    loss, count = ColbertObjective().loss_terms(output, Batch())["contrastive"]
    expected = torch.nn.functional.cross_entropy(by_hand, torch.tensor([0, 2]), reduction="sum")
    assert loss.item() == pytest.approx(expected.item(), abs=1e-5) and count.item() == 2


@pytest.mark.parametrize("fmt, negatives", [("colbert-pairs", False), ("colbert-triplets", True)])
def test_finetune_colbert_from_a_plain_bert_saves_a_pylate_directory(tmp_path, tiny_minilm_model, fmt, negatives):
    data = write_pairs(tmp_path / "train.tsv", negatives)
    assert main(["finetune", "--model", str(tiny_minilm_model), "--out", str(tmp_path / "run"), "--epochs", "3",
                 "--batch-size", "4", "--lr", "1e-3", "--format", fmt, "--train", str(data), "--dev", str(data)]) == 0
    best = tmp_path / "run" / "best"
    modules = [m["type"] for m in json.loads((best / "modules.json").read_text())]
    assert modules == ["sentence_transformers.models.Transformer", "pylate.models.Dense.Dense"]
    model, _ = load_model(best)
    assert isinstance(model, BertForColBERT) and model.dimension == 128
    results = json.loads((tmp_path / "run" / "eval_results.json").read_text())
    assert {"ndcg@10", "mrr@10", "accuracy@1", "recall@10"} <= set(results["best_metrics"])
    history = [entry["metrics"]["ndcg@10"] for entry in results["history"]]
    assert len(history) == 3 and history[-1] > history[0]  # it learns the training pairs (dev = train here)
    pipeline = load_pipeline(best, "embed-multi-vector", device="cpu")
    assert len(pipeline(PAIRS[0][0], role="query")["embeddings"]) == 32
    assert main(["evaluate", "--model", str(best), "--data", str(data), "--out", str(tmp_path / "eval")]) == 0
    evaluated = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert evaluated["metrics"]["ndcg@10"] == pytest.approx(results["best_metrics"]["ndcg@10"], abs=1e-6)
