"""Metadata fields and filters (`bertforge embed --field`, `search --filter`): every row's fields are stored in a
Parquet file beside its shard (typed, null where a record has none, a chunk's row holding its record's); a
filtered search is the search of the matching rows alone, built here by hand from the stored vectors and the
records' values (ids and scores), for exact, approximate (HNSW: still k hits when k rows match), sparse and hybrid
search; `bertforge add` appends metadata (and refuses another field set), `compact` keeps it; a bad filter is
one error naming the field and the fix, before any query is embedded."""

from __future__ import annotations

import csv
import datetime as dt
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bertforge import cli
from bertforge.errors import ConfigError, DataError, InputError
from bertforge.metrics.fusion import reciprocal_rank_fusion
from bertforge.retrieval import folder_growth as G
from bertforge.retrieval.embed_corpus import EmbedSettings, embed_corpus
from bertforge.retrieval.filters import Condition, parse_filter
from bertforge.retrieval.hybrid_search import folder_hits, hybrid_search_hits
from bertforge.retrieval.searcher import Searcher
from bertforge.retrieval.store import VectorFolder
from bertforge.retrieval.vector_search import embed_queries, embed_sparse_queries

pytest.importorskip("pyarrow")
faiss = pytest.importorskip("faiss")

WORDS = "apple river stone music light cloud paper green window table bread glass".split()
QUERIES = ["apple river stone", "music cloud green window", "bread glass table"]
SOURCES = ("wiki", "news", "blog")
FIELDS = ["source", "year:int", "published:date", "rating:float", "draft:bool"]


def text(seed: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, int(rng.integers(3, 9))))


def record(i: int, prefix: str = "r", seed: int = 0) -> dict:
    """A record whose every 7th lacks its source and every 5th its rating."""
    found = {"id": f"{prefix}{i}", "text": text(seed + i), "year": 2015 + i % 10,
             "published": f"{2018 + i % 6}-0{1 + i % 9}-1{i % 10}", "draft": i % 4 == 0}
    if i % 7:
        found["source"] = SOURCES[i % 3]
    if i % 5:
        found["rating"] = i / 8
    return found


RECORDS = [record(i) for i in range(40)]


def jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# filter (command-line clauses or the JSON form) -> the records it keeps, by hand
CASES = {
    "equality": (["source=wiki"], lambda r: r.get("source") == "wiki"),
    "range and set": (["year>=2020", "source in news,blog"],
                      lambda r: r["year"] >= 2020 and r.get("source") in ("news", "blog")),
    "json dates, not equal": ({"published": {"lt": "2021-06-01"}, "source": {"ne": "wiki"}},
                              lambda r: r["published"] < "2021-06-01" and r.get("source") != "wiki"),
    "not in, float, bool": (['source not in ["wiki"]', "rating<=3.5", "draft=false"],
                            lambda r: r.get("source") != "wiki" and r.get("rating") is not None
                            and r["rating"] <= 3.5 and not r["draft"]),
}


@pytest.fixture(scope="module")
def folders(tiny_minilm_model, tiny_sparse_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("filters")
    corpus = jsonl(root / "corpus.jsonl", RECORDS)
    dense, sparse = root / "dense", root / "sparse"
    embed_corpus(tiny_minilm_model, corpus, dense, EmbedSettings(normalize=True), shard_size=8, device="cpu",
                 fields=FIELDS)
    embed_corpus(tiny_sparse_model, corpus, sparse, EmbedSettings(sparse=True), shard_size=8, device="cpu",
                 fields=FIELDS)
    from bertforge.retrieval.vector_ann import build_ann

    build_ann(dense, m=4, ef_construction=16, ef_search=4)  # a small graph: the walk must honour the filter
    return {"dense": dense, "sparse": sparse, "corpus": corpus}


def by_hand_dense(folder: Path, keep, k: int) -> list[list[tuple[str, float]]]:
    """Each query's top-k (id, score) among the records `keep` holds, from the stored vectors."""
    index = VectorFolder(folder)
    vectors = np.concatenate([np.asarray(index.shard_vectors(s)) for s in range(len(index.shards))])
    from bertforge.retrieval.vector_index import VectorIndex

    queries = embed_queries(VectorIndex(folder), QUERIES, device="cpu")
    rows = [row for row, r in enumerate(RECORDS) if keep(r)]
    found = []
    for scores in queries @ vectors[rows].T:
        order = sorted(range(len(rows)), key=lambda i: (-scores[i], rows[i]))[:k]
        found.append([(RECORDS[rows[i]]["id"], float(scores[i])) for i in order])
    return found


def by_hand_sparse(folder: Path, keep, k: int) -> list[list[tuple[str, float]]]:
    index = VectorFolder(folder)
    documents = np.zeros((index.count, index.dim), np.float64)
    for shard in range(len(index.shards)):
        part, first = index.shard_rows(shard), int(index.offsets[shard])
        for row in range(len(part)):
            terms, weights = part.row(row)
            documents[first + row, terms] = weights
    queries = embed_sparse_queries(index, QUERIES, device="cpu")
    dense_queries = np.zeros((len(queries), index.dim), np.float64)
    for q in range(len(queries)):
        terms, weights = queries.row(q)
        dense_queries[q, terms] = weights
    rows = [row for row, r in enumerate(RECORDS) if keep(r)]
    found = []
    for scores in dense_queries @ documents[rows].T:
        order = sorted((i for i in range(len(rows)) if scores[i] > 0), key=lambda i: (-scores[i], rows[i]))[:k]
        found.append([(RECORDS[rows[i]]["id"], float(scores[i])) for i in order])
    return found


def pairs(hits: list[list[dict]]) -> list[list[tuple[str, float]]]:
    return [[(hit["id"], hit["score"]) for hit in query] for query in hits]


def assert_same(got: list[list[tuple[str, float]]], want: list[list[tuple[str, float]]], atol: float = 1e-6,
                rtol: float = 0) -> None:
    for got_hits, want_hits in zip(got, want, strict=True):
        assert [i for i, _ in got_hits] == [i for i, _ in want_hits]
        np.testing.assert_allclose([s for _, s in got_hits], [s for _, s in want_hits], atol=atol, rtol=rtol)


def test_filters_metadata_is_stored_typed_per_row_with_nulls(folders):
    folder = VectorFolder(folders["dense"])
    assert [str(spec) for spec in folder.fields] == ["source:string", "year:int", "published:date",
                                                     "rating:float", "draft:bool"]
    assert all("fields" in shard["sha256"] and shard["fields"].endswith(".parquet") for shard in folder.shards)
    rows = folder.metadata().to_pylist()
    assert len(rows) == len(RECORDS)
    for stored, given in zip(rows, RECORDS):
        assert stored == {"source": given.get("source"), "year": given["year"],
                          "published": dt.date.fromisoformat(given["published"]), "rating": given.get("rating"),
                          "draft": given["draft"]}


@pytest.mark.parametrize("case", CASES)
def test_filters_exact_search_equals_exact_search_over_the_subset(folders, case):
    given, keep = CASES[case]
    matching = sum(map(keep, RECORDS))
    assert 3 <= matching < len(RECORDS)
    hits = folder_hits(folders["dense"], QUERIES, top_k=10, device="cpu", exact=True, filter=given)
    assert all(len(query) == min(10, matching) for query in hits)  # the top-k of the subset, never fewer
    assert_same(pairs(hits), by_hand_dense(folders["dense"], keep, 10))


@pytest.mark.parametrize("case", CASES)
def test_filters_approximate_search_returns_the_top_k_of_the_subset(folders, case):
    given, keep = CASES[case]
    want = by_hand_dense(folders["dense"], keep, 5)
    hits = folder_hits(folders["dense"], QUERIES, top_k=5, device="cpu", ef_search=64, filter=given)
    assert all(len(query) == 5 for query in hits)  # k rows match: k hits, the walk skipping the others
    assert_same(pairs(hits), want)
    few = folder_hits(folders["dense"], QUERIES, top_k=10, device="cpu", filter={"year": 2015, "draft": True})
    assert [[hit["id"] for hit in query] for query in few] == [
        [i for i, _ in query] for query in by_hand_dense(folders["dense"], lambda r: r["year"] == 2015
                                                         and r["draft"], 10)]


@pytest.mark.parametrize("case", CASES)
def test_filters_sparse_search_equals_brute_force_over_the_subset(folders, case):
    given, keep = CASES[case]
    hits = folder_hits(folders["sparse"], QUERIES, top_k=8, device="cpu", filter=given)
    # float32 sums of weights in the hundreds against float64 by hand: within a few float32 steps
    assert_same(pairs(hits), by_hand_sparse(folders["sparse"], keep, 8), atol=0, rtol=4e-6)


@pytest.mark.parametrize("case", CASES)
def test_filters_hybrid_search_fuses_the_subset_on_both_sides(folders, case):
    given, keep = CASES[case]
    depth = 6
    dense = by_hand_dense(folders["dense"], keep, depth)
    sparse = by_hand_sparse(folders["sparse"], keep, depth)
    hits = hybrid_search_hits(folders["dense"], folders["sparse"], QUERIES, top_k=5, depth=depth, device="cpu",
                              filter=given)
    for query_hits, dense_ids, sparse_ids in zip(hits, dense, sparse):
        want = reciprocal_rank_fusion([[i for i, _ in dense_ids], [i for i, _ in sparse_ids]], 60,
                                      top=min(5, sum(map(keep, RECORDS))))
        assert [hit["id"] for hit in query_hits] == [i for i, _ in want]
        np.testing.assert_allclose([hit["score"] for hit in query_hits], [s for _, s in want], atol=1e-12)


def test_filters_bad_filters_are_one_error_naming_the_field_and_the_fix(folders, tiny_minilm_model, tmp_path):
    searcher = Searcher(folders["dense"], exact=True)
    refused = {
        "colour=red": "no field 'colour'; the index's fields: source:string, year:int",
        "year>=soon": "field 'year' (int): 'soon' is not a 64-bit integer",
        "source>wiki": "a range (gt) applies to int, float, date, datetime fields",
        "published=2024-13-01": "is not an ISO date",
        "year": "is not a condition; write FIELD=VALUE",
        '{"year": [2020]}': 'a list is a set: write {"year": {"in": [2020]}}',
        '{"year": {"between": 1}}': "unknown operator 'between'",
    }
    for given, message in refused.items():
        with pytest.raises(InputError, match="^filter: ") as caught:
            searcher.check_filter([given])
        assert message in str(caught.value), given
    plain = tmp_path / "plain"
    embed_corpus(tiny_minilm_model, folders["corpus"], plain, shard_size=50, device="cpu")
    with pytest.raises(InputError, match="stores no metadata fields; embed with --field"):
        folder_hits(plain, QUERIES, device="cpu", filter=["source=wiki"], model="/no/model/needed")


def test_filters_cli_refuses_a_bad_filter_in_one_line(folders, capsys):
    code = cli.main(["search", "--index", str(folders["dense"]), "--query", "x", "--filter", "colour=red",
                     "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "no field 'colour'" in err and "source:string" in err and "Traceback" not in err
    assert cli.main(["search", "--index", str(folders["dense"]), "--query", QUERIES[0], "--filter", "source=wiki",
                     "--filter", "year>=2020", "--exact", "--device", "cpu"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert [hit["id"] for hit in hits] == [i for i, _ in by_hand_dense(
        folders["dense"], lambda r: r.get("source") == "wiki" and r["year"] >= 2020, 10)[0]]


def test_filters_filter_round_trips_through_its_json_form(folders):
    fields = VectorFolder(folders["dense"]).fields
    checked = parse_filter(["year>=2020", "source in wiki,news", "published<2021-01-02", "rating!=0.5"], fields)
    assert checked.conditions == (Condition("year", "gte", 2020), Condition("source", "in", ("wiki", "news")),
                                  Condition("published", "lt", dt.date(2021, 1, 2)), Condition("rating", "ne", 0.5))
    assert parse_filter(checked.describe(), fields) == checked
    assert parse_filter(json.dumps(checked.describe()), fields) == checked


def test_filters_chunked_rows_hold_their_records_fields(tiny_minilm_model, tmp_path):
    records = [{"id": f"c{i}", "text": " ".join([text(i)] * 6), "topic": f"t{i % 2}"} for i in range(5)]
    out = tmp_path / "chunks"
    embed_corpus(tiny_minilm_model, jsonl(tmp_path / "c.jsonl", records), out,
                 EmbedSettings(normalize=True, chunk=8, chunk_overlap=2), shard_size=2, device="cpu",
                 fields=["topic"])
    folder = VectorFolder(out)
    ids = [ident for shard in range(len(folder.shards)) for ident in folder.shard_lines(shard, "ids")]
    assert len(ids) > len(records)  # several chunks a record
    topics = folder.metadata().column("topic").to_pylist()
    assert topics == [f"t{int(ident[1:]) % 2}" for ident in ids]
    hits = folder_hits(out, QUERIES, top_k=50, device="cpu", filter="topic=t1")
    assert {hit["id"] for query in hits for hit in query} == {"c1", "c3"}


def test_filters_tables_read_fields_by_type_and_refuse_bad_values(tiny_minilm_model, tmp_path):
    table = tmp_path / "t.csv"
    with open(table, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerows([["id", "text", "year", "live"], ["a", "apple river", "2020", "true"],
                          ["b", "bread glass", "", "0"], ["c", "music cloud", "2022", ""]])
    out = tmp_path / "csv"
    embed_corpus(tiny_minilm_model, table, out, shard_size=2, device="cpu", fields=["year:int", "live:bool"])
    assert VectorFolder(out).metadata().to_pylist() == [{"year": 2020, "live": True}, {"year": None, "live": False},
                                                        {"year": 2022, "live": None}]
    with pytest.raises(ConfigError, match=r"--field \['year:int', 'live:bool'\] -> \['year:string'\]"):
        embed_corpus(tiny_minilm_model, table, out, shard_size=2, device="cpu", fields=["year"])  # a resume
    with pytest.raises(DataError, match=r"t.csv:2: the header has no column 'yaer' \(columns: id, text, year, "
                                        r"live\); name one with --field NAME$"):
        embed_corpus(tiny_minilm_model, table, tmp_path / "typo", device="cpu", fields=["yaer:int"])
    with pytest.raises(DataError, match=r"t.csv:3: field 'live' \(int\): '0'|t.csv:2: field 'live' \(int\): "
                                        r"'true' is not a 64-bit integer"):
        embed_corpus(tiny_minilm_model, table, tmp_path / "bad", device="cpu", fields=["live:int"])
    with pytest.raises(ConfigError, match="type 'number' is not one of string, int"):
        embed_corpus(tiny_minilm_model, table, tmp_path / "type", device="cpu", fields=["year:number"])


def test_filters_add_appends_metadata_and_compact_keeps_it(folders, tiny_minilm_model, tmp_path):
    grown = tmp_path / "grown"
    shutil.copytree(folders["dense"], grown)
    added = [record(i, "n", seed=300) for i in range(9)] + [{**record(100, "r", seed=700), "id": "r3"}]
    G.add_records(grown, jsonl(tmp_path / "added.jsonl", added), device="cpu")
    G.delete_records(grown, ["r5", "n2"])
    final = {r["id"]: r for r in RECORDS + added if r["id"] not in ("r5", "n2")}
    scratch = tmp_path / "scratch"
    embed_corpus(tiny_minilm_model, jsonl(tmp_path / "final.jsonl", list(final.values())), scratch,
                 EmbedSettings(normalize=True), shard_size=8, device="cpu", fields=FIELDS)
    given = {"source": {"in": ["news", "wiki"]}, "year": {"gte": 2017}}
    want = folder_hits(scratch, QUERIES, top_k=6, device="cpu", exact=True, filter=given)
    for compacted in (False, True):
        folder = VectorFolder(grown)
        ids = [i for s in range(len(folder.shards)) for i in folder.shard_lines(s, "ids")]
        live = folder.live if folder.live is not None else np.ones(folder.count, bool)
        years = folder.metadata().column("year").to_pylist()
        assert {ids[row]: years[row] for row in range(folder.count) if live[row]} == {
            ident: r["year"] for ident, r in final.items()}
        assert_same(pairs(folder_hits(grown, QUERIES, top_k=6, device="cpu", exact=True, filter=given)),
                    pairs(want))
        assert_same(pairs(folder_hits(grown, QUERIES, top_k=6, device="cpu", ef_search=64, filter=given)),
                    pairs(want))
        if not compacted:
            assert G.compact_folder(grown)["dropped"] == 3
    before = (grown / "manifest.json").read_bytes()
    with pytest.raises(ConfigError, match=r"stores the metadata fields \[source:string, year:int, .*\], this "
                                          r"addition names \[source:string\]"):
        G.add_records(grown, tmp_path / "added.jsonl", device="cpu", fields=["source"])
    lacking = tmp_path / "lacking.csv"
    lacking.write_text("id,text,source\nz1,apple,wiki\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"lacking.csv:2: the header has no column 'year'"):
        G.add_records(grown, lacking, device="cpu", settings={"file_format": "csv"})
    assert (grown / "manifest.json").read_bytes() == before


def test_filters_metadata_file_is_checked_like_every_shard_file(folders, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(folders["dense"], copy)
    name = VectorFolder(copy).shards[1]["fields"]
    other = (copy / VectorFolder(copy).shards[2]["fields"]).read_bytes()
    own = (copy / name).read_bytes()
    (copy / name).write_bytes(other[:len(own)].ljust(len(own), b"\0"))  # same size, other bytes
    with pytest.raises(ConfigError, match=rf"{name}: .*rerun the same `bertforge embed`"):
        VectorFolder(copy).metadata()
    with pytest.raises(ConfigError, match=rf"{name}: .*rerun the same `bertforge embed`"):
        folder_hits(copy, QUERIES, device="cpu", exact=True, filter="year=2020")
