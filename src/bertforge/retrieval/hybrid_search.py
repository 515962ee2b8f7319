"""`bertforge search`'s entry points over sparse, multi-vector and hybrid folders (any two or all three kinds,
fused), over one folder of any kind, and reranking by a multi-vector folder: the queries embedded with pipelines of their own
(`query_embedding.embed_query_vectors`), then searched through `searcher.Searcher` (the one search path; hybrid
fusion and reranking are described there).

Owns: `search_sparse_hits`, `multi_vector_hits`, `fused_hits` (`hybrid_search_hits`: dense and sparse), `reranked_hits` and `folder_hits` (which
of them a folder takes, and the flags that do not apply to it), and `collection_hits` (a Qdrant collection,
searched there).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from bertforge.errors import ConfigError
from bertforge.metrics.fusion import DEFAULT_RRF_K, check_rrf_k
from bertforge.retrieval.qdrant_collection import QdrantSearcher
from bertforge.retrieval.query_embedding import embed_query_vectors
from bertforge.retrieval.searcher import DEFAULT_FUSION_DEPTH, Searcher, check_same_input
from bertforge.retrieval.store import VectorFolder
from bertforge.retrieval.vector_search import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_TOP_K,
    check_top_k,
    search_hits,
)


def search_sparse_hits(directory: str | os.PathLike, queries: Sequence[str], *, top_k: int = DEFAULT_TOP_K,
                       show_text: bool = False, field: str | None = None, filter: Any = None, **embedding: Any,
                       ) -> list[list[dict[str, Any]]]:
    """The top-k hits {"id", "score"} of each query text in a sparse folder, best first (`show_text` / `field` /
    `filter` as `vector_search.search_hits`); the queries are embedded by `query_embedding.embed_sparse_queries`
    (`embedding`: model, device, batch_size, prompt_name, prompt, precision)."""
    check_top_k(top_k)
    searcher = Searcher(sparse=directory)
    checked = searcher.check_filter(filter)
    if not queries:
        return []
    return searcher.search(embed_query_vectors(searcher, queries, **embedding), top_k, show_text=show_text,
                           field=field, filter=checked)


def multi_vector_hits(directory: str | os.PathLike, queries: Sequence[str], *, top_k: int = DEFAULT_TOP_K,
                      show_text: bool = False, field: str | None = None, filter: Any = None, **embedding: Any,
                      ) -> list[list[dict[str, Any]]]:
    """The top-k hits {"id", "score"} of each query text in a multi-vector folder by exact MaxSim, best first
    (`show_text` / `field` / `filter` as `vector_search.search_hits`); the queries are embedded with the query role
    by the folder's model (`embedding`: model, device, batch_size, prompt_name, prompt, precision)."""
    check_top_k(top_k)
    searcher = Searcher(multi_vector=directory)
    checked = searcher.check_filter(filter)
    if not queries:
        return []
    return searcher.search(embed_query_vectors(searcher, queries, **embedding), top_k, show_text=show_text,
                           field=field, filter=checked)


def reranked_hits(directories: Sequence[str | os.PathLike], multi_vector: str | os.PathLike, queries: Sequence[str],
                  *, top_k: int = DEFAULT_TOP_K, depth: int = DEFAULT_FUSION_DEPTH, sparse_model: Any = None,
                  **search: Any) -> list[list[dict[str, Any]]]:
    """The top-k hits of each query text among the best `depth` of a dense or sparse folder (or several folders
    of the same input, fused: `fused_hits`), reranked by their MaxSim in a multi-vector folder of that input:
    {"id", "score" (the MaxSim), "first_rank"} (plus each fused kind's rank, "dense_rank" ...). `search`: the
    first stage's keywords (model, device, batch_size, prompt_name, prompt, precision, show_text, field, filter,
    exact, ef_search, rescore_multiplier, rrf_k)."""
    check_top_k(top_k)
    check_top_k(depth, "depth")
    if not directories:
        raise ConfigError("reranking takes a dense or sparse folder (or several, fused) and a multi-vector folder "
                          f"(`bertforge embed --multi-vector`) of the same input; got only {multi_vector}")
    searcher = Searcher.of_folders(directories, rerank=multi_vector, exact=search.pop("exact", False))
    search["filter"] = searcher.check_filter(search.get("filter"))
    if not queries:
        return []
    loading = {k: search.pop(k) for k in ("model", "device", "batch_size", "prompt_name", "prompt", "precision")
               if k in search}
    vectors = embed_query_vectors(searcher, queries, sparse_model=sparse_model, **loading)
    return searcher.search(vectors, top_k, depth=depth, **search)


def fused_hits(directories: Sequence[str | os.PathLike], queries: Sequence[str], *, top_k: int = DEFAULT_TOP_K,
               rrf_k: float = DEFAULT_RRF_K, depth: int = DEFAULT_FUSION_DEPTH, show_text: bool = False,
               field: str | None = None, model: str | os.PathLike | None = None,
               sparse_model: str | os.PathLike | None = None, device: str = "auto",
               batch_size: int = DEFAULT_BATCH_SIZE, prompt_name: str | None = None, prompt: str | None = None,
               precision: str | None = None, filter: Any = None) -> list[list[dict[str, Any]]]:
    """The top-k hits of each query text by reciprocal rank fusion of two or three folders of different kinds
    (dense, sparse, multi-vector) and the same input, best first: {"id", "score" (the fused score), and each
    kind's rank: "dense_rank", "sparse_rank", "multi_vector_rank"} (plus the text with `show_text` / `field`, as
    `vector_search.search_hits`; `filter`: every folder ranks only the rows that meet it).

    Args:
        directories: the --out folders of `bertforge embed`, `embed --sparse`, `embed --multi-vector`, any order.
        rrf_k: the fusion constant; depth: rows each folder ranks per query (at least `top_k`).
        model: a copy of the first kind's model (dense, else sparse); sparse_model: of the sparse folder's model
            when it is not the first (default: the manifests' paths).
        prompt_name, prompt: the first kind's queries' prefix; the others get their model's default prompt.
        device, batch_size, precision: as `vector_search.search`.

    Raises:
        ConfigError: fewer than two folders, two of a kind, or folders of different input.
    """
    check_top_k(top_k)
    check_top_k(depth, "depth")
    check_rrf_k(rrf_k)
    if len(directories) < 2:
        raise ConfigError(f"hybrid search fuses two or three folders of different kinds; got {len(directories)}")
    searcher = Searcher.of_folders(directories)
    checked = searcher.check_filter(filter)
    if not queries:
        return []
    vectors = embed_query_vectors(searcher, queries, model=model, sparse_model=sparse_model, device=device,
                                  batch_size=batch_size, prompt_name=prompt_name, prompt=prompt, precision=precision)
    return searcher.search(vectors, top_k, show_text=show_text, field=field, rrf_k=rrf_k, depth=depth,
                           filter=checked)


def hybrid_search_hits(dense_directory: str | os.PathLike, sparse_directory: str | os.PathLike,
                       queries: Sequence[str], **search: Any) -> list[list[dict[str, Any]]]:
    """`fused_hits` of a dense and a sparse folder of the same input (refused for folders of other kinds)."""
    check_same_input(VectorFolder(dense_directory), VectorFolder(sparse_directory))
    return fused_hits([dense_directory, sparse_directory], queries, **search)


def folder_hits(directory: str | os.PathLike, queries: Sequence[str], *, rescore_multiplier: int | None = None,
                exact: bool = False, ef_search: int | None = None, **search: Any) -> list[list[dict[str, Any]]]:
    """`bertforge search` over one folder: dense (`vector_search.search_hits`, through its approximate index
    unless `exact`), sparse (`search_sparse_hits`) or multi-vector (`multi_vector_hits`) as its manifest says;
    `search`: their common keywords."""
    kind = VectorFolder(directory).kind
    if kind == "multi-vector":
        given = [flag for flag, value in (("--rescore-multiplier", rescore_multiplier), ("--ef-search", ef_search))
                 if value is not None]
        if given:
            raise ConfigError(f"{given[0]} does not apply to a multi-vector folder (exact MaxSim); remove it")
        return multi_vector_hits(directory, queries, **search)
    if kind == "sparse":
        if rescore_multiplier is not None:
            raise ConfigError("--rescore-multiplier applies to binary dense folders; remove it for a sparse one")
        if ef_search is not None:
            raise ConfigError("--ef-search applies to a dense folder's approximate index; remove it for a sparse one")
        return search_sparse_hits(directory, queries, **search)
    extra = {} if rescore_multiplier is None else {"rescore_multiplier": rescore_multiplier}
    return search_hits(directory, queries, exact=exact, ef_search=ef_search, **search, **extra)


def collection_hits(location: str, queries: Sequence[str], *, top_k: int = DEFAULT_TOP_K, show_text: bool = False,
                    field: str | None = None, exact: bool = False, ef_search: int | None = None,
                    rescore_multiplier: int | None = None, rrf_k: float = DEFAULT_RRF_K,
                    depth: int = DEFAULT_FUSION_DEPTH, sparse_model: str | os.PathLike | None = None,
                    filter: Any = None, **embedding: Any) -> list[list[dict[str, Any]]]:
    """`bertforge search` over a Qdrant collection (`qdrant_collection.QdrantSearcher`: dense, sparse, or hybrid
    through Qdrant's fusion when it holds both), the queries embedded by the query models its export recorded
    (`embedding`: model, device, batch_size, prompt_name, prompt, precision; `sparse_model`: hybrid's sparse
    side's copy; `filter`: as `Searcher.search`'s, checked before the queries are embedded, Qdrant's filter)."""
    check_top_k(top_k)
    searcher = QdrantSearcher(location)
    try:
        checked = searcher.check_filter(filter)
        if not queries:
            return []
        vectors = embed_query_vectors(searcher, queries, sparse_model=sparse_model, **embedding)
        return searcher.search(vectors, top_k, show_text=show_text, field=field, exact=exact, ef_search=ef_search,
                               rescore_multiplier=rescore_multiplier, rrf_k=rrf_k, depth=depth, filter=checked)
    finally:
        searcher.close()


__all__ = ["DEFAULT_FUSION_DEPTH", "check_same_input", "collection_hits", "folder_hits", "fused_hits", "hybrid_search_hits",
           "multi_vector_hits", "reranked_hits", "search_sparse_hits"]
