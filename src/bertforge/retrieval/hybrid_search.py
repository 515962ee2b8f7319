"""Hybrid search: a dense and a sparse embedding folder of the same input, their rankings fused by reciprocal
rank fusion (`metrics.fusion`); and `folder_hits`, the search `bertforge search` runs on one folder of either kind.

Owns: checking that two folders embed the same records (`check_same_input`: the same input files, read the
same way, the same count, so row r is the same record in both), `hybrid_search_hits` and `folder_hits`.

Each query is searched in both folders for its best `depth` rows (exactly: `vector_search`, `sparse_search`);
a row's fused score is 1 / (rrf_k + its dense rank) + 1 / (rrf_k + its sparse rank), a rank it does not have
adding nothing. The hits are the best `top_k` fused rows, with the rank each folder gave them (None: not in
that folder's first `depth`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from bertforge.errors import ConfigError
from bertforge.metrics.fusion import DEFAULT_RRF_K, check_rrf_k, reciprocal_rank_fusion
from bertforge.retrieval.sparse_search import SparseIndex, embed_sparse_queries, search_sparse_hits
from bertforge.retrieval.vector_search import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_TOP_K,
    VectorIndex,
    check_top_k,
    embed_queries,
    hits_of,
    search_hits,
)

# Rows each folder contributes per query before fusion.
DEFAULT_FUSION_DEPTH = 100


def check_same_input(dense: VectorIndex, sparse: VectorIndex) -> None:
    """ConfigError unless both folders embedded the same records in the same order."""
    if dense.kind != "dense" or sparse.kind != "sparse":
        raise ConfigError(f"hybrid search fuses a dense folder ({dense.directory}: {dense.kind}) with a sparse one "
                          f"({sparse.directory}: {sparse.kind}); give --index the dense folder (`bertforge embed`) "
                          "and --hybrid the sparse one (`bertforge embed --sparse`)")
    first, second = dense.manifest["input"], sparse.manifest["input"]
    same = (first["files"] == second["files"] and first["settings"] == second["settings"]
            and dense.count == sparse.count)
    if not same:
        raise ConfigError(f"{dense.directory} and {sparse.directory} embedded different input ({first['path']}, "
                          f"{dense.count} records; {second['path']}, {sparse.count} records): embed the same input "
                          "files with the same --format and columns into both")


def hybrid_search_hits(dense_directory: str | os.PathLike, sparse_directory: str | os.PathLike,
                       queries: Sequence[str], *, top_k: int = DEFAULT_TOP_K, rrf_k: float = DEFAULT_RRF_K,
                       depth: int = DEFAULT_FUSION_DEPTH, show_text: bool = False, field: str | None = None,
                       model: str | os.PathLike | None = None, sparse_model: str | os.PathLike | None = None,
                       device: str = "auto", batch_size: int = DEFAULT_BATCH_SIZE, prompt_name: str | None = None,
                       prompt: str | None = None, precision: str | None = None) -> list[list[dict[str, Any]]]:
    """The top-k hits of each query text by reciprocal rank fusion of a dense and a sparse folder of the same
    input, best first: {"id", "score" (the fused score), "dense_rank", "sparse_rank"} (plus the text with
    `show_text` / `field`, as `vector_search.search_hits`).

    Args:
        dense_directory, sparse_directory: the --out folders of `bertforge embed` and `bertforge embed --sparse`.
        rrf_k: the fusion constant; depth: rows each folder ranks per query (at least `top_k`).
        model, sparse_model: copies of the folders' models (default: the manifests' paths).
        prompt_name, prompt: the dense queries' prefix; sparse queries get their model's default prompt.
        device, batch_size, precision: as `vector_search.search`.

    Raises:
        ConfigError: a folder of the wrong kind, or folders of different input.
    """
    check_top_k(top_k)
    check_top_k(depth, "depth")
    check_rrf_k(rrf_k)
    dense = VectorIndex(dense_directory)
    check_same_input(dense, VectorIndex(sparse_directory))
    sparse = SparseIndex(sparse_directory)
    if not queries:
        return []
    loading = {"device": device, "batch_size": batch_size, "precision": precision}
    wide = max(depth, top_k)
    dense_vectors = embed_queries(dense, queries, model=model, prompt_name=prompt_name, prompt=prompt, **loading)
    _, dense_rows = dense.search_vectors(dense_vectors, wide)
    _, sparse_rows = sparse.search_sparse(embed_sparse_queries(sparse, queries, model=sparse_model, **loading), wide)
    k = min(top_k, dense.count)
    fused_rows = np.zeros((len(queries), k), dtype=np.int64)
    fused_scores = np.zeros((len(queries), k), dtype=np.float64)
    ranks = []
    for q, (by_dense, by_sparse) in enumerate(zip(dense_rows.tolist(), sparse_rows.tolist())):
        fused = reciprocal_rank_fusion([by_dense, by_sparse], rrf_k, top=k)
        fused_rows[q] = [row for row, _ in fused]
        fused_scores[q] = [score for _, score in fused]
        places = [{row: rank for rank, row in enumerate(ranking, start=1)} for ranking in (by_dense, by_sparse)]
        ranks.append([(places[0].get(row), places[1].get(row)) for row, _ in fused])
    hits = hits_of(dense, fused_scores, fused_rows, show_text, field)
    for query_hits, query_ranks in zip(hits, ranks):
        for hit, (dense_rank, sparse_rank) in zip(query_hits, query_ranks):
            hit.update(dense_rank=dense_rank, sparse_rank=sparse_rank)
    return hits


def folder_hits(directory: str | os.PathLike, queries: Sequence[str], *, rescore_multiplier: int | None = None,
                exact: bool = False, ef_search: int | None = None, **search: Any) -> list[list[dict[str, Any]]]:
    """`bertforge search` over one folder: dense (`vector_search.search_hits`, through its approximate index
    unless `exact`) or sparse (`sparse_search.search_sparse_hits`) as its manifest says; `search`: their
    common keywords."""
    index = VectorIndex(directory)
    if index.kind == "sparse":
        if rescore_multiplier is not None:
            raise ConfigError("--rescore-multiplier applies to binary dense folders; remove it for a sparse one")
        if ef_search is not None:
            raise ConfigError("--ef-search applies to a dense folder's approximate index; remove it for a sparse one")
        return search_sparse_hits(SparseIndex(directory), queries, **search)
    extra = {} if rescore_multiplier is None else {"rescore_multiplier": rescore_multiplier}
    return search_hits(directory, queries, exact=exact, ef_search=ef_search, **search, **extra)


__all__ = ["DEFAULT_FUSION_DEPTH", "check_same_input", "folder_hits", "hybrid_search_hits"]
