"""Top-k search over the vector shards `embed_corpus` writes: every stored vector is scored, none is
skipped (an approximate index is `vector_ann`; `search_hits` uses it when the folder has one).

Owns: opening an embedding folder for search (`VectorIndex`: the complete manifest, its shards memory-mapped
one at a time), the running top-k (`top_k_merge`, `search_vectors`), mapping winning rows back to their ids
(`ids_at`), and `search`, which embeds query texts with the model and options the manifest records and
returns (id, score) lists.

Score: the dot product of the query vector and the stored vector, in float32 (float16 shards are widened
block by block). When the corpus was embedded with `normalize` (the manifest's "similarity": "cosine"), both
sides are unit vectors and the score is their cosine; without it, it is the plain dot product. Equal scores
rank the earlier record (lower shard, lower row) first, so the answer does not depend on the shard layout.
int8 and binary folders are scored with the float query against their codes (`vector_quantization`): int8
the dot product with the dequantized vector, binary a scan by sign then an int8 rescoring of the candidates.

Memory: one block of one shard (at most `BLOCK_ROWS` rows, as float32), the queries' block of scores, and k
(score, row) pairs per query; ids are read only for the winners, one ids file at a time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.errors import ConfigError, InputError
from bertforge.inference.embed_corpus import MANIFEST_NAME, model_fingerprint, read_manifest
from bertforge.inference.pipelines import DEFAULT_BATCH_SIZE, load_pipeline
from bertforge.inference.vector_quantization import (
    DEFAULT_RESCORE_MULTIPLIER,
    binary_scores,
    int8_scores,
    rescore,
)
from bertforge.inference.vector_texts import record_texts

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


class VectorIndex:
    """A complete embedding folder, opened for search (nothing is loaded until `search_vectors` scans it).

    Args:
        directory: the `--out` folder of `bertforge embed`.

    Raises:
        ConfigError: no manifest, an unfinished run, or a shard file missing.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        manifest = read_manifest(self.directory) if self.directory.is_dir() else None
        if manifest is None:
            raise ConfigError(f"{self.directory}: no {MANIFEST_NAME}; give the folder `bertforge embed --out` wrote")
        if not manifest["complete"]:
            raise ConfigError(f"{self.directory}: the embedding run has not finished; rerun the same `bertforge "
                              "embed` command to complete it")
        for shard in manifest["shards"]:
            for kind in shard["bytes"]:
                if not (self.directory / shard[kind]).is_file():
                    raise ConfigError(f"{self.directory / shard[kind]} is missing; rerun `bertforge embed` to "
                                      "rewrite it")
        self.manifest = manifest
        self.shards: list[dict[str, Any]] = manifest["shards"]
        self.offsets = np.cumsum([0] + [shard["count"] for shard in self.shards])  # global row of each shard
        self.count = int(self.offsets[-1])
        self.dim = int(manifest["dim"])

    @property
    def kind(self) -> str:
        """"dense" (vectors) or "sparse" (`bertforge embed --sparse`: compressed rows of term weights)."""
        return self.manifest.get("kind", "dense")

    @property
    def similarity(self) -> str:
        """"cosine" (the vectors are normalized) or "dot"."""
        return self.manifest["similarity"]

    def shard_vectors(self, index: int, kind: str = "vectors") -> np.ndarray:
        """Shard `index`'s stored vectors (float [n, H], int8 codes [n, H] or sign bits [n, H / 8]; `kind`
        "codes": a binary shard's int8 codes), memory-mapped (read from disk as they are used)."""
        return np.load(self.directory / self.shards[index][kind], mmap_mode="r", allow_pickle=False)

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
                       rescore_multiplier: int = DEFAULT_RESCORE_MULTIPLIER) -> tuple[np.ndarray, np.ndarray]:
        """The top-k rows of every query vector, scanning the shards one at a time: exact for float shards,
        the dot product with the dequantized document for int8 ones; binary ones are scanned by sign, and
        their best `rescore_multiplier` x k rows rescored by their int8 codes.

        Args:
            queries: [Q, H] float32 query vectors (embedded as the corpus was).
            top_k: hits per query (capped at the number of vectors).

        Returns:
            ([Q, k] scores, [Q, k] global row numbers), best first.
        """
        if self.kind == "sparse":
            raise ConfigError(f"{self.directory} holds sparse vectors: search it with `inference.sparse_search` "
                              "(`bertforge search` picks it by the folder)")
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise InputError(f"query vectors must be [Q, {self.dim}], got {list(queries.shape)}")
        check_top_k(top_k)
        check_top_k(rescore_multiplier, "rescore_multiplier")
        k = min(top_k, self.count)
        binary = self.manifest["dtype"] == "binary"
        wide = min(k * rescore_multiplier, self.count) if binary else k
        best = (np.full((len(queries), 0), -np.inf, np.float32), np.zeros((len(queries), 0), np.int64))
        for index in range(len(self.shards)):
            vectors = self.shard_vectors(index)
            for start in range(0, len(vectors), BLOCK_ROWS):
                block = vectors[start:start + BLOCK_ROWS]
                first = int(self.offsets[index]) + start
                best = self._merge_block(queries, block, first, best, wide)
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

    def _merge_block(self, queries: np.ndarray, block: np.ndarray, first: int,
                     best: tuple[np.ndarray, np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
        scores, rows = [], []
        for q in range(0, len(queries), QUERY_BLOCK):
            found = block_top_k(self.score_block(queries[q:q + QUERY_BLOCK], block), first, k)  # [q, n] -> [q, k']
            merged = top_k_merge(np.concatenate([best[0][q:q + QUERY_BLOCK], found[0]], axis=1),
                                 np.concatenate([best[1][q:q + QUERY_BLOCK], found[1]], axis=1), k)
            scores.append(merged[0])
            rows.append(merged[1])
        return np.concatenate(scores), np.concatenate(rows)

    def ids_at(self, rows: np.ndarray) -> list[list[str]]:
        """The ids of global rows [Q, k], reading only the ids files that hold one of them."""
        return self.lines_at(rows, "ids")

    def spans_at(self, rows: np.ndarray) -> list[list[list[int]]]:
        """[record, start, end] of global rows [Q, k] of an `embed --chunk` folder (its spans files)."""
        return self.lines_at(rows, "spans")

    def lines_at(self, rows: np.ndarray, kind: str) -> list[list[Any]]:
        """The JSON lines of global rows [Q, k] in the shards' `kind` files, reading only those that hold one."""
        wanted = sorted({int(row) for row in np.asarray(rows).ravel()})
        found: dict[int, str] = {}
        shard_of = np.searchsorted(self.offsets, wanted, side="right") - 1
        for shard in sorted(set(shard_of.tolist())):
            needed = {row - int(self.offsets[shard]) for row, s in zip(wanted, shard_of) if s == shard}
            with open(self.directory / self.shards[shard][kind], encoding="utf-8") as handle:
                for line_index, line in enumerate(handle):
                    if line_index in needed:
                        found[line_index + int(self.offsets[shard])] = json.loads(line)
        return [[found[int(row)] for row in query_rows] for query_rows in np.asarray(rows)]


def query_pipeline(index: VectorIndex, *, model: str | os.PathLike | None = None, device: str = "auto",
                   batch_size: int = DEFAULT_BATCH_SIZE, precision: str | None = None,
                   task: str = "embed") -> tuple[Any, dict[str, Any]]:
    """(pipeline, options) that embed queries as the corpus was: the manifest's model (or `model`, the same
    files), window, options and precision (`precision` None: the corpus's); `task` "embed" or "embed-sparse".

    Raises:
        ConfigError: `model` is missing or another model than the corpus's.
    """
    manifest = index.manifest
    model_dir = Path(model) if model is not None else Path(manifest["model"]["path"])
    if not model_dir.is_dir():
        raise ConfigError(f"{model_dir}: the model that embedded {index.directory} is not there; pass --model DIR "
                          "with a copy of it")
    if model_fingerprint(model_dir) != manifest["model"]["fingerprint"]:
        raise ConfigError(f"{model_dir} is not the model that embedded {index.directory} ({manifest['model']['path']}"
                          "); queries must be embedded by the same model")
    embedding = dict(manifest["embedding"])
    embedding.pop("prompt")  # the corpus's; the queries have their own
    corpus_precision = embedding.pop("precision")
    pipeline = load_pipeline(model_dir, task, device=device, precision=precision or corpus_precision,
                             batch_size=batch_size, max_length=embedding.pop("max_length"))
    return pipeline, embedding


def embed_queries(index: VectorIndex, queries: Sequence[str], *, prompt_name: str | None = None,
                  prompt: str | None = None, **loading: Any) -> np.ndarray:
    """Query vectors [Q, D] float32, embedded as the corpus was (`query_pipeline`: model, device, batch_size,
    precision; see `search`)."""
    pipeline, embedding = query_pipeline(index, **loading)
    return pipeline.encode(list(queries), prompt_name=prompt_name, prompt=prompt, **embedding)  # [Q, D]


def hits_of(index: VectorIndex, scores: np.ndarray, rows: np.ndarray, show_text: bool = False,
            field: str | None = None) -> list[list[dict[str, Any]]]:
    """Each query's hits {"id", "score"} from its best rows [Q, k] and their scores, best first (plus "text"
    with `show_text`, or the record's `field`: read back from the input, `vector_texts.record_texts`)."""
    ids = index.ids_at(rows)
    hits = [[{"id": ident, "score": float(score)} for ident, score in zip(query_ids, query_scores)]
            for query_ids, query_scores in zip(ids, scores)]
    chunked = index.manifest.get("chunking") is not None  # `embed --chunk`: a row is a chunk of its record
    spans = index.spans_at(rows) if chunked else [[[int(row), None, None] for row in query] for query in rows]
    if chunked:
        for query_hits, query_spans in zip(hits, spans):
            for hit, (_, start, end) in zip(query_hits, query_spans):
                hit["span"] = [start, end]  # the chunk's characters of its record's text
    if show_text or field is not None:
        texts = record_texts(index.manifest, {span[0] for query in spans for span in query}, field)
        for query_hits, query_spans in zip(hits, spans):
            for hit, (record, start, end) in zip(query_hits, query_spans):
                # --show-text of a chunk: its own text; --field: the whole record's value
                hit[field if field is not None else "text"] = texts[record][start:end] if field is None \
                    else texts[record]
    return hits


def search_hits(directory: str | os.PathLike, queries: Sequence[str], *, top_k: int = DEFAULT_TOP_K,
                show_text: bool = False, field: str | None = None,
                rescore_multiplier: int = DEFAULT_RESCORE_MULTIPLIER, exact: bool = False,
                ef_search: int | None = None, **embedding: Any) -> list[list[dict[str, Any]]]:
    """The top-k hits of each query text, best first, as {"id", "score"} (plus "text" with `show_text`, or
    the record's `field`: read back from the input, `vector_texts.record_texts`); `rescore_multiplier`: see
    `VectorIndex.search_vectors`. A folder with an approximate index (`bertforge index`) is searched through
    it (`vector_ann`, `ef_search` candidates) unless `exact`.

    `embedding`: how the queries are embedded (`embed_queries`: model, device, batch_size, prompt_name,
    prompt, precision).
    """
    index = VectorIndex(directory)
    check_top_k(top_k)
    if not queries:
        return []
    from bertforge.inference.vector_ann import open_ann  # it builds on this module

    ann = None if exact else open_ann(index)  # before the model loads: a stale index fails fast
    vectors = embed_queries(index, queries, **embedding)
    scores, rows = (ann.search_vectors(vectors, top_k, ef_search) if ann is not None
                    else index.search_vectors(vectors, top_k, rescore_multiplier))
    return hits_of(index, scores, rows, show_text, field)


def search(directory: str | os.PathLike, queries: Sequence[str], *, top_k: int = DEFAULT_TOP_K,
           model: str | os.PathLike | None = None, device: str = "auto", batch_size: int = DEFAULT_BATCH_SIZE,
           prompt_name: str | None = None, prompt: str | None = None,
           precision: str | None = None, exact: bool = False) -> list[list[tuple[str, float]]]:
    """The top-k (id, score) of each query text in an embedding folder, best first (through its approximate
    index when it has one, unless `exact`).

    The queries are embedded as the corpus was: the manifest's pooling, normalize, layer, max_length and
    precision (or `precision`, e.g. "int8" on a CPU), with its model (or `model`, which must hold the same
    files: a moved copy). Their prompt is their own: `prompt_name` / `prompt`, else the model's default prompt
    (`EmbedPipeline.prompt_text`), so an asymmetric model embeds its corpus with e.g. prompt_name="document"
    and its queries with "query".

    Args:
        directory: the `--out` folder of `bertforge embed`.
        queries: query texts.
        top_k: hits per query.
        model: the model directory (default: the manifest's path).
        device, batch_size: where and in what batches the queries are embedded.
        prompt_name, prompt: the queries' prefix (default: the model's default prompt).
        precision: the queries' precision (default: the corpus's).

    Raises:
        ConfigError: the folder is not a complete index, or `model` is another model than the corpus's.
    """
    hits = search_hits(directory, queries, top_k=top_k, model=model, device=device, batch_size=batch_size,
                       prompt_name=prompt_name, prompt=prompt, precision=precision, exact=exact)
    return [[(hit["id"], hit["score"]) for hit in query_hits] for query_hits in hits]


__all__ = ["DEFAULT_TOP_K", "VectorIndex", "block_top_k", "embed_queries", "hits_of", "query_pipeline", "search",
           "search_hits", "top_k_merge"]
