"""`bertforge finetune --format rerank-lists` as a user runs it: a query's list of documents with labels trains
a one-output cross-encoder with ListNet, evaluated on lists (nDCG@10, MRR@10); the saved model serves `rerank`;
a list it cannot train on is refused naming its file and line, before any model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.checkpoint_format import read_config
from bertforge.cli import main
from bertforge.inference.pipelines import load_pipeline

FACTS = [("Where is the Eiffel Tower?", "The Eiffel Tower stands in Paris, France."),
         ("What do bees make?", "Bees make honey from the nectar of flowers."),
         ("Who wrote Hamlet?", "Hamlet is a tragedy written by William Shakespeare."),
         ("How fast is light?", "Light travels at about 300,000 kilometres per second."),
         ("Where do pandas live?", "Giant pandas live in the mountains of central China.")]


def write_lists(path: Path) -> Path:
    rows = []
    for i, (query, answer) in enumerate(FACTS):
        others = [FACTS[(i + k) % len(FACTS)][1] for k in range(1, 2 + i % 3)]  # lists of 2 to 4 documents
        rows.append({"query": query, "docs": [*others, answer], "labels": [0] * len(others) + [1]})
    path.write_text("\n".join(json.dumps(r) for r in rows * 2) + "\n", encoding="utf-8")
    return path


def test_finetune_rerank_lists_train_listnet_and_serve_rerank(tmp_path, tiny_minilm_model):
    data = write_lists(tmp_path / "lists.jsonl")
    assert main(["finetune", "--model", str(tiny_minilm_model), "--format", "rerank-lists", "--train", str(data),
                 "--dev", str(data), "--out", str(tmp_path / "run"), "--epochs", "1", "--batch-size", "4",
                 "--lr", "1e-4"]) == 0
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("loss_listnet" in r["values"] or "loss" in r["values"] for r in metrics if r["split"] == "train")
    results = json.loads((tmp_path / "run" / "eval_results.json").read_text())
    assert {"ndcg@10", "mrr@10"} == set(results["best_metrics"])
    best = tmp_path / "run" / "best"
    config, _ = read_config(best)
    assert config.num_labels == 1
    ranked = load_pipeline(best, "rerank", device="cpu").run([{"query": FACTS[0][0], "texts": [FACTS[1][1],
                                                                                             FACTS[0][1]]}])
    assert sorted(item["index"] for item in ranked[0]["results"]) == [0, 1]
    # Without a task named, the saved reranker serves rerank (its record's family), as `rerank` ranks.
    assert load_pipeline(best, device="cpu").task == "rerank"
    # `bertforge evaluate` scores the saved reranker as a reranker (its record says so; the architecture is a
    # one-output classifier's) with the figures fine-tuning reported.
    assert main(["evaluate", "--model", str(best), "--data", str(data), "--out", str(tmp_path / "eval")]) == 0
    scored = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert scored["metrics"]["ndcg@10"] == pytest.approx(results["best_metrics"]["ndcg@10"], abs=1e-6)


def test_finetune_rerank_lists_refuses_a_list_without_a_positive(tmp_path, tiny_minilm_model, capsys):
    data = write_lists(tmp_path / "lists.jsonl")
    lines = data.read_text(encoding="utf-8").splitlines()
    lines[2] = json.dumps({"query": "Who?", "docs": ["He did.", "She did."], "labels": [0, 0]})
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["finetune", "--model", str(tiny_minilm_model), "--format", "rerank-lists", "--train", str(data),
                 "--dev", str(data), "--out", str(tmp_path / "run")]) == 2
    assert f"{data}:3: no document is labelled relevant" in capsys.readouterr().err
    assert not (tmp_path / "run" / "best").exists()
