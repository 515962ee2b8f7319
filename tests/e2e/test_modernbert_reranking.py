"""Cross-encoders trained from a ModernBERT directory through the CLI, as from a BERT one: `bertforge finetune
--format rerank-lists` (ListNet over each query's list), `--format regression` (one output, scores 0/1) and
`--format pair` (two labels) from a tiny random ModernBERT masked LM, then `bertforge evaluate`, `bertforge
predict --task rerank` and the server's rerank dialects (ours, text-embeddings-inference's `/rerank`, Cohere v2's
`/v2/rerank`, Infinity's `/rerank` with documents) on the result, which agree with each other and with sentence-transformers' `CrossEncoder` loading
the saved directory (max |Δ| ≤ 1e-5 fp32).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from tests.e2e.test_finetune_reranking import FACTS, write_lists
from tests.e2e.test_modernbert_directory import tiny_modernbert
from tests.e2e.test_one_path import predict_results

from bertforge.cli import main
from bertforge.inference.pipelines import load_pipeline, load_pipelines, rerank_scores

st = pytest.importorskip("sentence_transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

BOUND = 1e-5
QUERIES = [{"query": query, "texts": [FACTS[(i + 1) % 5][1], answer, FACTS[(i + 3) % 5][1]]}
           for i, (query, answer) in enumerate(FACTS)]


def finetune(tmp_path, *flags: str) -> dict:
    assert main(["finetune", "--model", str(tmp_path / "base"), "--out", str(tmp_path / "run"), "--batch-size", "4",
                 "--device", "cpu", "--progress=false", *flags]) == 0
    return json.loads((tmp_path / "run" / "eval_results.json").read_text())


def cross_encoder_scores(directory, column: int | None = None) -> list[np.ndarray]:
    """CrossEncoder's relevance of each query's texts (two labels: the probability of label `column`, its
    softmax over the logits)."""
    model = st.CrossEncoder(str(directory), device="cpu")
    scores = [np.asarray(model.predict([(q["query"], t) for t in q["texts"]], apply_softmax=column is not None),
                         dtype=np.float64) for q in QUERIES]
    return [s[:, column] if column is not None else s for s in scores]


def by_index(results: list[dict], field: str = "score") -> list[float]:
    return [item[field] for item in sorted(results, key=lambda item: item["index"])]


def test_modernbert_finetunes_a_listwise_reranker_that_every_rerank_route_and_cross_encoder_agree_on(tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.serving.app import create_app

    data = write_lists(tmp_path / "lists.jsonl")
    tiny_modernbert(tmp_path / "base", [f"{q} {a}" for q, a in FACTS])
    results = finetune(tmp_path, "--format", "rerank-lists", "--train", str(data), "--dev", str(data), "--steps",
                       "3", "--lr", "1e-3")
    assert set(results["best_metrics"]) == {"ndcg@10", "mrr@10"}
    best = tmp_path / "run" / "best"
    saved = json.loads((best / "config.json").read_text())
    assert saved["model_type"] == "modernbert" and saved["architectures"] == ["ModernBertForSequenceClassification"]
    assert saved["num_labels"] == 1
    assert load_pipeline(best, device="cpu").task == "rerank"  # its record's family
    # `bertforge evaluate` scores it as a reranker, with the figures fine-tuning reported.
    assert main(["evaluate", "--model", str(best), "--data", str(data), "--out", str(tmp_path / "eval"),
                 "--device", "cpu"]) == 0
    scored = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert scored["metrics"]["ndcg@10"] == pytest.approx(results["best_metrics"]["ndcg@10"], abs=1e-6)

    predicted = predict_results(best, "rerank", QUERIES, tmp_path)
    with TestClient(create_app(best, device="cpu", precision="fp32")) as client:
        ours = client.post("/v1/rerank", json={"inputs": QUERIES})
        tei = [client.post("/rerank", json={"query": q["query"], "texts": q["texts"]}) for q in QUERIES]
        cohere = [client.post("/v2/rerank", json={"model": "m", "query": q["query"], "documents": q["texts"]})
                  for q in QUERIES]
        infinity = [client.post("/rerank", json={"query": q["query"], "documents": q["texts"]}) for q in QUERIES]
    assert ours.status_code == 200 and all(r.status_code == 200 for r in tei + cohere + infinity)
    theirs = cross_encoder_scores(best)
    for q, p, o, t, c, i, reference in zip(QUERIES, predicted, ours.json()["outputs"], tei, cohere, infinity, theirs,
                                           strict=True):
        assert len(p["results"]) == len(q["texts"])
        assert [r["index"] for r in p["results"]] == [r["index"] for r in o["results"]] == \
            [r["index"] for r in t.json()] == [r["index"] for r in c.json()["results"]] == \
            [r["index"] for r in i.json()["results"]]
        scores = np.asarray(by_index(p["results"]))
        assert np.abs(scores - reference).max() <= BOUND
        for other in (by_index(o["results"]), by_index(t.json()), by_index(c.json()["results"], "relevance_score"),
                      by_index(i.json()["results"], "relevance_score")):
            assert np.abs(np.asarray(other) - scores).max() <= BOUND


@pytest.mark.parametrize("format_name", ["regression", "pair"])
def test_modernbert_finetunes_a_pointwise_cross_encoder_that_reranks(tmp_path, format_name):
    rows = ["query\ttext\tlabel"]
    for i, (query, answer) in enumerate(FACTS * 2):
        other = FACTS[(i + 1) % 5][1]
        relevant, irrelevant = ("1.0", "0.0") if format_name == "regression" else ("1", "0")
        rows += [f"{query}\t{answer}\t{relevant}", f"{query}\t{other}\t{irrelevant}"]
    (tmp_path / "pairs.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    tiny_modernbert(tmp_path / "base", [f"{q} {a}" for q, a in FACTS])
    finetune(tmp_path, "--format", format_name, "--train", str(tmp_path / "pairs.tsv"), "--dev",
             str(tmp_path / "pairs.tsv"), "--text-a", "query", "--text-b", "text", "--label", "label", "--steps", "3")
    best = tmp_path / "run" / "best"
    saved = json.loads((best / "config.json").read_text())
    assert saved["architectures"] == ["ModernBertForSequenceClassification"]
    if format_name == "regression":
        # One output: a cross-encoder, served as a reranker beside its own route, relevance = sigmoid.
        assert saved["num_labels"] == 1 and "rerank" in load_pipelines(best, device="cpu")
        pipeline, theirs = load_pipeline(best, "rerank", device="cpu"), cross_encoder_scores(best)
    else:
        # Two labels: it reranks when asked, by the probability of the label that means relevant.
        assert saved["id2label"] == {"0": "0", "1": "1"}
        assert "rerank" not in load_pipelines(best, device="cpu")
        pipeline, theirs = load_pipeline(best, "rerank", device="cpu", rerank_label="1"), cross_encoder_scores(best, 1)
    for q, reference in zip(QUERIES, theirs, strict=True):
        assert np.abs(rerank_scores(pipeline, q["query"], q["texts"]) - reference).max() <= BOUND
