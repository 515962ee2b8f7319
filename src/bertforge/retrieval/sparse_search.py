"""Exact top-k search over the sparse shards `bertforge embed --sparse` writes, through an inverted index
built from them and saved beside them.

Owns: `SparseIndex` (a sparse embedding folder opened for search), building the inverted index of its shards
(`build_inverted`: term -> the rows holding it, ascending, and their weights; `metrics.sparse.InvertedIndex`
scores with it), keeping it in `inverted/` beside the shards (`INVERTED_DIR`: three .npy arrays and a record
of the shards it was built from and of each array's sha256 and size; a folder whose shards changed, or an
array that is not the one saved, gets a new one, with a log line saying why; a folder that only gained shards,
`bertforge add`, gets the saved one with the new shards' postings merged in: `merge_inverted`). Queries are embedded by
`query_embedding.embed_sparse_queries` and searched through `searcher.Searcher`.

Score: the dot product of the query's and the document's term weights, summed in float32 over the query's
terms in ascending term order, one posting list at a time. Every document holding a query term is scored, so
the result is the brute-force one: the same rows with the same scores (a test pins it). Equal scores rank the
earlier record first, as dense search does.

Memory: building reads the shards twice (counting the postings of each term, then placing them), holding the
index itself ([terms] int64 pointers, [non-zero entries] rows and weights) and one shard; searching maps the
saved index from disk and scores a block of queries at a time against every row (at most `SCORE_BUDGET`
floats).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from bertforge import storage
from bertforge.errors import ConfigError
from bertforge.metrics.sparse import InvertedIndex, SparseRows
from bertforge.retrieval.index_sources import file_records, files_problem
from bertforge.retrieval.store import SPARSE_KINDS
from bertforge.retrieval.vector_index import DEFAULT_TOP_K, VectorIndex, check_top_k

log = logging.getLogger(__name__)

INVERTED_DIR = "inverted"
INVERTED_RECORD = "inverted.json"
INVERTED_ARRAYS = ("term_ptr", "rows", "weights")
# Scores held at once while searching: [query block, rows] float32 (2**24 floats: 64 MiB).
SCORE_BUDGET = 1 << 24


class SparseIndex(VectorIndex):
    """A complete sparse embedding folder, opened for search; its inverted index is built (and saved) at the
    first `inverted()` and read from disk afterwards.

    Raises:
        ConfigError: not a complete embedding folder, or one of dense vectors.
    """

    def __init__(self, directory: str | os.PathLike):
        super().__init__(directory)
        if self.kind != "sparse":
            raise ConfigError(f"{self.directory} holds dense vectors; sparse search needs a folder of "
                              "`bertforge embed --sparse`")
        self._inverted: InvertedIndex | None = None

    def source_record(self) -> dict[str, Any]:
        """What the saved index was built from: each shard's checksums, the row count and the width."""
        return {"shards": self.checksums(SPARSE_KINDS),
                "count": self.count, "width": self.dim}

    def inverted(self) -> InvertedIndex:
        """The inverted index of the folder's shards: the saved one when it was built from these shards, else
        built now and saved in `inverted/` (atomically: a concurrent search builds the same one)."""
        if self._inverted is None:
            self._inverted = self.load_inverted() or self.save_inverted(build_inverted(self))
        return self._inverted

    def load_inverted(self) -> InvertedIndex | None:
        """The saved inverted index when it was built from these shards and its files are the ones saved
        (`index_sources.files_problem`); else None, after a log line saying why it is built again."""
        folder = self.directory / INVERTED_DIR
        if not folder.is_dir():
            return None
        try:
            record = storage.read_json(folder / INVERTED_RECORD, what="inverted index record")
            first = self.appended_from(record)
            if not isinstance(record, dict) or (record.get("source") != self.source_record() and first is None):
                problem = "it was built from other shards than the folder holds now"
            else:
                problem = files_problem(folder, record.get("files"), INVERTED_RECORD)
            if problem is None:
                arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r", allow_pickle=False)
                          for name in INVERTED_ARRAYS}
                count = self.count if first is None else int(self.offsets[first])
                saved = InvertedIndex(arrays["term_ptr"], arrays["rows"], arrays["weights"], count, self.dim)
                if first is None:
                    return saved
                # shards added since (`bertforge add`): their postings merged in, the old ones not read again
                return self.save_inverted(merge_inverted(saved, build_inverted(self, first)))
        except (OSError, ValueError) as error:
            problem = str(error)
        log.warning("%s: %s; building the inverted index again from the shards", folder, problem)
        return None

    def appended_from(self, record: Any) -> int | None:
        """The shards a saved index was built from when the folder's later shards were added since, else None."""
        source = record.get("source") if isinstance(record, dict) else None
        shards = source.get("shards") if isinstance(source, dict) else None
        current = self.checksums(SPARSE_KINDS)
        if (isinstance(shards, list) and 0 < len(shards) < len(current) and shards == current[:len(shards)]
                and source.get("width") == self.dim):
            return len(shards)
        return None

    def save_inverted(self, index: InvertedIndex) -> InvertedIndex:
        try:
            with storage.atomic_directory(self.directory / INVERTED_DIR) as tmp:
                for name in INVERTED_ARRAYS:
                    with open(tmp / f"{name}.npy", "wb") as handle:
                        np.save(handle, getattr(index, name), allow_pickle=False)
                files = file_records(tmp, [f"{name}.npy" for name in INVERTED_ARRAYS])
                storage.write_json(tmp / INVERTED_RECORD, {"source": self.source_record(),
                                                           "postings": int(len(index.rows)), "files": files})
        except OSError as error:  # a read-only folder still searches, with the index built in memory
            log.warning("%s: the inverted index could not be saved (%s); it is rebuilt at each search",
                        self.directory, error)
        return index

    def search_sparse(self, queries: SparseRows, top_k: int = DEFAULT_TOP_K,
                      rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """([Q, k] scores, [Q, k] global rows) of each query's best rows, best first (equal scores: lower row),
        among the live rows (`VectorFolder.live`) that are also in `rows` ([count] bool; None: all).

        Raises:
            ConfigError: the queries are of another vocabulary than the folder's.
        """
        check_top_k(top_k)
        if queries.width != self.dim:
            raise ConfigError(f"query vectors have {queries.width} terms, {self.directory} holds vectors of "
                              f"{self.dim}: embed the queries with the folder's model")
        block = max(1, min(64, SCORE_BUDGET // max(1, self.count)))
        found, scores = self.inverted().search(queries, top_k, query_block=block, allowed=self.allowed(rows))
        return scores, found


def merge_inverted(old: InvertedIndex, new: InvertedIndex) -> InvertedIndex:
    """One inverted index of two over consecutive rows (`new`'s rows all after `old`'s): each term's postings
    are old's then new's, so rows stay ascending; the result equals `build_inverted` over all the shards."""
    old_counts, new_counts = np.diff(old.term_ptr), np.diff(new.term_ptr)
    term_ptr = np.concatenate([[0], np.cumsum(old_counts + new_counts)]).astype(np.int64)
    rows = np.empty(int(term_ptr[-1]), dtype=np.int32 if new.count < 2**31 else np.int64)
    weights = np.empty(len(rows), dtype=np.float32)
    terms = np.arange(old.width)
    for part, counts, before in ((old, old_counts, np.zeros_like(old_counts)), (new, new_counts, old_counts)):
        term_of = np.repeat(terms, counts)  # each posting's term; `before`: the term's postings placed ahead
        places = term_ptr[term_of] + before[term_of] + np.arange(len(term_of)) - part.term_ptr[term_of]
        rows[places] = part.rows
        weights[places] = part.weights
    return InvertedIndex(term_ptr, rows, weights, new.count, new.width)


def build_inverted(index: SparseIndex, first: int = 0) -> InvertedIndex:
    """The inverted index of the shards of `index` from shard `first` on, rows numbered across all shards,
    each term's rows ascending.

    Two passes over the shards: the first counts each term's postings (so each term's slot is known), the
    second places each shard's entries, grouped by term (stable: rows stay ascending), at its terms' cursors."""
    width = index.dim
    counts = np.zeros(width, dtype=np.int64)
    for shard in range(first, len(index.shards)):
        counts += np.bincount(index.shard_rows(shard).indices, minlength=width)
    term_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    total = int(term_ptr[-1])
    rows = np.empty(total, dtype=np.int32 if index.count < 2**31 else np.int64)
    weights = np.empty(total, dtype=np.float32)
    cursor = term_ptr[:-1].copy()
    for shard in range(first, len(index.shards)):
        part = index.shard_rows(shard)
        order = np.argsort(part.indices, kind="stable")
        terms = part.indices[order]
        group = np.searchsorted(terms, terms, side="left")  # each entry's group start among equal terms
        places = cursor[terms] + (np.arange(len(terms)) - group)
        row_of = np.repeat(np.arange(len(part), dtype=np.int64) + int(index.offsets[shard]), np.diff(part.indptr))
        rows[places] = row_of[order]
        weights[places] = part.values[order]
        cursor += np.bincount(part.indices, minlength=width)
    log.info("%s: inverted index of %d rows, %d postings", index.directory, index.count, total)
    return InvertedIndex(term_ptr, rows, weights, index.count, width)


__all__ = ["INVERTED_DIR", "SparseIndex", "build_inverted", "merge_inverted"]
