"""Queries embedded as a folder's corpus was, with a pipeline of their own (`bertforge search`, the Python API):
the manifest's model, options, window and precision (`searcher.QueryModel`); and the command's entry points over
a dense folder (`search_hits`, `search`), which search through `searcher.Searcher`, the one search path the
server's `POST /search` takes too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.checkpoint_format import model_fingerprint
from bertforge.errors import ConfigError
from bertforge.inference.pipelines import DEFAULT_BATCH_SIZE, load_pipeline
from bertforge.metrics.sparse import SparseRows
from bertforge.retrieval.multi_vector_search import embed_multi_vector_queries
from bertforge.retrieval.searcher import QueryModel, Searcher, hits_of, query_model
from bertforge.retrieval.sparse_vectors import SPARSE_TASK, encode_sparse
from bertforge.retrieval.store import VectorFolder
from bertforge.retrieval.vector_index import (
    BLOCK_ROWS,
    DEFAULT_TOP_K,
    QUERY_BLOCK,
    VectorIndex,
    block_top_k,
    check_top_k,
    top_k_merge,
)
from bertforge.retrieval.vector_quantization import DEFAULT_RESCORE_MULTIPLIER


def query_pipeline(index: VectorFolder | QueryModel, *, model: str | os.PathLike | None = None, device: str = "auto",
                   batch_size: int = DEFAULT_BATCH_SIZE, precision: str | None = None,
                   task: str | None = None, where: str | None = None) -> tuple[Any, dict[str, Any]]:
    """(pipeline, options) that embed queries as the corpus was: the manifest's model (or `model`, the same
    files), window, options and precision (`precision` None: the corpus's); `task`: the folder's ("embed",
    "embed-sparse" or "embed-multi-vector") unless given. `index`: a folder, or the `QueryModel` an index records
    (a Qdrant collection; `where` names it in messages).

    Raises:
        ConfigError: `model` is missing or another model than the corpus's.
    """
    wanted = index if isinstance(index, QueryModel) else query_model(index)
    where = where or str(getattr(index, "directory", wanted.directory))
    model_dir = Path(model) if model is not None else wanted.directory
    if not model_dir.is_dir():
        raise ConfigError(f"{model_dir}: the model that embedded {where} is not there; pass --model DIR "
                          "with a copy of it")
    if model_fingerprint(model_dir) != wanted.fingerprint:
        raise ConfigError(f"{model_dir} is not the model that embedded {where} ({wanted.directory}"
                          "); queries must be embedded by the same model")
    pipeline = load_pipeline(model_dir, task or wanted.task, device=device, precision=precision or wanted.precision,
                             batch_size=batch_size, max_length=wanted.max_length)
    return pipeline, dict(wanted.options)


def embed_queries(index: VectorFolder | QueryModel, queries: Sequence[str], *, prompt_name: str | None = None,
                  prompt: str | None = None, **loading: Any) -> np.ndarray:
    """Query vectors [Q, D] float32, embedded as the corpus was (`query_pipeline`: model, device, batch_size,
    precision; see `search`)."""
    pipeline, embedding = query_pipeline(index, **loading)
    return pipeline.encode(list(queries), prompt_name=prompt_name, prompt=prompt, **embedding)  # [Q, D]


def embed_sparse_queries(index: VectorFolder | QueryModel, queries: Sequence[str], *, prompt_name: str | None = None,
                         prompt: str | None = None, **loading: Any) -> SparseRows:
    """Sparse query vectors, embedded as the folder's corpus was (`query_pipeline`: the same model, window,
    pooling, activation and `max_terms`); the prompt is the queries' own."""
    pipeline, options = query_pipeline(index, task=SPARSE_TASK, **loading)
    return encode_sparse(pipeline, list(queries), prompt_name=prompt_name, prompt=prompt, **options)


def embed_query_vectors(searcher: Any, queries: Sequence[str], *, sparse_model: str | os.PathLike | None = None,
                        **embedding: Any) -> dict[str, np.ndarray | SparseRows]:
    """The query vectors `searcher.search` takes (a `Searcher`, or any index with its `query_models` and
    `where`: a Qdrant collection's), each side's embedded as its corpus was (`embed_queries`,
    `embed_sparse_queries`, `multi_vector_search.embed_multi_vector_queries`; `embedding`: model, device,
    batch_size, prompt_name, prompt, precision). Several kinds (hybrid, reranking): the prompt and `model` are
    the first kind's (dense, else sparse, else multi-vector); the others get their model's default prompt, and
    `sparse_model` is a copy of the sparse side's model."""
    wanted = searcher.query_models()
    vectors: dict[str, np.ndarray | SparseRows] = {}
    first = next(iter(wanted), None)
    for kind in wanted:  # the first kind: the prompt and the model copy; the others: their model's defaults
        loading = embedding if kind == first else {k: v for k, v in embedding.items()
                                                   if k in ("device", "batch_size", "precision")}
        if kind == "sparse" and kind != first:
            loading = {**loading, "model": sparse_model}
        embed = {"dense": embed_queries, "sparse": embed_sparse_queries,
                 "multi-vector": embed_multi_vector_queries}[kind]
        vectors[kind] = embed(wanted[kind], queries, where=searcher.where(kind), **loading)
    return vectors


def search_hits(directory: str | os.PathLike, queries: Sequence[str], *, top_k: int = DEFAULT_TOP_K,
                show_text: bool = False, field: str | None = None,
                rescore_multiplier: int = DEFAULT_RESCORE_MULTIPLIER, exact: bool = False,
                ef_search: int | None = None, filter: Any = None, **embedding: Any) -> list[list[dict[str, Any]]]:
    """The top-k hits of each query text in a dense folder, best first, as {"id", "score"} (plus "text" with
    `show_text`, or the record's `field`: `searcher.hits_of`); `rescore_multiplier`: see
    `VectorIndex.search_vectors`. A folder with an approximate index (`bertforge index`) is searched through
    it (`vector_ann`, `ef_search` candidates) unless `exact`. `filter`: conditions on the folder's metadata
    fields (`filters`; checked before the queries are embedded), the hits the top-k of the rows that meet them.

    `embedding`: how the queries are embedded (`embed_queries`: model, device, batch_size, prompt_name,
    prompt, precision).
    """
    check_top_k(top_k)
    searcher = Searcher(directory, exact=exact)
    checked = searcher.check_filter(filter)
    if not queries:
        return []
    vectors = embed_query_vectors(searcher, queries, **embedding)
    approximate = searcher.ann is not None  # `exact`, or no approximate index: ef_search does not apply
    return searcher.search(vectors, top_k, show_text=show_text, field=field,
                           ef_search=ef_search if approximate else None,
                           rescore_multiplier=None if approximate else rescore_multiplier, filter=checked)


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


__all__ = ["BLOCK_ROWS", "DEFAULT_TOP_K", "QUERY_BLOCK", "VectorIndex", "block_top_k", "check_top_k",
           "embed_queries", "embed_query_vectors", "embed_sparse_queries", "hits_of", "query_pipeline", "search",
           "search_hits", "top_k_merge"]
