"""Sparse vectors in the Python API, `bertforge embed --sparse`'s shards and `bertforge search` over them
(inverted index, exact against brute force) and fused with a dense folder (reciprocal rank fusion), on a tiny
random SPLADE model with the real MiniLM vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bertforge import storage
from bertforge.errors import ConfigError, InputError
from bertforge.inference.pipelines import load_pipeline
from bertforge.metrics.fusion import reciprocal_rank_fusion
from bertforge.metrics.sparse import InvertedIndex, SparseRows
from bertforge.retrieval import embed_corpus as E
from bertforge.retrieval import sparse_search as S
from bertforge.retrieval import store
from bertforge.retrieval.hybrid_search import folder_hits, hybrid_search_hits
from bertforge.retrieval.sparse_vectors import encode_sparse

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex bad jumping frogs near "
         "old rivers and green hills under the pale winter moon").split()


def sentences(count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"{i} " + " ".join(rng.choice(WORDS, size=int(rng.integers(3, 20)))) for i in range(count)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[str]]:
    texts = sentences(17)
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return path, texts


@pytest.fixture(scope="module")
def sparse_folder(tiny_sparse_model, corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sparse") / "out"
    E.embed_corpus(tiny_sparse_model, corpus[0], out, shard_size=5, device="cpu", embedding=E.EmbedSettings(sparse=True))
    return out


def brute_force(queries: SparseRows, documents: SparseRows) -> np.ndarray:
    """[Q, N] dot products summed one common term at a time in ascending term order, in float32."""
    out = np.zeros((len(queries), len(documents)), dtype=np.float32)
    for q in range(len(queries)):
        terms, weights = queries.row(q)
        for d in range(len(documents)):
            held = dict(zip(*(a.tolist() for a in documents.row(d))))
            total = np.float32(0)
            for term, weight in zip(terms.tolist(), weights.tolist()):
                if term in held:
                    total = np.float32(total + np.float32(weight) * np.float32(held[term]))
            out[q, d] = total
    return out


def test_sparse_pipeline_prunes_and_names_terms_as_encode_sparse(tiny_sparse_model):
    pipeline = load_pipeline(tiny_sparse_model, "embed-sparse", device="cpu")
    texts = ["What is the capital of France?", "ok"]
    full = pipeline(texts)
    pruned = pipeline(texts, max_terms=4, tokens=True)
    for whole, top in zip(full, pruned):
        assert len(whole["indices"]) > 4 and len(top["indices"]) == 4
        assert sorted(top["values"], reverse=True) == sorted(whole["values"], reverse=True)[:4]
        assert top["tokens"] == pipeline.tokenizer.convert_ids_to_tokens(top["indices"])
    rows = encode_sparse(pipeline, texts)
    assert [row[0].tolist() for row in map(rows.row, range(2))] == [r["indices"] for r in full]
    np.testing.assert_array_equal(rows.row(1)[1], np.asarray(full[1]["values"], np.float32))
    with pytest.raises(InputError, match="tokens must be true or false"):
        pipeline(texts, tokens="yes")
    with pytest.raises(InputError, match="embed-sparse pipeline"):
        encode_sparse(load_pipeline(tiny_sparse_model, "embed", device="cpu"), texts)


def test_embed_sparse_shards_equal_the_pipeline_and_resume(tiny_sparse_model, corpus, sparse_folder, tmp_path,
                                                           monkeypatch):
    manifest = json.loads((sparse_folder / store.MANIFEST_NAME).read_text(encoding="utf-8"))
    assert manifest["kind"] == "sparse" and manifest["similarity"] == "dot" and manifest["count"] == 17
    assert [s["count"] for s in manifest["shards"]] == [5, 5, 5, 2]
    index = S.SparseIndex(sparse_folder)
    stored = SparseRows.concatenate([index.shard_rows(i) for i in range(4)])
    expected = encode_sparse(load_pipeline(tiny_sparse_model, "embed-sparse", device="cpu"), corpus[1])
    # Other batches than encode's move weights by float rounding only.
    np.testing.assert_allclose(stored.dense(), expected.dense(), atol=1e-5)
    assert sum(s["nonzero"] for s in manifest["shards"]) == len(stored.indices)
    # A run that lost shard 2 (its record) redoes only it, to the same bytes.
    copy = tmp_path / "copy"
    E.embed_corpus(tiny_sparse_model, corpus[0], copy, shard_size=5, device="cpu", embedding=E.EmbedSettings(sparse=True))
    before = {p.name: p.read_bytes() for p in copy.glob("*-0000*")}
    store.progress_path(copy, 2).unlink()
    embedded = []
    real = E.embed_shard
    monkeypatch.setattr(E, "embed_shard", lambda *a, **k: embedded.append(len(a[3])) or real(*a, **k))
    E.embed_corpus(tiny_sparse_model, corpus[0], copy, shard_size=5, device="cpu", embedding=E.EmbedSettings(sparse=True))
    assert embedded == [5] and {p.name: p.read_bytes() for p in copy.glob("*-0000*")} == before
    with pytest.raises(ConfigError, match=r"max_terms 0 -> 8"):
        E.embed_corpus(tiny_sparse_model, corpus[0], copy, shard_size=5, device="cpu", embedding=E.EmbedSettings(sparse=True, max_terms=8))
    with pytest.raises(ConfigError, match="remove --dtype int8"):
        E.embed_corpus(tiny_sparse_model, corpus[0], tmp_path / "x", embedding=E.EmbedSettings(sparse=True, dtype="int8"))
    with pytest.raises(ConfigError, match="add --sparse"):
        E.embed_corpus(tiny_sparse_model, corpus[0], tmp_path / "x", embedding=E.EmbedSettings(max_terms=8))


def test_inverted_index_scores_equal_brute_force_bit_for_bit(sparse_folder, tiny_sparse_model):
    index = S.SparseIndex(sparse_folder)
    documents = SparseRows.concatenate([index.shard_rows(i) for i in range(len(index.shards))])
    pipeline = load_pipeline(tiny_sparse_model, "embed-sparse", device="cpu")
    queries = encode_sparse(pipeline, ["the lazy dog", "seven wizards near old rivers", "moon", "3 frogs"])
    exact = brute_force(queries, documents)
    scores, rows = index.search_sparse(queries, top_k=17)
    np.testing.assert_array_equal(scores, np.take_along_axis(exact, rows, axis=1))  # the same float32 numbers
    order = np.lexsort((np.broadcast_to(np.arange(17), exact.shape), -exact), axis=1)  # score desc, row asc
    np.testing.assert_array_equal(rows, order)
    np.testing.assert_allclose(scores, np.take_along_axis(queries.dense().astype(np.float64)
                                                          @ documents.dense().T.astype(np.float64), rows, axis=1),
                               rtol=1e-5)  # float32 sums of hundreds of terms
    assert (sparse_folder / S.INVERTED_DIR / S.INVERTED_RECORD).is_file()


def test_inverted_index_is_read_back_and_rebuilt_when_shards_change(sparse_folder, tmp_path, monkeypatch):
    import shutil

    folder = tmp_path / "folder"
    shutil.copytree(sparse_folder, folder)
    built = []
    real = S.build_inverted
    monkeypatch.setattr(S, "build_inverted", lambda index: built.append(index) or real(index))
    first = S.SparseIndex(folder).inverted()
    assert built == [] and isinstance(first.rows, np.memmap)  # the saved index, mapped from disk
    manifest = json.loads((folder / store.MANIFEST_NAME).read_text(encoding="utf-8"))
    weights = folder / manifest["shards"][0]["weights"]
    np.save(weights, np.load(weights) * 2)  # shard 0 rewritten, its manifest entry with it (as embed does)
    manifest["shards"][0]["sha256"]["weights"] = storage.file_sha256(weights)
    (folder / store.MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")
    again = S.SparseIndex(folder).inverted()
    assert len(built) == 1
    np.testing.assert_array_equal(again.rows, first.rows)
    assert not np.array_equal(again.weights, first.weights)


def test_inverted_index_whose_arrays_are_not_the_saved_ones_is_rebuilt(sparse_folder, tmp_path, monkeypatch,
                                                                       caplog):
    import shutil

    folder = tmp_path / "folder"
    shutil.copytree(sparse_folder, folder)
    saved = S.SparseIndex(folder).inverted()
    expected = (np.array(saved.rows), np.array(saved.weights))
    weights = folder / S.INVERTED_DIR / "weights.npy"
    np.save(weights, np.load(weights)[::-1])  # the same size, other scores for every posting
    built = []
    real = S.build_inverted
    monkeypatch.setattr(S, "build_inverted", lambda index: built.append(index) or real(index))
    with caplog.at_level("WARNING", logger=S.log.name):
        again = S.SparseIndex(folder).inverted()
    assert len(built) == 1 and "weights.npy: its sha256 differs from the one saved in inverted.json" in caplog.text
    np.testing.assert_array_equal(again.rows, expected[0])
    np.testing.assert_array_equal(again.weights, expected[1])
    (folder / S.INVERTED_DIR / "rows.npy").write_bytes(b"\x93NUMPY")  # truncated
    assert S.SparseIndex(folder).inverted() is not None and len(built) == 2
    S.SparseIndex(folder).inverted()
    assert len(built) == 2  # saved again: read back


def test_inverted_index_of_random_rows_ranks_ties_by_row():
    rng = np.random.default_rng(3)
    term_sets = [np.sort(rng.choice(50, size=int(rng.integers(0, 6)), replace=False)) for _ in range(40)]
    vectors = [(terms, np.ones(len(terms), np.float32)) for terms in term_sets]  # weights 1: many ties
    documents = SparseRows.from_vectors(vectors, 50)
    queries = SparseRows.from_vectors(vectors[:7], 50)
    rows, scores = InvertedIndex.build(documents).search(queries, 10)
    dense = queries.dense() @ documents.dense().T
    for q in range(7):
        expected = sorted(range(40), key=lambda d: (-dense[q, d], d))[:10]
        assert rows[q].tolist() == expected and scores[q].tolist() == dense[q, expected].tolist()


def test_reciprocal_rank_fusion_sums_one_over_k_plus_rank():
    fused = reciprocal_rank_fusion([["a", "b", "c"], ["c", "d"]], k=60)
    assert [doc for doc, _ in fused] == ["c", "a", "b", "d"]
    assert dict(fused)["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert dict(fused)["d"] == pytest.approx(1 / 62) and dict(fused)["a"] == pytest.approx(1 / 61)
    tie = reciprocal_rank_fusion([["x", "y"], ["y", "x"]], k=0)  # equal scores: first appearance first
    assert [doc for doc, _ in tie] == ["x", "y"]
    with pytest.raises(InputError, match="twice"):
        reciprocal_rank_fusion([["a", "a"]])
    with pytest.raises(InputError, match="rrf_k"):
        reciprocal_rank_fusion([["a"]], k=-1)


def test_hybrid_search_fuses_the_dense_and_sparse_folders_ranks(tiny_sparse_model, corpus, sparse_folder, tmp_path):
    dense = tmp_path / "dense"
    E.embed_corpus(tiny_sparse_model, corpus[0], dense, shard_size=6, device="cpu")
    queries = ["the lazy dog", "green hills"]
    by_dense = folder_hits(dense, queries, top_k=17, device="cpu")
    by_sparse = folder_hits(sparse_folder, queries, top_k=17, device="cpu")
    hits = hybrid_search_hits(dense, sparse_folder, queries, top_k=5, depth=17, rrf_k=60, device="cpu")
    for q in range(2):
        expected = reciprocal_rank_fusion([[h["id"] for h in by_dense[q]], [h["id"] for h in by_sparse[q]]], 60, 5)
        assert [(h["id"], h["score"]) for h in hits[q]] == [(i, pytest.approx(s)) for i, s in expected]
        for hit in hits[q]:
            assert [h["id"] for h in by_dense[q]].index(hit["id"]) + 1 == hit["dense_rank"]
            assert [h["id"] for h in by_sparse[q]].index(hit["id"]) + 1 == hit["sparse_rank"]
    shallow = hybrid_search_hits(dense, sparse_folder, queries[:1], top_k=3, depth=3, device="cpu")[0]
    assert len(shallow) == 3 and all(h["dense_rank"] is None or h["dense_rank"] <= 3 for h in shallow)
    other = tmp_path / "other.txt"
    other.write_text("\n".join(corpus[1][:9]) + "\n", encoding="utf-8")
    fewer = tmp_path / "fewer"
    E.embed_corpus(tiny_sparse_model, other, fewer, device="cpu", embedding=E.EmbedSettings(sparse=True))
    with pytest.raises(ConfigError, match="embedded different input"):
        hybrid_search_hits(dense, fewer, queries, device="cpu")
    with pytest.raises(ConfigError, match="give --index the dense folder"):
        hybrid_search_hits(sparse_folder, dense, queries, device="cpu")


def test_a_masked_lm_directory_serves_sparse_vectors_with_its_mlm_head(tiny_sparse_model, tmp_path):
    import torch

    from bertforge.families import registry
    from bertforge.families.pretraining import BertForMaskedLM
    from bertforge.families.sparse import BertForSparseEmbedding
    from bertforge.tokenization import Tokenizer
    from conftest import make_tiny_config

    tokenizer = Tokenizer.from_pretrained(tiny_sparse_model)
    torch.manual_seed(1)
    BertForMaskedLM(make_tiny_config(vocab_size=tokenizer.vocab_size)).save_pretrained(tmp_path / "mlm",
                                                                                       tokenizer=tokenizer)
    plain = load_pipeline(tmp_path / "mlm", "embed-sparse", device="cpu")
    assert isinstance(plain.model, BertForSparseEmbedding)
    model, report = registry.load_model(tmp_path / "mlm", BertForSparseEmbedding)
    assert report.fresh == []  # the MLM head is the checkpoint's, nothing starts at random
    model.save_pretrained(tmp_path / "as_sparse", tokenizer=tokenizer)
    texts = ["the pale winter moon", "green hills"]
    ours = load_pipeline(tmp_path / "as_sparse", "embed-sparse", device="cpu")(texts)
    assert plain(texts) == ours
    assert registry.class_for_tasks("BertForMaskedLM", ["embed"]) is BertForMaskedLM
