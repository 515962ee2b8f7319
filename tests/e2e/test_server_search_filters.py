"""`POST /search` with a "filter" on a served index's metadata fields (`bertforge embed --field`) answers what
`bertforge search --filter` answers (a real server on a loopback port, httpx): the same ids and scores within
1e-6, for a dense index through its approximate index, a sparse one and a hybrid pair; a bad filter is a 422
naming the field, before any query is embedded; /openapi.json describes the filter, and schemathesis' requests
of /search (valid and invalid) never get a 5xx and are answered as the document says.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("pyarrow")
pytest.importorskip("faiss")

from tests.e2e.test_server import running  # noqa: E402
from tests.e2e.test_server_search import QUERIES, TOPICS, assert_same_hits, command_hits  # noqa: E402

from bertforge.retrieval import embed_corpus as E  # noqa: E402
from bertforge.serving.app import create_app  # noqa: E402

FIELDS = ["source", "year:int", "published:date"]


@pytest.fixture(scope="module")
def folders(tiny_sparse_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("filtered")
    corpus = root / "corpus.jsonl"
    records = [{"id": f"doc-{i}", "text": f"{TOPICS[i % len(TOPICS)]}, number {i}.", "year": 2010 + i % 12,
                "published": f"20{10 + i % 12}-0{1 + i % 9}-15", **({"source": f"s{i % 3}"} if i % 5 else {})}
               for i in range(36)]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    for name, settings in {"dense": E.EmbedSettings(pooling="mean", normalize=True),
                           "sparse": E.EmbedSettings(sparse=True)}.items():
        E.embed_corpus(tiny_sparse_model, corpus, root / name, settings, device="cpu", shard_size=7, fields=FIELDS)
    from bertforge.retrieval.vector_ann import build_ann

    build_ann(root / "dense", m=4, ef_construction=16, ef_search=8)
    return root


@pytest.fixture(scope="module")
def server(tiny_sparse_model, folders):
    indexes = {"dense": [folders / "dense"], "sparse": [folders / "sparse"],
               "hybrid": [folders / "dense", folders / "sparse"]}
    with running(create_app(tiny_sparse_model, device="cpu", indexes=indexes)) as client:  # no key: fuzzed too
        yield client


FILTERS = [
    ({"source": "s1", "year": {"gte": 2014}}, ("--filter", "source=s1", "--filter", "year>=2014")),
    ({"source": {"not_in": ["s0"]}, "published": {"lt": "2018-01-01"}},
     ("--filter", "source not in s0", "--filter", "published<2018-01-01")),
]


@pytest.mark.parametrize("index, flags", [
    ("dense", ("--index", "dense", "--ef-search", "16")),
    ("sparse", ("--index", "sparse")),
    ("hybrid", ("--index", "dense", "--hybrid", "sparse", "--fusion-depth", "8")),
])
@pytest.mark.parametrize("case", range(len(FILTERS)))
def test_search_filters_route_equals_the_search_command(server, folders, capsys, index, flags, case):
    body, clauses = FILTERS[case]
    flags = tuple(str(folders / f) if previous in ("--index", "--hybrid") else f
                  for previous, f in zip(("",) + flags, flags))
    options = {"ef_search": 16} if index == "dense" else {"depth": 8} if index == "hybrid" else {}
    answer = server.post("/search", json={"index": index, "queries": QUERIES, "top_k": 5, "filter": body,
                                          **options})
    assert answer.status_code == 200, answer.text
    served = answer.json()["results"]
    assert_same_hits(served, command_hits(capsys, *flags, *clauses, "--top-k", "5"))
    assert all(len(hits) == 5 for hits in served)  # at least 5 records match: 5 hits
    unfiltered = server.post("/search", json={"index": index, "queries": QUERIES, "top_k": 5, **options}).json()
    assert unfiltered["results"] != served


def test_search_filters_bad_filter_is_a_422_naming_the_field(server):
    refusals = {
        "unknown field": ({"colour": "red"}, "no field 'colour'; the index's fields: source:string, year:int, "
                                             "published:date"),
        "bad value": ({"year": {"gte": "soon"}}, "field 'year' (int): 'soon' is not a 64-bit integer"),
        "range on a string": ({"source": {"lt": "s2"}}, "a range (lt) applies to int, float, date, datetime"),
        "bad date": ({"published": "yesterday"}, "is not an ISO date"),
        "unknown operator": ({"year": {"between": [1, 2]}}, "unknown field 'filter.year.between'"),
        "empty set": ({"source": {"in": []}}, "filter.source.in: the list is empty"),
        "a list": ({"source": ["s1"]}, "filter"),
        "not an object": ("source=s1", "filter"),
    }
    for name, (given, message) in refusals.items():
        answer = server.post("/search", json={"index": "hybrid", "query": "x", "filter": given})
        assert answer.status_code == 422, (name, answer.text)
        assert message in answer.json()["error"], (name, answer.json())
    schema = server.get("/openapi.json").json()
    request = schema["components"]["schemas"]["SearchRequest"]["properties"]["filter"]
    assert "year" in request["description"] and "FieldConditions" in json.dumps(request)
    assert set(schema["components"]["schemas"]["FieldConditions"]["properties"]) == {
        "eq", "ne", "in", "not_in", "gt", "gte", "lt", "lte"}


def test_search_filters_schemathesis_no_5xx_and_answers_match_the_schema(server):
    schemathesis = pytest.importorskip("schemathesis")
    from tests.e2e.test_server_fuzz import ANSWER_CHECKS, fuzz

    base = str(server.base_url).rstrip("/")
    schema = schemathesis.openapi.from_dict(server.get("/openapi.json").json())
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path != "/search":
            continue
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            fuzz(operation.as_strategy(generation_mode=mode), f"/search [{mode.value}]", base, statuses, failures,
                 ANSWER_CHECKS)
    assert sum(statuses.values()) >= 6
    assert not [s for s in statuses if s >= 500], statuses
    assert not failures, "\n".join(failures[:20])
