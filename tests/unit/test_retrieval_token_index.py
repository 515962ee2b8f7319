"""The compressed token index of a multi-vector folder (retrieval/token_index.py): built with faiss from a
synthetic folder (clustered unit token vectors, no model), its hits against exact MaxSim (recall, and the
scores of the hits it finds exactly exact search's), deleted and filtered rows honoured, bytes per token,
extended by appended shards without training again, memory-mapped at load, refused when built from another
state of the folder or damaged; and through the CLI (`bertforge index`, `search`, `add`, `delete`, `compact`)
on a tiny random ColBERT model."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from bertforge.cli import main
from bertforge.errors import ConfigError
from bertforge.retrieval import store
from bertforge.retrieval import token_index as T
from bertforge.retrieval.hybrid_search import folder_hits
from bertforge.retrieval.multi_vector_search import MultiVectorIndex

pytest.importorskip("faiss")

DIM = 16


def token_rows(rng: np.random.Generator, centers: np.ndarray, count: int) -> list[np.ndarray]:
    """`count` documents of 2..11 unit token vectors, each near one of `centers`."""
    rows = []
    for _ in range(count):
        n = int(rng.integers(2, 12))
        vectors = centers[rng.integers(0, len(centers), n)] + 0.5 * rng.standard_normal((n, DIM))
        rows.append((vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32))
    return rows


def write_folder(out: Path, shards: list[list[np.ndarray]], dtype: str = "float32") -> Path:
    """A complete multi-vector folder of these shards' documents (ids d0, d1, ...), as `bertforge embed
    --multi-vector` lays it out."""
    out.mkdir(parents=True, exist_ok=True)
    records, first = [], 0
    for index, rows in enumerate(shards):
        packed = store.TokenRows.from_rows(rows, DIM)
        ids = [f"d{first + i}" for i in range(len(rows))]
        records.append(store.write_shard(out, index, ids, packed, dtype, tokens=int(packed.offsets[-1])))
        first += len(rows)
    manifest = {"format": store.FORMAT_NAME, "version": store.FORMAT_VERSION, "complete": True,
                "model": {"path": "none", "fingerprint": "none"}, "kind": "multi-vector",
                "settings": asdict(store.EmbedSettings(multi_vector=True, dtype=dtype)), "embedding": {},
                "similarity": "maxsim", "dim": DIM, "dtype": dtype, "shard_size": 100,
                "input": {"path": "none", "files": [], "settings": {}}, "count": first,
                "tokens": sum(r["tokens"] for r in records), "truncated": 0, "shards": records}
    (out / store.MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")
    return out


def synthetic(seed: int = 0, documents: int = 400, shard: int = 100) -> tuple[list[list[np.ndarray]], np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((40, DIM))
    rows = token_rows(rng, centers, documents)
    return [rows[i:i + shard] for i in range(0, documents, shard)], centers


def queries_near(centers: np.ndarray, count: int, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return token_rows(rng, centers, count)


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found.tolist(), exact.tolist())]))


@pytest.fixture
def folder(tmp_path) -> tuple[Path, np.ndarray]:
    shards, centers = synthetic()
    return write_folder(tmp_path / "mv", shards), centers


def test_token_index_finds_the_exact_maxsim_hits_with_their_exact_scores(folder):
    directory, centers = folder
    record = T.build_token_index(directory, T.TokenIndexSettings(centroids=64))
    assert (record["centroids"], record["code_bytes"], record["shards"], record["count"]) == (64, DIM // 2, 4, 400)
    # per token: a centroid id (2 bytes), a 4-bit residual (8 bytes for 16 numbers), its list entries (<= 4 bytes);
    # beside them the centroids, the codec and .npy headers, a few bytes a token of so small a folder
    files, tokens = record["files"], record["tokens"]
    assert sum(files[f"token-index/cells-{i:05d}.npy"]["bytes"] - 128 for i in range(4)) == 2 * tokens
    assert sum(files[f"token-index/residuals-{i:05d}.npy"]["bytes"] - 128 for i in range(4)) == 8 * tokens
    assert sum(files[f"token-index/lists-{i:05d}.npy"]["bytes"] - 128 for i in range(4)) == 4 * tokens
    assert 10 < record["bytes_per_token"] < 20 and record["bytes"] == sum(e["bytes"] for e in files.values())
    exact = MultiVectorIndex(directory)
    index = T.open_token_index(exact)
    queries = queries_near(centers, 30)
    want_scores, want_rows = exact.search_tokens(queries, 10)
    scores, rows = index.search_tokens(queries, 10)
    assert recall(rows, want_rows) >= 0.95
    exact_of_found = exact.rescore(queries, rows)  # a hit's score is its exact MaxSim, best first
    np.testing.assert_allclose(scores, exact_of_found, rtol=1e-6, atol=1e-6)
    assert (np.diff(scores, axis=1) <= 0).all()
    # probing every centroid, keeping every token and rescoring every document is exact search
    scores, rows = index.search_tokens(queries, 10, nprobe=64, probe_tokens=tokens, candidates=400, rescore=400)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-6, atol=1e-6)


def test_token_index_candidates_are_token_retrieval_with_the_lowest_kept_score_imputed(folder):
    """Step 1, against its definition computed by brute force: for each query token, its probed centroids' tokens
    rebuilt from centroid + residual, the best `keep` kept; a document's estimate sums its best kept score per
    query token, or that token's lowest kept score where it has none kept."""
    directory, centers = folder
    T.build_token_index(directory, T.TokenIndexSettings(centroids=32))
    index = T.open_token_index(MultiVectorIndex(directory))
    centroids, keep, nprobe = index.trained.centroids, 20, 3
    cells = np.concatenate([np.asarray(part.cells, dtype=np.int64) for part in index.parts])
    vectors = np.concatenate([index.trained.decode(np.asarray(part.cells, dtype=np.int64), part.residuals)
                              for part in index.parts])
    owner = np.concatenate([np.repeat(np.arange(len(part.offsets) - 1), np.diff(part.offsets)) + part.base
                            for part in index.parts])
    for query in queries_near(centers, 5):
        rows, estimates = index.candidates(query, nprobe, keep, None)
        kept = []  # per query token: {row: best kept score}, and the lowest kept score
        for token in query:
            probed = np.argsort(-(centroids @ token))[:nprobe]
            mine = np.flatnonzero(np.isin(cells, probed))
            scores = vectors[mine] @ token
            best = mine[np.argsort(-scores, kind="stable")[:keep]]
            per_row: dict[int, float] = {}
            for t in best:
                per_row[int(owner[t])] = max(per_row.get(int(owner[t]), -np.inf), float(vectors[t] @ token))
            kept.append((per_row, float(min(vectors[best] @ token))))
        want_rows = sorted({row for per_row, _ in kept for row in per_row})
        np.testing.assert_array_equal(rows, want_rows)
        want = [sum(per_row.get(row, floor) for per_row, floor in kept) for row in want_rows]
        np.testing.assert_allclose(estimates, want, rtol=1e-5, atol=1e-5)


def test_token_index_honours_deleted_and_filtered_rows(folder):
    directory, centers = folder
    T.build_token_index(directory, T.TokenIndexSettings(centroids=64))
    manifest = json.loads((directory / store.MANIFEST_NAME).read_text())
    deleted = np.arange(0, 400, 2)  # every even row
    manifest["tombstones"] = store.write_tombstones(directory, 1, deleted)
    (directory / store.MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")
    exact = MultiVectorIndex(directory)
    index = T.open_token_index(exact)
    queries = queries_near(centers, 12)
    _, rows = index.search_tokens(queries, 10)
    assert (rows % 2 == 1).all()
    _, want = exact.search_tokens(queries, 10)
    assert recall(rows, want) >= 0.95
    few = np.zeros(400, dtype=bool)
    few[[1, 3, 301, 10]] = True  # 10 is deleted: three rows allowed, fewer than k
    scores, rows = index.search_tokens(queries, 10, rows=few)
    assert rows.shape == (12, 3) and set(rows.ravel().tolist()) == {1, 3, 301}
    np.testing.assert_allclose(scores, exact.search_tokens(queries, 10, rows=few)[0], rtol=1e-6)


def test_token_index_residual_codecs_and_bad_settings(folder):
    directory, centers = folder
    sizes = {}
    for residual in ("SQ8", "PQ4"):
        sizes[residual] = T.build_token_index(directory, T.TokenIndexSettings(centroids=32, residual=residual))
    assert (sizes["SQ8"]["code_bytes"], sizes["PQ4"]["code_bytes"]) == (DIM, 4)
    assert sizes["PQ4"]["bytes"] < sizes["SQ8"]["bytes"]
    for bad, match in (({"residual": "SQ3"}, "residual must be SQ4, SQ8 or PQ"), ({"nprobe": 0}, "nprobe must be"),
                       ({"centroids": "8"}, "centroids must be")):
        with pytest.raises(ConfigError, match=match):
            T.TokenIndexSettings(**bad)
    dense = directory.parent / "dense"
    manifest = json.loads((directory / store.MANIFEST_NAME).read_text())
    with pytest.raises(ConfigError, match="not a ColBERT model's token vectors"):
        manifest["kind"], manifest["settings"]["multi_vector"] = "dense", False
        dense.mkdir()
        (dense / store.MANIFEST_NAME).write_text(json.dumps({**manifest, "shards": [], "count": 0}))
        T.build_token_index(dense)


def test_token_index_is_extended_by_appended_shards_without_training_again(tmp_path):
    shards, centers = synthetic(documents=500)
    directory = write_folder(tmp_path / "mv", shards[:3])
    T.build_token_index(directory, T.TokenIndexSettings(centroids=64))
    home = directory / T.FOLDER_NAME
    trained = {name: (home / name).read_bytes() for name in (T.CENTROIDS_NAME, T.CODEC_NAME, T.TRAINED_NAME)}
    write_folder(directory, shards)  # two shards appended: the first three files unchanged, a new manifest
    exact = MultiVectorIndex(directory)
    index = T.open_token_index(exact)  # extended, and saved
    record = json.loads((directory / T.RECORD_NAME).read_text())
    assert (record["shards"], record["count"], len(index.parts)) == (5, 500, 5)
    assert {name: (home / name).read_bytes() for name in trained} == trained
    queries = queries_near(centers, 20)
    _, rows = index.search_tokens(queries, 10)
    assert recall(rows, exact.search_tokens(queries, 10)[1]) >= 0.95 and (rows >= 300).any()
    assert T.open_token_index(MultiVectorIndex(directory)).record == record  # nothing left to extend


def test_token_index_is_memory_mapped_at_load(folder):
    directory, _ = folder
    record = T.build_token_index(directory, T.TokenIndexSettings(centroids=64))
    index = T.open_token_index(MultiVectorIndex(directory))
    mapped = [getattr(part, kind) for part in index.parts for kind in T.PART_FILES]
    assert all(isinstance(array, np.memmap) for array in mapped)
    # read into memory: the centroids and the codec alone, a small share of the index
    assert index.trained.centroids.nbytes <= 64 * DIM * 4 < record["bytes"] / 4


def test_token_index_refuses_another_state_of_the_folder_and_damaged_files(folder, tmp_path):
    directory, _ = folder
    T.build_token_index(directory, T.TokenIndexSettings(centroids=64))
    other = write_folder(tmp_path / "other", synthetic(seed=7)[0])
    for name in (T.RECORD_NAME, T.FOLDER_NAME):  # another folder's index copied in
        (shutil.copytree if name == T.FOLDER_NAME else shutil.copy)(directory / name, other / name)
    with pytest.raises(ConfigError, match="built from another state of the folder.*bertforge index --index"):
        T.open_token_index(MultiVectorIndex(other))
    part = directory / T.FOLDER_NAME / "residuals-00002.npy"
    part.write_bytes(part.read_bytes()[:-3] + b"abc")
    with pytest.raises(ConfigError, match="residuals-00002.npy"):
        T.open_token_index(MultiVectorIndex(directory))
    T.build_token_index(directory, T.TokenIndexSettings(centroids=64))  # the rebuild rewrites the damaged part
    assert T.open_token_index(MultiVectorIndex(directory)) is not None


@pytest.fixture(scope="module")
def colbert_model(tiny_colbert_model) -> Path:
    return tiny_colbert_model


WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex bad jumping frogs near "
         "old rivers and green hills under the pale winter moon").split()


def test_token_index_through_the_cli_index_search_add_delete_compact(colbert_model, tmp_path, capsys):
    rng = np.random.default_rng(3)
    texts = [f"{i} " + " ".join(rng.choice(WORDS, size=int(rng.integers(3, 20)))) for i in range(60)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "mv"
    main(["embed", "--model", str(colbert_model), "--input", str(corpus), "--out", str(out), "--multi-vector",
          "--device", "cpu", "--shard-size", "20"])
    assert main(["index", "--index", str(out), "--m", "8"]) == 2
    assert "--m applies to the HNSW index of a dense folder" in capsys.readouterr().err
    assert main(["index", "--index", str(out), "--centroids", "32", "--nprobe", "32", "--candidates", "60",
          "--rescore", "60"]) == 0
    assert "token index of" in capsys.readouterr().err and (out / T.RECORD_NAME).is_file()
    queries = [texts[4], "winter moon over green hills", texts[33]]

    def searched(**options) -> list[list[str]]:
        return [[hit["id"] for hit in hits] for hits in folder_hits(out, queries, top_k=5, device="cpu", **options)]

    assert searched() == searched(exact=True)  # every centroid probed, every document rescored: exact
    main(["search", "--index", str(out), "--top-k", "5", "--device", "cpu", "--query", queries[0]])
    assert [hit["id"] for hit in json.loads(capsys.readouterr().out)["hits"]] == searched(exact=True)[0]
    added = tmp_path / "added.txt"
    added.write_text("seven wizards under the pale winter moon\n", encoding="utf-8")
    main(["add", "--index", str(out), "--input", str(added), "--device", "cpu"])
    record = json.loads((out / T.RECORD_NAME).read_text())
    assert (record["shards"], record["count"]) == (4, 61)  # extended by the added shard (its line 1 replaces id "1")
    assert searched() == searched(exact=True)
    first = searched()[1][0]
    main(["delete", "--index", str(out), "--id", first])
    assert first not in searched()[1] and searched() == searched(exact=True)
    main(["compact", "--index", str(out)])
    record = json.loads((out / T.RECORD_NAME).read_text())
    assert record["count"] == 59 and record["shards_key"] == T.shards_key(MultiVectorIndex(out))
    assert searched() == searched(exact=True)
    dense = tmp_path / "dense"
    main(["embed", "--model", str(colbert_model), "--input", str(corpus), "--out", str(dense), "--device", "cpu"])
    capsys.readouterr()
    assert main(["index", "--index", str(dense), "--centroids", "8"]) == 2
    assert "--centroids applies to the token index of a multi-vector folder" in capsys.readouterr().err
