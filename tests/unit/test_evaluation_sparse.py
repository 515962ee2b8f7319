"""Sparse and hybrid retrieval evaluators on a hand-made set whose rankings are known: a bag-of-words sparse
encoder and a dense encoder built to disagree with it, so the figures can be worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from bertforge.data.retrieval import RetrievalSet
from bertforge.errors import InputError
from bertforge.evaluation.embedding import (
    evaluate_hybrid_retrieval,
    evaluate_retrieval,
    evaluate_sparse_retrieval,
)
from bertforge.metrics.sparse import SparseRows

VOCAB = ["cat", "dog", "river", "sea", "moon", "star", "violin", "drum"]
DOCS = {"d1": "cat dog", "d2": "river sea sea", "d3": "moon star", "d4": "violin drum cat"}
QUERIES = {"q1": "cat", "q2": "sea", "q3": "star moon", "q4": "drum"}
QRELS = {"q1": {"d1": 1}, "q2": {"d2": 1}, "q3": {"d3": 1}, "q4": {"d4": 1}}


def retrieval_set() -> RetrievalSet:
    return RetrievalSet(list(DOCS), [""] * len(DOCS), list(DOCS.values()), list(QUERIES), list(QUERIES.values()),
                        QRELS)


def bag_of_words(texts: list[str]) -> SparseRows:
    """Term counts over VOCAB (the weight of a word is how often it occurs)."""
    rows = []
    for text in texts:
        words = text.split()
        terms = sorted({VOCAB.index(w) for w in words})
        rows.append((np.asarray(terms), np.asarray([words.count(VOCAB[t]) for t in terms], np.float32)))
    return SparseRows.from_vectors(rows, len(VOCAB))


def reversed_dense(texts: list[str]) -> np.ndarray:
    """A dense encoder that ranks q1's relevant document last (cat queries point away from cat documents)."""
    vectors = bag_of_words(texts).dense()
    vectors[:, 0] *= np.where(vectors[:, 1:].sum(1) == 0, -1.0, 1.0)  # a query of "cat" alone is flipped
    return vectors + 1e-3


def test_sparse_retrieval_figures_and_term_counts():
    figures = evaluate_sparse_retrieval(bag_of_words, retrieval_set(), with_title=False)
    # q1 "cat": d1 and d4 both score 1, tie by id: d1 first. Every query finds its document first.
    assert figures["ndcg@10"] == 1.0 and figures["mrr@10"] == 1.0 and figures["accuracy@1"] == 1.0
    assert figures["query_terms"] == pytest.approx(5 / 4)  # cat, sea, star+moon, drum
    assert figures["document_terms"] == pytest.approx((2 + 2 + 2 + 3) / 4)
    with pytest.raises(InputError, match="one row per text"):
        evaluate_sparse_retrieval(lambda texts: bag_of_words(texts[:-1]), retrieval_set(), with_title=False)


def test_hybrid_retrieval_fuses_each_querys_dense_and_sparse_lists():
    data = retrieval_set()
    dense_alone = evaluate_retrieval(reversed_dense, data, with_title=False)
    figures = evaluate_hybrid_retrieval(reversed_dense, bag_of_words, data, rrf_k=60, with_title=False)
    assert figures["dense_ndcg@10"] == dense_alone["ndcg@10"] < 1.0
    assert figures["sparse_ndcg@10"] == 1.0 and figures["sparse_query_terms"] == pytest.approx(5 / 4)
    # q1 "cat": dense ranks d2, d3 (cosine ~0) before d4 (-0.58) and d1 (-0.71); sparse ranks d1, d4, d2, d3.
    # Fused: d2 or d3 (1/61 + 1/63 or 1/61 + 1/64, whichever dense put first) then d1 (1/64 + 1/61, before d4's
    # 1/63 + 1/62): d1 is second. The other three queries find their document first in both lists.
    assert figures["hybrid_mrr@10"] == pytest.approx((1 / 2 + 3) / 4)
    assert figures["dense_mrr@10"] == pytest.approx((1 / 4 + 3) / 4)
    assert figures["dense_mrr@10"] < figures["hybrid_mrr@10"] <= figures["sparse_mrr@10"]
