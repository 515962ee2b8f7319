"""The approximate (HNSW) index of `bertforge index` and its use by `bertforge search`: built with the metric
exact search uses (inner product, never L2), so its hits and scores equal exact search's on a small set;
saved beside the shards and refused once they change; a clear error without faiss."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from bertforge import cli
from bertforge.errors import ConfigError
from bertforge.retrieval import embed_corpus as E
from bertforge.retrieval import store
from bertforge.retrieval import vector_ann as A
from bertforge.retrieval import vector_search as S
from bertforge.retrieval.vector_quantization import calibrate

faiss = pytest.importorskip("faiss")


def vector_folder(out: Path, vectors: np.ndarray, *, dtype: str = "float32", shard_size: int = 200,
                  normalized: bool = True) -> Path:
    """An embedding folder holding `vectors` (as `embed` writes one: shards, records, a complete manifest),
    without a model: the index and the exact search only read the vectors."""
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"format": store.FORMAT_NAME, "version": store.FORMAT_VERSION, "complete": False,
                "model": {"path": "none", "fingerprint": "none"},
                "embedding": {"pooling": "mean", "normalize": normalized, "layer": -1, "prompt": "", "max_length": 8,
                              "precision": "fp32"},
                "similarity": "cosine" if normalized else "dot", "dim": vectors.shape[1], "dtype": dtype,
                "shard_size": shard_size, "input": {"path": "none", "files": [], "settings": {}},
                "count": None, "tokens": None, "shards": []}
    if dtype in ("int8", "binary"):
        manifest["calibration"] = calibrate(vectors)
    shards = 0
    for shards, start in enumerate(range(0, len(vectors), shard_size), start=1):
        block = vectors[start:start + shard_size]
        store.write_shard(out, shards - 1, [str(start + i) for i in range(len(block))], block, dtype, 0,
                          manifest.get("calibration"))
    store.finish_output(out, manifest, shards)
    return out


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def clustered(count: int, dim: int, seed: int) -> np.ndarray:
    """Vectors around 20 centres (as sentence vectors cluster by topic), so near ties are common."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((20, dim))
    return (centres[rng.integers(0, 20, count)] + 0.4 * rng.standard_normal((count, dim))).astype(np.float32)


def test_vector_ann_hits_and_scores_equal_exact_search_on_normalized_vectors(tmp_path):
    vectors = unit(clustered(500, 24, seed=0))
    folder = vector_folder(tmp_path / "v", vectors, shard_size=180)
    record = A.build_ann(folder, m=16, ef_construction=100, ef_search=500)
    assert record["metric"] == "inner_product" and record["count"] == 500 and record["similarity"] == "cosine"
    queries = unit(clustered(40, 24, seed=1))
    exact_scores, exact_rows = S.VectorIndex(folder).search_vectors(queries, 10)
    ann = A.open_ann(S.VectorIndex(folder))
    assert ann.graph.metric_type == faiss.METRIC_INNER_PRODUCT
    scores, rows = ann.search_vectors(queries, 10)
    np.testing.assert_array_equal(rows, exact_rows)  # ef_search = the whole set: the graph finds the exact top 10
    np.testing.assert_allclose(scores, exact_scores, rtol=0, atol=1e-6)
    np.testing.assert_allclose(scores, np.take_along_axis(queries @ vectors.T, rows, axis=1), atol=1e-6)
    scores, rows = ann.search_vectors(queries, 900)  # k beyond the count: capped, as exact search caps it
    assert rows.shape == (40, 500) and sorted(rows[0].tolist()) == list(range(500))


def test_vector_ann_ranks_unnormalized_vectors_by_dot_product_not_l2(tmp_path):
    rng = np.random.default_rng(2)
    vectors = clustered(400, 16, seed=2) * rng.uniform(0.2, 3.0, (400, 1)).astype(np.float32)  # norms vary
    folder = vector_folder(tmp_path / "v", vectors, normalized=False)
    A.build_ann(folder, ef_search=400)
    queries = clustered(30, 16, seed=3)
    exact_scores, exact_rows = S.VectorIndex(folder).search_vectors(queries, 10)
    scores, rows = A.open_ann(S.VectorIndex(folder)).search_vectors(queries, 10)
    np.testing.assert_array_equal(rows, exact_rows)
    np.testing.assert_allclose(scores, exact_scores, rtol=1e-6, atol=1e-5)
    # an L2 index over the same vectors (the bug this pins) ranks other rows first
    l2 = faiss.IndexFlatL2(16)
    l2.add(vectors)
    l2_rows = l2.search(queries, 10)[1]
    assert sum(set(a) != set(b) for a, b in zip(l2_rows.tolist(), exact_rows.tolist())) >= 25


def test_vector_ann_of_an_int8_folder_scores_its_dequantized_vectors_as_exact_search(tmp_path):
    vectors = unit(clustered(300, 16, seed=4))
    folder = vector_folder(tmp_path / "v", vectors, dtype="int8", shard_size=128)
    A.build_ann(folder, ef_search=300)
    queries = unit(clustered(20, 16, seed=5))
    exact_scores, exact_rows = S.VectorIndex(folder).search_vectors(queries, 5)
    scores, rows = A.open_ann(S.VectorIndex(folder)).search_vectors(queries, 5)
    np.testing.assert_allclose(scores, exact_scores, atol=1e-5)
    assert np.mean(rows == exact_rows) >= 0.95  # int8 scores tie more often; float rounding may swap a tie


def test_vector_ann_rebuilds_a_stale_index_refuses_a_binary_folder_and_names_the_extra(tmp_path, monkeypatch, caplog):
    vectors = unit(clustered(120, 8, seed=6))
    folder = vector_folder(tmp_path / "v", vectors, shard_size=50)
    assert A.open_ann(S.VectorIndex(folder)) is None  # no index: exact search
    A.build_ann(folder, m=8, ef_search=200)
    assert {p.name for p in folder.iterdir() if p.name.startswith("ann")} == {A.ANN_NAME, A.GRAPH_NAME}
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # written atomically: no temporaries left
    # the folder embedded again with other vectors: the index is stale, built again with its settings
    for path in folder.glob("progress/*.json"):
        path.unlink()
    (folder / store.MANIFEST_NAME).unlink()
    vector_folder(folder, unit(clustered(130, 8, seed=7)), shard_size=50)
    with caplog.at_level("WARNING", logger=A.log.name):
        ann = A.open_ann(S.VectorIndex(folder))
    assert "built from other vectors than the folder's shards now hold (120 then, 130 now); building the " \
           "approximate index again" in caplog.text
    assert (ann.graph.ntotal, ann.record["m"], ann.record["ef_search"]) == (130, 8, 200)
    assert json.loads((folder / A.ANN_NAME).read_text())["count"] == 130  # saved: the next search reuses it
    with pytest.raises(ConfigError, match="binary vectors"):
        A.build_ann(vector_folder(tmp_path / "b", vectors, dtype="binary"))
    with pytest.raises(ConfigError, match="m must be a positive integer"):
        A.build_ann(folder, m=0)
    monkeypatch.setitem(sys.modules, "faiss", None)  # faiss not installed
    with pytest.raises(ConfigError, match=r"pip install 'bertforge\[search\]'.*--exact"):
        A.build_ann(folder)


@pytest.fixture
def builds(monkeypatch) -> list[int]:
    """The vector count of every HNSW graph this test builds, in order."""
    made: list[int] = []
    real = A.build_graph

    def counted(index, settings):
        made.append(index.count)
        return real(index, settings)

    monkeypatch.setattr(A, "build_graph", counted)
    return made


def searched_rows(folder: Path, queries: np.ndarray) -> np.ndarray:
    return A.open_ann(S.VectorIndex(folder)).search_vectors(queries, 10)[1]


def test_vector_ann_rebuilds_a_graph_of_another_folder_of_the_same_size_or_of_reordered_vectors(tmp_path, builds,
                                                                                                caplog):
    vectors = unit(clustered(300, 16, seed=8))
    queries = unit(clustered(25, 16, seed=9))
    folder = vector_folder(tmp_path / "ours", vectors, shard_size=128)
    exact_rows = S.VectorIndex(folder).search_vectors(queries, 10)[1]
    other = vector_folder(tmp_path / "other", unit(clustered(300, 16, seed=10)), shard_size=128)
    shuffled = vector_folder(tmp_path / "shuffled", vectors[np.random.default_rng(0).permutation(300)],
                             shard_size=128)
    for built in (folder, other, shuffled):
        A.build_ann(built, ef_search=300)
    assert builds == [300, 300, 300]
    np.testing.assert_array_equal(searched_rows(folder, queries), exact_rows)
    for source in (other, shuffled):
        # the rows: a same-size graph copied in was searched, rc 0, wrong hits
        assert (source / A.GRAPH_NAME).stat().st_size == (folder / A.GRAPH_NAME).stat().st_size
        shutil.copyfile(source / A.GRAPH_NAME, folder / A.GRAPH_NAME)
        caplog.clear()
        with caplog.at_level("WARNING", logger=A.log.name):
            np.testing.assert_array_equal(searched_rows(folder, queries), exact_rows)
        assert len(caplog.records) == 1 and "ann-hnsw.faiss: its sha256 differs from the one saved in ann.json" \
            in caplog.records[0].getMessage()
    assert builds == [300] * 5
    np.testing.assert_array_equal(searched_rows(folder, queries), exact_rows)  # the rebuilt one, saved: reused
    assert builds == [300] * 5
    # both files of the shuffled folder copied in: its record names other vectors
    for name in (A.GRAPH_NAME, A.ANN_NAME):
        shutil.copyfile(shuffled / name, folder / name)
    np.testing.assert_array_equal(searched_rows(folder, queries), exact_rows)
    assert builds == [300] * 6


@pytest.mark.parametrize("damage", ["truncated", "garbage of the same size", "ann.json not JSON"])
def test_vector_ann_rebuilds_a_damaged_index_without_a_traceback(tmp_path, builds, caplog, damage):
    vectors = unit(clustered(150, 8, seed=11))
    queries = unit(clustered(10, 8, seed=12))
    folder = vector_folder(tmp_path / "v", vectors, shard_size=64)
    exact_rows = S.VectorIndex(folder).search_vectors(queries, 10)[1]
    A.build_ann(folder, ef_search=150)
    graph = folder / A.GRAPH_NAME
    if damage == "truncated":
        graph.write_bytes(graph.read_bytes()[:-100])
    elif damage == "garbage of the same size":
        graph.write_bytes(b"\x01" * graph.stat().st_size)  # faiss: RuntimeError
    else:
        (folder / A.ANN_NAME).write_text("{", encoding="utf-8")
    with caplog.at_level("WARNING", logger=A.log.name):
        np.testing.assert_array_equal(searched_rows(folder, queries), exact_rows)
    assert builds == [150, 150] and len(caplog.records) == 1
    assert str(folder / A.ANN_NAME) in caplog.records[0].getMessage()


def test_vector_ann_rebuilt_in_a_folder_it_cannot_write_is_searched_with_a_warning(tmp_path, builds, caplog,
                                                                                 monkeypatch):
    vectors = unit(clustered(100, 8, seed=13))
    folder = vector_folder(tmp_path / "v", vectors, shard_size=64)
    A.build_ann(folder, ef_search=100)
    (folder / A.GRAPH_NAME).write_bytes(b"\0" * 10)

    def read_only(*args):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(A, "save_ann", read_only)
    queries = unit(clustered(5, 8, seed=14))
    with caplog.at_level("WARNING", logger=A.log.name):
        rows = searched_rows(folder, queries)
    np.testing.assert_array_equal(rows, S.VectorIndex(folder).search_vectors(queries, 10)[1])
    assert "could not be saved (" in caplog.text and "bertforge index --index" in caplog.text


def test_vector_index_refuses_a_shard_that_is_not_the_one_its_manifest_records(tmp_path):
    vectors = unit(clustered(120, 8, seed=15))
    folder = vector_folder(tmp_path / "v", vectors, shard_size=50)
    queries = unit(clustered(4, 8, seed=16))
    shard = folder / S.VectorIndex(folder).shards[1]["vectors"]
    np.save(shard, np.load(shard)[::-1])  # its rows reordered: the same size, other hits under the same ids
    index = S.VectorIndex(folder)
    with pytest.raises(ConfigError) as error:
        index.search_vectors(queries, 5)
    assert str(error.value).startswith(f"{shard}: its sha256 differs from the one saved in manifest.json")
    assert f"delete {folder / 'progress' / 'shard-00001.json'} and rerun the same `bertforge embed`" in str(error.value)
    with pytest.raises(ConfigError, match="its sha256 differs"):
        A.build_ann(folder)  # an index is never built from such a shard either
    shard.write_bytes(shard.read_bytes()[:-8])  # truncated: refused when the folder is opened
    with pytest.raises(ConfigError, match=r"vectors-00001\.npy: \d+ bytes, but \d+ were written \(truncated"):
        S.VectorIndex(folder)


def test_vector_ann_index_command_then_search_uses_it_and_exact_scans(tiny_minilm_model, tmp_path, capsys,
                                                                      monkeypatch):
    rng = np.random.default_rng(0)
    words = "river moon fox wizard green hill pale winter frog bridge stone lamp".split()
    texts = [f"{i} " + " ".join(rng.choice(words, size=int(rng.integers(3, 12)))) for i in range(60)]
    (tmp_path / "c.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    E.embed_corpus(tiny_minilm_model, tmp_path / "c.txt", tmp_path / "v", device="cpu", shard_size=25, embedding=E.EmbedSettings(normalize=True))
    queries = [texts[3], texts[41], "winter bridge"]
    exact = S.search_hits(tmp_path / "v", queries, top_k=5, device="cpu")
    assert cli.main(["index", "--index", str(tmp_path / "v"), "--ef-search", "64"]) == 0
    assert "HNSW index of 60 vectors (32 dims, inner product: cosine)" in capsys.readouterr().err
    used = []
    original = A.AnnIndex.search_vectors
    monkeypatch.setattr(A.AnnIndex, "search_vectors", lambda self, *a, **k: used.append(1) or original(self, *a, **k))
    assert cli.main(["search", "--index", str(tmp_path / "v"), "--top-k", "5", "--device", "cpu",
                     *[arg for q in queries for arg in ("--query", q)]]) == 0
    hits = [json.loads(line)["hits"] for line in capsys.readouterr().out.splitlines()]
    assert used == [1]
    assert [[h["id"] for h in q] for q in hits] == [[h["id"] for h in q] for q in exact]
    np.testing.assert_allclose([[h["score"] for h in q] for q in hits], [[h["score"] for h in q] for q in exact],
                               atol=1e-6)
    assert cli.main(["search", "--index", str(tmp_path / "v"), "--query", "moon", "--exact", "--device", "cpu"]) == 0
    assert used == [1] and len(json.loads(capsys.readouterr().out)["hits"]) == 10
    graph = tmp_path / "v" / A.GRAPH_NAME
    graph.write_bytes(bytes(reversed(graph.read_bytes())))  # damaged, same size: was a raw faiss RuntimeError
    assert cli.main(["search", "--index", str(tmp_path / "v"), "--top-k", "5", "--device", "cpu",
                     *[arg for q in queries for arg in ("--query", q)]]) == 0
    hits = [json.loads(line)["hits"] for line in capsys.readouterr().out.splitlines()]
    assert used == [1, 1] and [[h["id"] for h in q] for q in hits] == [[h["id"] for h in q] for q in exact]
