"""An embedding folder opened for exact top-k search over its vector shards: every stored vector is
scored, none is skipped.

Owns: `VectorIndex` (a `store.VectorFolder` that scores its shards, memory-mapped one at a time) and the
running top-k (`top_k_merge`, `block_top_k`, `VectorIndex.search_vectors`); winning rows map back to their ids,
spans or other per-row lines through the folder (`VectorFolder.lines_at`). Embedding the queries and the `search` entry points are `vector_search`'s;
the approximate index (`vector_ann`) builds on this module.

Score: the dot product of the query vector and the stored vector, in float32 (float16 shards are widened
block by block). When the corpus was embedded with `normalize` (the manifest's "similarity": "cosine"), both
sides are unit vectors and the score is their cosine; without it, it is the plain dot product. Equal scores
rank the earlier record (lower shard, lower row) first, so the answer does not depend on the shard layout.
int8 and binary folders are scored with the float query against their codes (`vector_quantization`): int8
the dot product with the dequantized vector, binary a scan by sign then an int8 rescoring of the candidates.

Integrity: every shard file has the size the manifest records when the folder is opened, and its sha256 the
first time it is read (`index_sources`); a file that differs is refused, naming it and how to rewrite it.

Memory: one block of one shard (at most `BLOCK_ROWS` rows, as float32), the queries' block of scores, and k
(score, row) pairs per query; ids are read only for the winners, one ids file at a time.
"""

from __future__ import annotations

import numpy as np

from bertforge.errors import ConfigError, InputError
from bertforge.retrieval.store import VectorFolder
from bertforge.retrieval.vector_quantization import (
    DEFAULT_RESCORE_MULTIPLIER,
    binary_scores,
    int8_scores,
    rescore,
)

# Rows of a shard scored at once (float32 copies of float16 shards, and the [queries, rows] score block).
BLOCK_ROWS = 16_384
# Queries scored together against a block: bounds the score block at QUERY_BLOCK x BLOCK_ROWS floats.
QUERY_BLOCK = 256
DEFAULT_TOP_K = 10


def top_k_merge(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best (score, row) of each query among candidates, best first; equal scores: lower row first.

    Args:
        scores: [Q, C] candidate scores.
        rows: [Q, C] their global row numbers (int64).
        k: how many to keep (at most C).

    Returns:
        ([Q, k] scores, [Q, k] rows).
    """
    order = np.lexsort((rows, -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(rows, order, axis=1)


def block_top_k(scores: np.ndarray, first_row: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best of one block of scores [Q, n] (rows first_row .. first_row + n - 1), ties included exactly:
    every candidate scoring at least the k-th best is kept before the tie-breaking sort."""
    count = scores.shape[1]
    rows = np.broadcast_to(np.arange(first_row, first_row + count, dtype=np.int64), scores.shape)
    if k >= count:
        return top_k_merge(scores, np.ascontiguousarray(rows), count)
    kth = np.partition(scores, count - k, axis=1)[:, count - k][:, None]  # [Q, 1] the k-th best score
    query, column = np.nonzero(scores >= kth)  # row-major: grouped by query
    # Rank candidates inside each query (score desc, row asc); keep the first k of each.
    order = np.lexsort((column, -scores[query, column], query))
    query, column = query[order], column[order]
    starts = np.searchsorted(query, np.arange(scores.shape[0]))
    keep = np.arange(len(query)) - starts[query] < k
    query, column = query[keep], column[keep]
    return scores[query, column].reshape(-1, k), (column + first_row).astype(np.int64).reshape(-1, k)


def check_top_k(top_k: int, name: str = "top_k") -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise InputError(f"{name} must be a positive integer, got {top_k!r}")


class VectorIndex(VectorFolder):
    """A complete embedding folder, opened for exact search (nothing is loaded until `search_vectors` scans it).

    Args:
        directory: the `--out` folder of `bertforge embed`.

    Raises:
        ConfigError: no manifest, an unfinished run, or a shard file missing.
    """

    def score_block(self, queries: np.ndarray, block: np.ndarray) -> np.ndarray:
        """[Q, n] scores of float queries against a block of stored rows, by the folder's dtype (module
        docstring of `vector_quantization`)."""
        dtype = self.manifest["dtype"]
        if dtype == "int8":
            return int8_scores(queries, block, self.manifest["calibration"])
        if dtype == "binary":
            return binary_scores(queries, block, self.dim)
        return queries @ np.asarray(block, dtype=np.float32).T

    def search_vectors(self, queries: np.ndarray, top_k: int = DEFAULT_TOP_K,
                       rescore_multiplier: int = DEFAULT_RESCORE_MULTIPLIER,
                       rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The top-k rows of every query vector, scanning the shards one at a time: exact for float shards,
        the dot product with the dequantized document for int8 ones; binary ones are scanned by sign, and
        their best `rescore_multiplier` x k rows rescored by their int8 codes. Deleted rows (`VectorFolder.live`)
        and rows outside `rows` are masked before the top-k, so the hits are the top-k of the rows allowed.

        Args:
            queries: [Q, H] float32 query vectors (embedded as the corpus was).
            top_k: hits per query (capped at the number of rows allowed).
            rows: [count] bool, the rows a hit may be (None: every live row).

        Returns:
            ([Q, k] scores, [Q, k] global row numbers), best first.
        """
        if self.kind != "dense":
            raise ConfigError(f"{self.directory} holds {self.kind} vectors: search it with "
                              f"`retrieval.{'sparse_search' if self.kind == 'sparse' else 'multi_vector_search'}` "
                              "(`bertforge search` picks it by the folder)")
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise InputError(f"query vectors must be [Q, {self.dim}], got {list(queries.shape)}")
        check_top_k(top_k)
        check_top_k(rescore_multiplier, "rescore_multiplier")
        allowed = self.allowed(rows)
        available = self.count if allowed is None else int(allowed.sum())
        k = min(top_k, available)
        binary = self.manifest["dtype"] == "binary"
        wide = min(k * rescore_multiplier, available) if binary else k
        best = (np.full((len(queries), 0), -np.inf, np.float32), np.zeros((len(queries), 0), np.int64))
        if k == 0:  # every row deleted, or none allowed
            return best
        for index in range(len(self.shards)):
            vectors = self.shard_vectors(index)
            for start in range(0, len(vectors), BLOCK_ROWS):
                block = vectors[start:start + BLOCK_ROWS]
                first = int(self.offsets[index]) + start
                mask = None if allowed is None else allowed[first:first + len(block)]
                best = self._merge_block(queries, block, first, best, wide, mask)
        if binary:
            scores = rescore(queries, best[1], self.codes_at, self.manifest["calibration"])
            best = top_k_merge(scores, best[1], k)
        return best

    def codes_at(self, rows: np.ndarray) -> np.ndarray:
        """The int8 codes [len(rows), H] of sorted global rows of a binary folder (only their rows are read)."""
        shard_of = np.searchsorted(self.offsets, rows, side="right") - 1
        parts = [np.asarray(self.shard_vectors(int(shard), "codes")[rows[shard_of == shard] - self.offsets[shard]])
                 for shard in np.unique(shard_of)]
        return np.concatenate(parts) if parts else np.zeros((0, self.dim), np.int8)

    def _merge_block(self, queries: np.ndarray, block: np.ndarray, first: int, best: tuple[np.ndarray, np.ndarray],
                     k: int, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        scores, rows = [], []
        for q in range(0, len(queries), QUERY_BLOCK):
            block_scores = self.score_block(queries[q:q + QUERY_BLOCK], block)
            if mask is not None:  # a masked row ranks below every allowed one: k allowed rows exist in all
                block_scores[:, ~mask] = -np.inf
            found = block_top_k(block_scores, first, k)  # [q, n] -> [q, k']
            merged = top_k_merge(np.concatenate([best[0][q:q + QUERY_BLOCK], found[0]], axis=1),
                                 np.concatenate([best[1][q:q + QUERY_BLOCK], found[1]], axis=1), k)
            scores.append(merged[0])
            rows.append(merged[1])
        return np.concatenate(scores), np.concatenate(rows)
