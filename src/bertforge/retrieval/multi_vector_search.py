"""Exact late-interaction search over a multi-vector folder (`bertforge embed --multi-vector`: a ColBERT model's
unit vector per document token): every document scored by MaxSim (`families.colbert.maxsim`, the one home of
it), or only a candidate list's (reranking another search's hits).

Owns: `MultiVectorIndex` (the folder opened for search: `search_tokens`, the top k of every live row, in blocks of
at most `TOKEN_BLOCK` document vectors, so that memory is bounded whatever the folder's size; `rescore`, the
MaxSim of given rows) and the window a ColBERT model's documents are embedded with (`document_window`). Its
queries are embedded with the query role by `query_embedding.embed_multi_vector_queries`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch

from bertforge.errors import ConfigError, InputError
from bertforge.families.colbert import maxsim
from bertforge.interop.colbert import is_colbert_directory, read_colbert_settings
from bertforge.retrieval.store import TokenRows, VectorFolder
from bertforge.retrieval.vector_index import block_top_k, check_top_k, top_k_merge

MULTI_VECTOR_TASK = "embed-multi-vector"
# Document token vectors scored against a block of queries at once: bounds the [Q x q, TOKEN_BLOCK] similarities.
TOKEN_BLOCK = 1 << 16
QUERY_BLOCK = 32


def document_window(model_dir: str | os.PathLike) -> int | None:
    """The window a ColBERT model's documents are read with: its document length less the marker it adds
    ([CLS] text [SEP] before the marker, as PyLate's max_seq_length); None for a directory of another model."""
    return read_colbert_settings(model_dir).document_length - 1 if is_colbert_directory(model_dir) else None


def padded_queries(queries: Sequence[np.ndarray], dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([Q, q, D] float32 query vectors, [Q, q] bool mask) of queries [q_i, D] of any lengths."""
    if any(np.ndim(q) != 2 or np.shape(q)[1] != dim or not len(q) for q in queries):
        raise InputError(f"query vectors must be [tokens, {dim}] each (at least one token), got "
                         f"{[list(np.shape(q)) for q in queries][:4]}")
    length = max(len(q) for q in queries)
    padded = torch.zeros((len(queries), length, dim), dtype=torch.float32)
    mask = torch.zeros((len(queries), length), dtype=torch.bool)
    for i, query in enumerate(queries):
        padded[i, :len(query)] = torch.from_numpy(np.asarray(query, dtype=np.float32))
        mask[i, :len(query)] = True
    return padded, mask


def block_scores(queries: torch.Tensor, mask: torch.Tensor, rows: TokenRows, start: int, stop: int) -> np.ndarray:
    """MaxSim [Q, stop - start] of padded queries against rows start..stop-1 of one shard's `TokenRows`."""
    first, last = int(rows.offsets[start]), int(rows.offsets[stop])
    tokens = torch.from_numpy(np.array(rows.tokens[first:last], dtype=np.float32))  # a copy: read from the map
    owner = torch.repeat_interleave(torch.arange(stop - start), torch.from_numpy(np.diff(rows.offsets[start:stop + 1])))
    return maxsim(queries, mask, tokens, owner, stop - start).numpy()


class MultiVectorIndex(VectorFolder):
    """A multi-vector folder opened for exact MaxSim search (shards memory-mapped, read as they are scored)."""

    def __init__(self, directory: str | os.PathLike):
        super().__init__(directory)
        if self.kind != "multi-vector":
            raise ConfigError(f"{self.directory} holds {self.kind} vectors, not a ColBERT model's token vectors "
                              "(`bertforge embed --multi-vector`)")

    def search_tokens(self, queries: Sequence[np.ndarray], top_k: int,
                      rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """([Q, k] MaxSim scores, [Q, k] global rows), best first (equal scores: lower row first), of every live
        row (and among `rows`, [count] bool, when given) for queries [q_i, D] (embedded with the query role)."""
        check_top_k(top_k)
        allowed = self.allowed(rows)
        k = min(top_k, self.live_count if allowed is None else int(allowed.sum()))
        best_scores = np.zeros((len(queries), 0), np.float32)
        best_rows = np.zeros((len(queries), 0), np.int64)
        if not queries or k == 0:
            return best_scores, best_rows
        for first_query in range(0, len(queries), QUERY_BLOCK):
            padded, mask = padded_queries(queries[first_query:first_query + QUERY_BLOCK], self.dim)
            scores_q, rows_q = best_scores[:0].reshape(len(padded), 0), best_rows[:0].reshape(len(padded), 0)
            for shard in range(len(self.shards)):
                token_rows, base = self.shard_token_rows(shard), int(self.offsets[shard])
                start = 0
                while start < len(token_rows):
                    # as many rows as fit TOKEN_BLOCK vectors (at least one)
                    stop = max(start + 1, int(np.searchsorted(token_rows.offsets, token_rows.offsets[start]
                                                              + TOKEN_BLOCK, side="right")) - 1)
                    stop = min(stop, len(token_rows))
                    scores = block_scores(padded, mask, token_rows, start, stop)
                    if allowed is not None:
                        scores = np.where(allowed[base + start:base + stop], scores, -np.inf)
                    block = block_top_k(scores, base + start, min(k, stop - start))
                    scores_q, rows_q = top_k_merge(np.concatenate([scores_q, block[0]], axis=1),
                                                   np.concatenate([rows_q, block[1]], axis=1), k)
                    start = stop
            best_scores = scores_q if first_query == 0 else np.concatenate([best_scores, scores_q])
            best_rows = rows_q if first_query == 0 else np.concatenate([best_rows, rows_q])
        return best_scores.astype(np.float32), best_rows

    def rescore(self, queries: Sequence[np.ndarray], rows: np.ndarray) -> np.ndarray:
        """MaxSim [Q, n] of each query [q_i, D] with its candidate global rows [Q, n] (another search's hits)."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(queries) != len(rows):
            raise InputError(f"{len(queries)} queries but candidates for {len(rows)}")
        if rows.size and (rows.min() < 0 or rows.max() >= self.count):
            raise InputError(f"candidate rows must be in [0, {self.count}), got {int(rows.min())}..{int(rows.max())}")
        shard_of = np.searchsorted(self.offsets, rows, side="right") - 1
        scores = np.zeros(rows.shape, dtype=np.float32)
        for q, query in enumerate(queries):
            padded, mask = padded_queries([query], self.dim)
            documents = []
            for row, shard in zip(rows[q].tolist(), shard_of[q].tolist()):
                documents.append(self.shard_token_rows(shard).row(row - int(self.offsets[shard])))
            flat = TokenRows.from_rows([np.asarray(d, dtype=np.float32) for d in documents], self.dim)
            scores[q] = block_scores(padded, mask, flat, 0, len(flat))[0] if len(flat) else scores[q]
        return scores

    def shard_token_rows(self, index: int) -> TokenRows:
        """One shard's rows, kept open for the life of the index (a search reads every shard per query block)."""
        opened = self.__dict__.setdefault("opened", {})
        if index not in opened:
            opened[index] = super().shard_token_rows(index)
        return opened[index]


__all__ = ["MULTI_VECTOR_TASK", "TOKEN_BLOCK", "MultiVectorIndex", "document_window"]
