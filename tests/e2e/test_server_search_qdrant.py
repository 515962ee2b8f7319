"""`POST /search` over a Qdrant collection (`serve --index NAME=qdrant+path:DIR?collection=C`, qdrant-client's
local mode: the same client code as a server) answers what `bertforge search` answers over the folders it was
exported from: dense (exact) the same ids and spans with scores within 1e-5, hybrid through Qdrant's fusion the
same fused ids and scores; /health names the collection; its refusals are 4xx."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("qdrant_client")

from tests.e2e.test_server import running  # noqa: E402

from bertforge import cli  # noqa: E402
from bertforge.retrieval import embed_corpus as E  # noqa: E402
from bertforge.retrieval.qdrant_collection import export_folders  # noqa: E402
from bertforge.serving.app import create_app  # noqa: E402
from bertforge.serving.search_routes import parse_index_option  # noqa: E402

SCORE_TOLERANCE = 1e-5
TOPICS = ("the river floods the old market in spring", "a quiet train station at dawn", "fresh bread and warm coffee",
          "rain on the garden window", "a long walk through the city at night", "the harbour fish sold at noon")
QUERIES = ["where is the market by the river?", "coffee and bread in the morning", "music at night"]


@pytest.fixture(scope="module")
def served(tiny_sparse_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("qdrant")
    corpus = root / "corpus.jsonl"
    records = [{"id": f"doc-{i}", "text": f"{TOPICS[i % len(TOPICS)]}, number {i}. " * (1 + i % 3)} for i in range(30)]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    made = {"dense": E.EmbedSettings(pooling="mean", normalize=True), "sparse": E.EmbedSettings(sparse=True),
            "chunks": E.EmbedSettings(pooling="mean", normalize=True, chunk=12, chunk_overlap=4)}
    for name, settings in made.items():
        E.embed_corpus(tiny_sparse_model, corpus, root / name, settings, device="cpu", shard_size=7)
    db = root / "db"
    export_folders([root / "dense", root / "sparse"], str(db), collection="hybrid")
    export_folders([root / "chunks"], str(db), collection="chunks")
    # One local client per folder and process: the server holds it; each collection is one index.
    indexes = dict(parse_index_option(f"{name}=qdrant+path:{db}?collection={name}") for name in ("hybrid", "chunks"))
    with running(create_app(tiny_sparse_model, device="cpu", indexes=indexes)) as client:
        yield client, root


def command_hits(capsys, *flags: str) -> list[list[dict]]:
    queries = [arg for query in QUERIES for arg in ("--query", query)]
    assert cli.main(["search", *flags, *queries, "--device", "cpu", "--top-k", "6"]) == 0
    return [json.loads(line)["hits"] for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize("index, flags, options", [
    ("hybrid", ("--index", "dense", "--hybrid", "sparse", "--rrf-k", "30", "--fusion-depth", "12"),
     {"rrf_k": 30, "depth": 12}),
    ("chunks", ("--index", "chunks", "--exact", "--show-text"), {"show_text": True}),
])
def test_search_route_over_qdrant_equals_the_search_command_over_the_folders(served, capsys, index, flags, options):
    client, root = served
    answer = client.post("/search", json={"index": index, "queries": QUERIES, "top_k": 6, **options})
    assert answer.status_code == 200, answer.text
    flags = tuple(str(root / f) if previous in ("--index", "--hybrid") else f
                  for previous, f in zip(("",) + flags, flags))
    for got, want in zip(answer.json()["results"], command_hits(capsys, *flags), strict=True):
        assert [h["id"] for h in got] == [h["id"] for h in want]
        assert all(abs(a["score"] - b["score"]) <= SCORE_TOLERANCE for a, b in zip(got, want))
        assert [(h.get("span"), h.get("text")) for h in got] == [(h.get("span"), h.get("text")) for h in want]


def test_search_route_over_qdrant_health_and_refusals(served):
    client, _ = served
    health = client.get("/health").json()
    assert health["indexes"]["hybrid"]["kinds"] == ["dense", "sparse"] and health["indexes"]["hybrid"]["count"] == 30
    for body, status in [({"index": "hybrid", "query": "x", "rrf_k": 1.5}, 422),
                         ({"index": "chunks", "query": "x", "rescore_multiplier": 2}, 422),
                         ({"index": "chunks", "query": "x", "field": "source"}, 422)]:
        assert client.post("/search", json=body).status_code == status, body


def test_search_route_over_a_qdrant_server_that_stops_answering_is_503(served, tiny_sparse_model, tmp_path,
                                                                       monkeypatch):
    """A collection on a server (here a local folder's client standing in for it) that does not answer a search:
    503 (it may answer later), not the 409 of a changed input."""
    from qdrant_client import QdrantClient
    from qdrant_client.http.exceptions import ResponseHandlingException

    from bertforge.retrieval import qdrant_collection as Q

    _, root = served
    export_folders([root / "dense"], str(tmp_path / "db"), collection="docs")
    monkeypatch.setattr(Q, "connect", lambda location: QdrantClient(path=str(tmp_path / "db")))
    indexes = {"remote": ["qdrant://127.0.0.1:6333/docs"]}
    with running(create_app(tiny_sparse_model, device="cpu", indexes=indexes)) as client:
        assert client.post("/search", json={"query": QUERIES[0], "top_k": 3}).status_code == 200

        def unanswered(*args, **kwargs):
            raise ResponseHandlingException(ConnectionRefusedError("connection refused"))

        monkeypatch.setattr(QdrantClient, "query_batch_points", unanswered)
        answer = client.post("/search", json={"query": QUERIES[0], "top_k": 3})
        assert answer.status_code == 503, answer.text
        assert "did not answer the search" in answer.json()["error"]
