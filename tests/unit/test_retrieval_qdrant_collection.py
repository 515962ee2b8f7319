"""A vector folder exported into a Qdrant collection (qdrant-client's local mode: the same client code as a server
URL) and searched there answers what our search answers: dense exact top-10 the same ids with scores within 1e-5
(cosine and dot, chunked spans included), sparse the same (relative 1e-5: its dot products reach the thousands), hybrid through Qdrant's fusion the same fused ids and
scores (its k is ours + 1: it counts ranks from 0); deleted rows are not exported and a re-export writes the same
points; an unreachable server, another layout, another model's collection or one bertforge did not write are one
clear error each. Tiny random models with MiniLM's vocabulary."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("qdrant_client")

from qdrant_client import QdrantClient, models  # noqa: E402

from bertforge import cli  # noqa: E402
from bertforge.errors import ConfigError, InputError  # noqa: E402
from bertforge.retrieval import embed_corpus as E  # noqa: E402
from bertforge.retrieval import qdrant_collection as Q  # noqa: E402
from bertforge.retrieval import qdrant_locations as L  # noqa: E402
from bertforge.retrieval.folder_growth import delete_records  # noqa: E402
from bertforge.retrieval.hybrid_search import collection_hits, folder_hits, hybrid_search_hits  # noqa: E402

SCORE_TOLERANCE = 1e-5
WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex bad jumping frogs near "
         "old rivers and green hills under the pale winter moon").split()
QUERIES = ["the lazy dog", "green hills under the moon", "seven wizards", "old rivers near frogs"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng = np.random.default_rng(3)
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    records = [{"id": f"doc-{i}", "text": f"{i} " + " ".join(rng.choice(WORDS, size=int(rng.integers(4, 30))))}
               for i in range(40)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def folders(tiny_sparse_model, corpus, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("folders")
    made = {"dense": E.EmbedSettings(pooling="mean", normalize=True), "sparse": E.EmbedSettings(sparse=True),
            "dot": E.EmbedSettings(pooling="mean", normalize=False, chunk=8, chunk_overlap=2)}
    for name, settings in made.items():
        E.embed_corpus(tiny_sparse_model, corpus, root / name, settings, device="cpu", shard_size=9)
    return root


def local(path: Path, collection: str, vectors: str | None = None) -> str:
    return f"qdrant+path:{path}?collection={collection}" + (f"&vectors={vectors}" if vectors else "")


def assert_same_hits(theirs: list[list[dict]], ours: list[list[dict]], keys=("id", "span", "text")) -> None:
    assert len(theirs) == len(ours) == len(QUERIES)
    for got, want in zip(theirs, ours):
        assert [h["id"] for h in got] == [h["id"] for h in want]
        # relative for sparse dot products in the thousands (float32 sums in another order)
        assert all(abs(a["score"] - b["score"]) <= SCORE_TOLERANCE * max(1.0, abs(b["score"]))
                   for a, b in zip(got, want))
        assert [{k: h[k] for k in keys if k in h} for h in got] == [{k: h[k] for k in keys if k in h} for h in want]


@pytest.mark.parametrize("name", ["dense", "dot", "sparse"])
def test_qdrant_collection_top_10_equals_our_exact_search(folders, tmp_path, name):
    done = Q.export_folders([folders / name], str(tmp_path / "db"), collection=name, batch_size=7)
    assert done["points"] == {"dense": 40, "sparse": 40}.get(name, done["points"]) and done["removed"] == 0
    theirs = collection_hits(local(tmp_path / "db", name), QUERIES, top_k=10, show_text=True, device="cpu")
    ours = folder_hits(folders / name, QUERIES, top_k=10, exact=True, show_text=True, device="cpu")
    assert_same_hits(theirs, ours)
    if name == "dot":  # chunked, unnormalized: Qdrant's Dot metric, the spans and the chunks' own texts
        assert done["points"] > 40 and all(len(h["span"]) == 2 for hits in theirs for h in hits)
        client = QdrantClient(path=str(tmp_path / "db"))
        assert client.get_collection(name).config.params.vectors["dense"].distance == models.Distance.DOT
        client.close()


def test_qdrant_hybrid_fuses_as_ours_with_its_k_one_more(folders, tmp_path):
    where = str(tmp_path / "db")
    Q.export_folders([folders / "sparse", folders / "dense"], where, collection="both")  # either order
    theirs = collection_hits(local(tmp_path / "db", "both"), QUERIES, top_k=5, rrf_k=60, depth=12, device="cpu")
    ours = hybrid_search_hits(folders / "dense", folders / "sparse", QUERIES, top_k=5, rrf_k=60, depth=12,
                              device="cpu")
    assert_same_hits(theirs, ours, keys=("id",))  # the same fused ids and scores (no ranks: Qdrant keeps none)
    dense_only = collection_hits(local(tmp_path / "db", "both", "dense"), QUERIES, device="cpu")
    assert_same_hits(dense_only, folder_hits(folders / "dense", QUERIES, exact=True, device="cpu"))
    with pytest.raises(InputError, match="whole number"):
        collection_hits(local(tmp_path / "db", "both"), QUERIES, rrf_k=60.5, device="cpu")


def scroll_all(where: Path, collection: str) -> dict:
    client = QdrantClient(path=str(where))
    points, _ = client.scroll(collection, limit=10_000, with_payload=True, with_vectors=True)
    client.close()
    return {p.id: (p.payload, {k: np.asarray(v.values if hasattr(v, "values") else v).tolist()
                               for k, v in p.vector.items()}) for p in points}


def test_qdrant_export_skips_deleted_rows_and_reruns_to_the_same_points(folders, tmp_path):
    import shutil

    dense = tmp_path / "dense"
    shutil.copytree(folders / "dense", dense)
    where = tmp_path / "db"
    Q.export_folders([dense], str(where), collection="docs")
    first = scroll_all(where, "docs")
    again = Q.export_folders([dense], str(where), collection="docs")
    assert again == {"collection": "docs", "where": str(where), "points": 40, "removed": 0}
    assert scroll_all(where, "docs") == first  # idempotent: the same ids, payloads and vectors
    delete_records(dense, ["doc-3", "doc-17"])
    done = Q.export_folders([dense], str(where), collection="docs")
    assert (done["points"], done["removed"]) == (38, 2)
    held = scroll_all(where, "docs")
    assert len(held) == 38 and {"doc-3", "doc-17"}.isdisjoint(p["id"] for p, _ in held.values())
    theirs = collection_hits(local(where, "docs"), QUERIES, top_k=40, device="cpu")
    assert_same_hits(theirs, folder_hits(dense, QUERIES, top_k=40, exact=True, device="cpu"))
    assert all(len(hits) == 38 for hits in theirs)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_qdrant_bad_server_layout_or_collection_is_one_clear_error(folders, tmp_path):
    with pytest.raises(ConfigError, match="cannot be used.*start the server"):
        Q.export_folders([folders / "dense"], f"http://127.0.0.1:{free_port()}", collection="docs")
    with pytest.raises(ConfigError, match="cannot be used"):
        collection_hits(f"qdrant://127.0.0.1:{free_port()}/docs", QUERIES, device="cpu")
    where = tmp_path / "db"
    client = QdrantClient(path=str(where))
    client.create_collection("other", vectors_config={"dense": models.VectorParams(size=7,
                                                                                   distance=models.Distance.COSINE)})
    client.create_collection("foreign", vectors_config={"dense": models.VectorParams(size=32,
                                                                                     distance=models.Distance.COSINE)})
    client.close()
    with pytest.raises(ConfigError, match=r"holds vectors dense: 7 dims Cosine, these folders dense: 32 dims Cosine"):
        Q.export_folders([folders / "dense"], str(where), collection="other")
    with pytest.raises(ConfigError, match="was not written by `bertforge export-index`"):
        collection_hits(local(where, "foreign"), QUERIES, device="cpu")
    with pytest.raises(ConfigError, match="no collection missing at"):
        collection_hits(local(where, "missing"), QUERIES, device="cpu")
    Q.export_folders([folders / "dense"], str(where), collection="docs")
    with pytest.raises(ConfigError, match="holds no sparse vectors"):
        collection_hits(local(where, "docs", "sparse"), QUERIES, device="cpu")
    with pytest.raises(ConfigError, match="holds vectors dense: 32 dims Cosine, these folders sparse"):
        Q.export_folders([folders / "sparse"], str(where), collection="docs")
    with pytest.raises(ConfigError, match="two dense folders"):
        Q.export_folders([folders / "dense", folders / "dense"], str(where), collection="x")


def test_qdrant_locations_parse_to_a_server_or_a_local_folder():
    assert L.parse_location("qdrant://db.example:7000/docs") == L.QdrantLocation("docs", url="http://db.example:7000")
    assert L.parse_location("qdrants://db.example/docs?vectors=sparse") == L.QdrantLocation(
        "docs", url="https://db.example:6333", vectors="sparse")
    assert L.parse_location("qdrant+path:/data/q?collection=c") == L.QdrantLocation("c", path="/data/q")
    assert L.parse_location("qdrant+path:rel/q?collection=c").path == "rel/q"
    assert L.export_location("http://h:6333/", None, "my folder") == L.QdrantLocation("my_folder", url="http://h:6333")
    assert L.export_location("/tmp/q", "docs", "x") == L.QdrantLocation("docs", path="/tmp/q")
    assert Q.point_id("a", None) == Q.point_id("a", None) != Q.point_id("a", [0, 5])
    for bad, message in [("qdrant://host", "not a collection name"), ("qdrant+path:/x", "give the folder and the "
                         "collection"), ("qdrant://h/c?vectors=both", "not a kind")]:
        with pytest.raises(ConfigError, match=message):
            L.parse_location(bad)
    with pytest.raises(ConfigError, match="remove --collection"):
        L.export_location("qdrant://h/c", "d", "x")


def test_qdrant_export_and_search_commands(folders, tmp_path, capsys):
    where = tmp_path / "db"
    assert cli.main(["export-index", "--index", str(folders / "dense"), "--to", "qdrant", str(where),
                     "--collection", "docs", "--no-text"]) == 0
    assert "40 points written to collection docs" in capsys.readouterr().err
    queries = [arg for query in QUERIES for arg in ("--query", query)]
    assert cli.main(["search", "--index", local(where, "docs"), *queries, "--device", "cpu"]) == 0
    theirs = [json.loads(line)["hits"] for line in capsys.readouterr().out.splitlines()]
    assert_same_hits(theirs, folder_hits(folders / "dense", QUERIES, exact=True, device="cpu"))
    assert cli.main(["search", "--index", local(where, "docs"), "--query", "x", "--show-text", "--device",
                     "cpu"]) == 2
    assert "exported without texts" in capsys.readouterr().err
    assert cli.main(["export-index", "--index", str(folders / "dense"), "--to", "lancedb", str(where)]) == 2


@pytest.fixture(scope="module")
def fielded(tiny_sparse_model, tmp_path_factory) -> Path:
    """A dense and a sparse folder whose records carry metadata fields of every type (`test_retrieval_filters`')."""
    from tests.unit.test_retrieval_filters import FIELDS, RECORDS, jsonl

    root = tmp_path_factory.mktemp("fielded")
    corpus = jsonl(root / "corpus.jsonl", RECORDS)
    E.embed_corpus(tiny_sparse_model, corpus, root / "dense", E.EmbedSettings(pooling="mean", normalize=True),
                   shard_size=8, device="cpu", fields=FIELDS)
    E.embed_corpus(tiny_sparse_model, corpus, root / "sparse", E.EmbedSettings(sparse=True), shard_size=8,
                   device="cpu", fields=FIELDS)
    Q.export_folders([root / "dense", root / "sparse"], str(root / "db"), collection="both", batch_size=9)
    return root


@pytest.fixture(scope="module")
def fielded_vectors(fielded) -> dict:
    """QUERIES embedded once for both kinds (as the folders' corpora were)."""
    from bertforge.retrieval.searcher import Searcher
    from bertforge.retrieval.vector_search import embed_query_vectors

    return embed_query_vectors(Searcher(fielded / "dense", fielded / "sparse"), QUERIES, device="cpu")


@pytest.mark.parametrize("case", ["equality", "range and set", "json dates, not equal", "not in, float, bool"])
def test_qdrant_filters_equal_our_filtered_search(fielded, fielded_vectors, case):
    """The same query vectors searched with the filter in the collection and in the folders: dense (top 40 of
    40: every matching record and no other), sparse and hybrid equal."""
    from tests.unit.test_retrieval_filters import CASES, RECORDS

    from bertforge.retrieval.searcher import Searcher

    given, keep = CASES[case]
    kept = {r["id"] for r in RECORDS if keep(r)}
    for kind, top_k in [("dense", 40), ("sparse", 5), (None, 5)]:  # None: hybrid
        theirs = Q.QdrantSearcher(local(fielded / "db", "both", kind))
        try:
            found = theirs.search({k: fielded_vectors[k] for k in theirs.kinds}, top_k, depth=12, filter=given,
                                  field="year" if kind == "dense" else None)
        finally:
            theirs.close()
        ours = Searcher(*(fielded / k if kind in (k, None) else None for k in ("dense", "sparse")), exact=True)
        wanted = ours.search({k: fielded_vectors[k] for k in ours.kinds}, top_k, depth=12, filter=given)
        assert_same_hits(found, wanted, keys=("id",))
        if kind == "dense":
            assert all({h["id"] for h in hits} == kept for hits in found)
            assert {h["year"] for hits in found for h in hits} == {r["year"] for r in RECORDS if r["id"] in kept}


def test_qdrant_filter_on_a_field_the_collection_lacks_is_refused(fielded):
    with pytest.raises(InputError, match="colour"):
        collection_hits(local(fielded / "db", "both"), QUERIES, filter=["colour=red"], device="cpu")
    with pytest.raises(InputError, match="metadata fields \\(source, year"):
        collection_hits(local(fielded / "db", "both"), QUERIES, field="colour", device="cpu")


@pytest.mark.parametrize("dtype", ["int8", "binary", "float16"])
def test_qdrant_export_of_coded_folders_gives_their_float_vectors(tiny_sparse_model, corpus, tmp_path, dtype):
    """int8 and binary folders give their dequantized int8 codes, float16 ones their values widened (Qdrant's
    Cosine metric stores each normalized: the directions are compared)."""
    from bertforge.retrieval.store import VectorFolder
    from bertforge.retrieval.vector_quantization import dequantize_int8

    folder = tmp_path / dtype
    E.embed_corpus(tiny_sparse_model, corpus, folder, E.EmbedSettings(pooling="mean", normalize=True, dtype=dtype),
                   device="cpu", shard_size=16)
    Q.export_folders([folder], str(tmp_path / "db"), collection="c", with_text=False)
    opened = VectorFolder(folder)
    kind = "codes" if dtype == "binary" else "vectors"
    stored = np.concatenate([np.asarray(opened.shard_vectors(s, kind)) for s in range(len(opened.shards))])
    wanted = dequantize_int8(stored, opened.manifest["calibration"]) if dtype != "float16" else stored.astype(np.float32)
    wanted /= np.linalg.norm(wanted, axis=1, keepdims=True)
    ids = [ident for s in range(len(opened.shards)) for ident in opened.shard_lines(s, "ids")]
    held = {payload["id"]: vectors["dense"] for payload, vectors in scroll_all(tmp_path / "db", "c").values()}
    exported = np.asarray([held[i] for i in ids])  # local mode keeps them normalized to within 1e-3 of unit length
    assert np.abs(exported / np.linalg.norm(exported, axis=1, keepdims=True) - wanted).max() < 1e-6
