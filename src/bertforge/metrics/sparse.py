"""Sparse vectors as rows of term weights, exact search over them through an inverted index, and the
retrieval figures of sparse vectors (numpy only).

Owns: `SparseRows` (compressed rows: each row's term ids ascending and their weights, the layout of the
sparse shards `bertforge embed --sparse` writes), `InvertedIndex` (term -> the rows holding it and their
weights; a query's scores are the dot products with every row, summed term by term over the postings of its
own terms only) and `sparse_retrieval_figures`. The figures themselves are `metrics.embedding`'s; ranking
ties go by the document-id order as there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bertforge.errors import InputError
from bertforge.metrics.embedding import (
    DEFAULT_K_VALUES,
    DEFAULT_MAP_AT,
    DEFAULT_MRR_AT,
    DEFAULT_NDCG_AT,
    id_order,
    retrieval_depth,
    retrieval_scores,
    top_k,
)

# Queries scored together: a [QUERY_BLOCK, rows] float32 block of scores.
QUERY_BLOCK = 64


@dataclass
class SparseRows:
    """N sparse vectors of width V: row i's term ids are indices[indptr[i]:indptr[i+1]] (int32, ascending),
    its weights values[...] (float32, non-zero)."""

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    width: int

    def __post_init__(self) -> None:
        self.indptr = np.asarray(self.indptr, dtype=np.int64)
        self.indices = np.asarray(self.indices, dtype=np.int32)
        self.values = np.asarray(self.values, dtype=np.float32)
        if self.indptr.ndim != 1 or len(self.indptr) < 1 or self.indptr[0] != 0 or self.indptr[-1] != len(self.indices) \
                or len(self.indices) != len(self.values) or np.any(np.diff(self.indptr) < 0):
            raise InputError("sparse rows need indptr [N + 1] from 0 to the number of terms, and one weight per term")
        if len(self.indices) and (self.indices.min() < 0 or self.indices.max() >= self.width):
            raise InputError(f"a term id lies outside the vocabulary of {self.width}")

    @classmethod
    def from_vectors(cls, vectors: Sequence[Any], width: int) -> SparseRows:
        """Rows of objects with `.indices` and `.values` (or (indices, values) pairs)."""
        pairs = [(v.indices, v.values) if hasattr(v, "indices") else v for v in vectors]
        lengths = [len(i) for i, _ in pairs]
        indptr = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        empty_i, empty_v = np.zeros(0, np.int32), np.zeros(0, np.float32)
        indices = np.concatenate([np.asarray(i, np.int32) for i, _ in pairs] or [empty_i])
        values = np.concatenate([np.asarray(v, np.float32) for _, v in pairs] or [empty_v])
        return cls(indptr, indices, values, width)

    @classmethod
    def concatenate(cls, parts: Sequence[SparseRows]) -> SparseRows:
        if not parts:
            raise InputError("no sparse rows to concatenate")
        offsets = np.cumsum([0] + [len(p.indices) for p in parts[:-1]])
        indptr = np.concatenate([[0]] + [p.indptr[1:] + o for p, o in zip(parts, offsets)])
        return cls(indptr, np.concatenate([p.indices for p in parts]), np.concatenate([p.values for p in parts]),
                   parts[0].width)

    def __len__(self) -> int:
        return len(self.indptr) - 1

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        start, stop = self.indptr[i], self.indptr[i + 1]
        return self.indices[start:stop], self.values[start:stop]

    def slice(self, start: int, stop: int) -> SparseRows:
        a, b = self.indptr[start], self.indptr[stop]
        return SparseRows(self.indptr[start:stop + 1] - a, self.indices[a:b], self.values[a:b], self.width)

    def average_terms(self) -> float:
        """The average number of non-zero terms per row (0.0 without rows)."""
        return float(len(self.indices)) / len(self) if len(self) else 0.0

    def dense(self) -> np.ndarray:
        """[N, V] float32 (small sets only: tests, checks)."""
        out = np.zeros((len(self), self.width), dtype=np.float32)
        rows = np.repeat(np.arange(len(self)), np.diff(self.indptr))
        out[rows, self.indices] = self.values
        return out


@dataclass
class InvertedIndex:
    """Postings of N sparse rows: term t's rows are rows[term_ptr[t]:term_ptr[t+1]] (ascending) with their
    weights; `count` rows in all, `width` terms."""

    term_ptr: np.ndarray
    rows: np.ndarray
    weights: np.ndarray
    count: int
    width: int

    @classmethod
    def build(cls, documents: SparseRows) -> InvertedIndex:
        """The index of `documents` (row numbers are their positions)."""
        order = np.argsort(documents.indices, kind="stable")  # by term, rows ascending within a term
        row_of = np.repeat(np.arange(len(documents), dtype=np.int64), np.diff(documents.indptr))
        counts = np.bincount(documents.indices, minlength=documents.width)
        term_ptr = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        return cls(term_ptr, row_of[order], documents.values[order], len(documents), documents.width)

    def scores(self, queries: SparseRows) -> np.ndarray:
        """Dot products [Q, N] (float32) of every query with every row, from the postings of its terms."""
        if queries.width != self.width:
            raise InputError(f"query vectors have {queries.width} terms, the index {self.width}")
        out = np.zeros((len(queries), self.count), dtype=np.float32)
        for q in range(len(queries)):
            terms, weights = queries.row(q)
            for term, weight in zip(terms.tolist(), weights.tolist()):
                start, stop = self.term_ptr[term], self.term_ptr[term + 1]
                # A row appears once per term, so plain fancy-index addition is exact here.
                out[q, self.rows[start:stop]] += np.float32(weight) * self.weights[start:stop]
        return out

    def search(self, queries: SparseRows, k: int, tie_keys: np.ndarray | None = None,
               query_block: int = QUERY_BLOCK, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(rows [Q, min(k, N)] int64, scores float32) of each query's best rows, best first; equal scores by
        ascending `tie_keys` (default: the row number). `allowed` ([N] bool): only those rows are ranked (the
        others are masked before the top-k, so k of them come back where k exist)."""
        keys = np.arange(self.count, dtype=np.int64) if tie_keys is None else tie_keys
        k = min(k, self.count if allowed is None else int(allowed.sum()))
        found_rows, found_scores = [], []
        for start in range(0, len(queries), query_block):
            scores = self.scores(queries.slice(start, min(start + query_block, len(queries))))
            if allowed is not None:
                scores[:, ~allowed] = -np.inf
            best = top_k(scores, k, keys)
            found_rows.append(best)
            found_scores.append(np.take_along_axis(scores, best, axis=1))
        if not found_rows:
            return np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)
        return np.concatenate(found_rows), np.concatenate(found_scores)


def sparse_retrieval_figures(queries: SparseRows, corpus: SparseRows, query_ids: Sequence[str],
                             doc_ids: Sequence[str], qrels: Mapping[str, Mapping[str, float]], *,
                             k_values: Sequence[int] = DEFAULT_K_VALUES, mrr_at: Sequence[int] = DEFAULT_MRR_AT,
                             ndcg_at: Sequence[int] = DEFAULT_NDCG_AT, map_at: Sequence[int] = DEFAULT_MAP_AT
                             ) -> dict[str, float]:
    """Retrieval figures of exact dot-product search of sparse vectors (`metrics.embedding.retrieval_scores`,
    ties by document id), plus `query_terms` / `document_terms`: the average number of non-zero terms."""
    ranked = rank_sparse(queries, corpus, query_ids, doc_ids, retrieval_depth(k_values, mrr_at, ndcg_at, map_at))
    figures = retrieval_scores(ranked, qrels, k_values=k_values, mrr_at=mrr_at, ndcg_at=ndcg_at, map_at=map_at)
    return {**figures, "query_terms": queries.average_terms(), "document_terms": corpus.average_terms()}


def rank_sparse(queries: SparseRows, corpus: SparseRows, query_ids: Sequence[str], doc_ids: Sequence[str],
                k: int) -> dict[str, list[str]]:
    """Each query's `k` best document ids by sparse dot product, best first (ties by document id)."""
    if len(queries) != len(query_ids) or len(corpus) != len(doc_ids):
        raise InputError(f"{len(queries)} query vectors for {len(query_ids)} ids, {len(corpus)} document vectors "
                         f"for {len(doc_ids)} ids")
    rows, _ = InvertedIndex.build(corpus).search(queries, k, id_order(list(doc_ids)))
    return {qid: [doc_ids[j] for j in row] for qid, row in zip(query_ids, rows.tolist())}
