"""A multi-vector folder (a ColBERT model's token vectors) exported into a Qdrant collection is a multivector compared
by MaxSim (qdrant-client's `MultiVectorConfig`, `MAX_SIM`), and searched there with the queries' token vectors it
answers what our exact MaxSim answers: the same top-10 ids, scores within 1e-4, with a filter too; folders of all
three kinds in one collection fuse there as ours do; a server that does not answer a search is `QdrantUnavailable`
(the server's 503), a local folder's failure stays a ConfigError. qdrant-client's local mode, tiny random models."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("qdrant_client")

from qdrant_client import QdrantClient, models  # noqa: E402
from qdrant_client.http.exceptions import ResponseHandlingException  # noqa: E402
from tests.unit.test_retrieval_hybrid_kinds import QUERIES, make_folders  # noqa: E402

from bertforge.errors import ConfigError  # noqa: E402
from bertforge.retrieval import qdrant_collection as Q  # noqa: E402
from bertforge.retrieval.hybrid_search import collection_hits, folder_hits, fused_hits  # noqa: E402

SCORE_TOLERANCE = 1e-4  # MaxSim sums 12 float32 dot products, in Qdrant's order


@pytest.fixture(scope="module")
def folders(tiny_sparse_model, tmp_path_factory):
    return make_folders(tiny_sparse_model, tmp_path_factory)


def local(path, collection: str, vectors: str | None = None) -> str:
    return f"qdrant+path:{path}?collection={collection}" + (f"&vectors={vectors}" if vectors else "")


def assert_same(theirs: list[list[dict]], ours: list[list[dict]], tolerance: float = SCORE_TOLERANCE) -> None:
    assert len(theirs) == len(ours) == len(QUERIES)
    for got, want in zip(theirs, ours):
        assert [h["id"] for h in got] == [h["id"] for h in want]
        assert [h["score"] for h in got] == pytest.approx([h["score"] for h in want], abs=tolerance)


def test_qdrant_multi_vector_export_is_maxsim_and_searches_as_ours(folders, tmp_path):
    done = Q.export_folders([folders / "mv"], str(tmp_path / "db"), collection="mv", batch_size=8)
    assert done["points"] == 30
    client = QdrantClient(path=str(tmp_path / "db"))
    params = client.get_collection("mv").config.params.vectors["multi-vector"]
    assert params.multivector_config.comparator == models.MultiVectorComparator.MAX_SIM
    assert params.size == 16 and params.distance == models.Distance.DOT
    client.close()
    theirs = collection_hits(local(tmp_path / "db", "mv"), QUERIES, top_k=10, device="cpu")
    assert_same(theirs, folder_hits(folders / "mv", QUERIES, top_k=10, device="cpu"))
    filtered = collection_hits(local(tmp_path / "db", "mv"), QUERIES, top_k=10, device="cpu", filter=["source=b"],
                               field="source")
    assert all(hit["source"] == "b" for hits in filtered for hit in hits)
    assert_same(filtered, folder_hits(folders / "mv", QUERIES, top_k=10, device="cpu", filter=["source=b"]))


def test_qdrant_collection_of_three_kinds_fuses_as_ours(folders, tmp_path):
    Q.export_folders([folders / "mv", folders / "sparse", folders / "dense"], str(tmp_path / "db"), collection="all")
    theirs = collection_hits(local(tmp_path / "db", "all"), QUERIES, top_k=5, depth=12, device="cpu")
    ours = fused_hits([folders / "dense", folders / "sparse", folders / "mv"], QUERIES, top_k=5, depth=12,
                      device="cpu")
    assert_same(theirs, ours, tolerance=1e-9)  # ranks fused: the same when every ranking is
    alone = collection_hits(local(tmp_path / "db", "all", "multi-vector"), QUERIES, top_k=5, device="cpu")
    assert_same(alone, folder_hits(folders / "mv", QUERIES, top_k=5, device="cpu"))
    with pytest.raises(ConfigError, match="embedded different input"):
        Q.export_folders([folders / "dense", folders / "mv-other"], str(tmp_path / "db"), collection="bad")


def test_qdrant_search_a_server_that_does_not_answer_is_unavailable(folders, tmp_path, monkeypatch):
    Q.export_folders([folders / "mv"], str(tmp_path / "db"), collection="mv")
    searcher = Q.QdrantSearcher(local(tmp_path / "db", "mv"))
    vectors = {"multi-vector": [[[1.0] + [0.0] * 15]]}
    try:
        def unanswered(*args, **kwargs):
            raise ResponseHandlingException(ConnectionRefusedError("connection refused"))
        monkeypatch.setattr(searcher.client, "query_batch_points", unanswered)
        with pytest.raises(ConfigError, match="the search failed") as local_failure:
            searcher.search(vectors, 3)  # a local folder: not a server's absence
        assert not isinstance(local_failure.value, Q.QdrantUnavailable)
        monkeypatch.setattr(searcher, "location", replace(searcher.location, url="http://127.0.0.1:1"))
        with pytest.raises(Q.QdrantUnavailable, match="did not answer the search"):
            searcher.search(vectors, 3)
    finally:
        monkeypatch.undo()
        searcher.close()
