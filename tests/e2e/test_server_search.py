"""`POST /search` on a real server (loopback port, httpx) answers what `bertforge search` answers: the same ids,
scores within 1e-6 (the queries are embedded in other batches), ranks, spans and texts, for a dense, a sparse, a
hybrid and a chunked index; behind the same keys, limits and metrics as every route; `serve --index` parsed and
the model an index needs served beside it.

One tiny random masked-LM directory (MiniLM's vocabulary) embeds both kinds: dense (mean pooling) and sparse
(SPLADE), so a single served model answers every index.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tests.e2e.test_server import running  # noqa: E402

from bertforge import cli  # noqa: E402
from bertforge.errors import ConfigError  # noqa: E402
from bertforge.retrieval import embed_corpus as E  # noqa: E402
from bertforge.serving.app import create_app  # noqa: E402
from bertforge.serving.search_routes import load_index_models, open_indexes, parse_index_option  # noqa: E402

KEY = "search-key-0123456789"
SCORE_TOLERANCE = 1e-6
TOPICS = ("the river floods the old market in spring", "a quiet train station at dawn", "fresh bread and warm coffee",
          "rain on the garden window", "a long walk through the city at night", "the harbour fish sold at noon",
          "music from an open window in summer", "an old book found on a shelf")
QUERIES = ["where is the market by the river?", "coffee and bread in the morning", "music at night"]


@pytest.fixture(scope="module")
def folders(tiny_sparse_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("search")
    corpus = root / "corpus.jsonl"
    records = [{"id": f"doc-{i}", "text": f"{TOPICS[i % len(TOPICS)]}, number {i}. " * (1 + i % 3),
                "source": f"s{i % 4}"} for i in range(30)]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    made = {"dense": E.EmbedSettings(pooling="mean", normalize=True), "sparse": E.EmbedSettings(sparse=True),
            "chunks": E.EmbedSettings(pooling="mean", normalize=True, chunk=12, chunk_overlap=4)}
    for name, settings in made.items():
        E.embed_corpus(tiny_sparse_model, corpus, root / name, settings, device="cpu", shard_size=7)
    return root


@pytest.fixture(scope="module")
def server(tiny_sparse_model, folders):
    indexes = {"dense": [folders / "dense"], "sparse": [folders / "sparse"], "chunks": [folders / "chunks"],
               "hybrid": [folders / "sparse", folders / "dense"]}  # either order: kinds come from the manifests
    with running(create_app(tiny_sparse_model, device="cpu", indexes=indexes, api_keys=(KEY,))) as client:
        client.headers["Authorization"] = f"Bearer {KEY}"
        yield client


def command_hits(capsys, *flags: str) -> list[list[dict]]:
    """What `bertforge search` prints for QUERIES, per query."""
    queries = [arg for query in QUERIES for arg in ("--query", query)]
    assert cli.main(["search", *flags, *queries, "--device", "cpu"]) == 0
    return [json.loads(line)["hits"] for line in capsys.readouterr().out.splitlines()]


def assert_same_hits(served: list[list[dict]], command: list[list[dict]]) -> None:
    assert len(served) == len(command) == len(QUERIES)
    for ours, theirs in zip(served, command):
        assert [h["id"] for h in ours] == [h["id"] for h in theirs]
        assert max(abs(a["score"] - b["score"]) for a, b in zip(ours, theirs)) <= SCORE_TOLERANCE
        rest = [{k: v for k, v in h.items() if k != "score"} for h in ours]
        assert rest == [{k: v for k, v in h.items() if k != "score"} for h in theirs]  # ranks, spans, texts


@pytest.mark.parametrize("index, flags", [
    ("dense", ("--index", "dense", "--show-text")),
    ("sparse", ("--index", "sparse", "--field", "source")),
    ("hybrid", ("--index", "dense", "--hybrid", "sparse", "--rrf-k", "30", "--fusion-depth", "12")),
    ("chunks", ("--index", "chunks", "--show-text")),
])
def test_search_route_equals_the_search_command(server, folders, capsys, index, flags):
    flags = tuple(str(folders / f) if previous in ("--index", "--hybrid") else f
                  for previous, f in zip(("",) + flags, flags))
    options = {"show_text": "--show-text" in flags, "field": "source" if "--field" in flags else None}
    if index == "hybrid":
        options.update(rrf_k=30, depth=12)
    answer = server.post("/search", json={"index": index, "queries": QUERIES, "top_k": 6, **options})
    assert answer.status_code == 200, answer.text
    assert answer.json()["index"] == index
    assert_same_hits(answer.json()["results"], command_hits(capsys, *flags, "--top-k", "6"))
    if index == "chunks":
        assert all(len(hit["span"]) == 2 and hit["text"] for hits in answer.json()["results"] for hit in hits)
    if index == "hybrid":
        assert all({"dense_rank", "sparse_rank"} <= set(hit) for hit in answer.json()["results"][0])


def test_search_route_one_query_and_its_refusals(server):
    one = server.post("/search", json={"index": "dense", "query": QUERIES[0], "top_k": 3})
    assert one.status_code == 200 and len(one.json()["results"]) == 1 and len(one.json()["results"][0]) == 3
    refusals = {
        "index": ({"query": "x"}, 422),  # several indexes served: name one
        "not served": ({"index": "nope", "query": "x"}, 404),
        "both": ({"index": "dense", "query": "x", "queries": ["y"]}, 422),
        "neither": ({"index": "dense"}, 422),
        "top_k": ({"index": "dense", "query": "x", "top_k": 0}, 422),
        "blank": ({"index": "dense", "queries": ["  "]}, 422),
        "unknown": ({"index": "dense", "query": "x", "colour": "red"}, 422),
        "ef_search": ({"index": "dense", "query": "x", "ef_search": 64}, 422),  # no approximate index here
        "rescore": ({"index": "hybrid", "query": "x", "rescore_multiplier": 2}, 422),
        "field": ({"index": "dense", "query": "x", "field": "colour"}, 422),
        "prompt": ({"index": "dense", "query": "x", "prompt_name": "query"}, 422),
    }
    for name, (body, status) in refusals.items():
        answer = server.post("/search", json=body)
        assert answer.status_code == status, (name, answer.text)
        assert "error" in answer.json(), name
    assert server.post("/search", json={"index": "dense", "query": "x"}, headers={"Authorization": ""}
                       ).status_code == 401
    metrics = server.get("/metrics").text
    assert 'route="/search",status="200"' in metrics and 'route="/search",status="404"' in metrics
    health = server.get("/health").json()
    assert health["indexes"]["hybrid"]["kinds"] == ["dense", "sparse"] and health["indexes"]["dense"]["count"] == 30
    schema = server.get("/openapi.json").json()
    assert "/search" in schema["paths"] and set(schema["components"]["schemas"]["SearchRequest"]["properties"]) >= {
        "index", "query", "queries", "top_k", "show_text", "rrf_k"}


def test_serve_index_option_parses_names_and_pairs():
    assert parse_index_option("docs=vecs/") == ("docs", ["vecs/"])
    assert parse_index_option("docs=dense/,sparse/") == ("docs", ["dense/", "sparse/"])
    for bad in ("vecs/", "=vecs/", "docs=", "bad name=vecs/"):
        with pytest.raises(ConfigError, match="--index"):
            parse_index_option(bad)


def test_serve_command_hands_every_index_to_the_server(monkeypatch):
    from bertforge.serving import app

    seen = {}
    monkeypatch.setattr(app, "serve", lambda model, **options: seen.update(model=model, **options))
    argv = ["serve", "--model", "m", "--index", "docs=a,b", "--index", "more=c", "--index", "more=d"]
    assert cli.main(argv) == 0
    assert seen["model"] == "m" and seen["indexes"] == {"docs": ["a", "b"], "more": ["c", "d"]}


def test_serve_index_loads_the_model_that_made_it(tiny_sparse_model, tiny_minilm_model, folders, tmp_path):
    searchers = open_indexes({"docs": [folders / "dense"]})
    served = load_index_models(searchers, {"other": str(tiny_minilm_model)})
    assert served == {"other": str(tiny_minilm_model), "model": str(tiny_sparse_model.resolve())}
    assert load_index_models(searchers, {"mine": tiny_sparse_model}) == {"mine": tiny_sparse_model}
    with pytest.raises(ConfigError, match="index docs: two dense folders"):
        open_indexes({"docs": [folders / "dense", folders / "chunks"]})
    with pytest.raises(ConfigError, match="index docs: .*no manifest.json"):
        open_indexes({"docs": [tmp_path]})
