"""Queries embedded as a folder's corpus was, by pipelines of their own (`bertforge search`, the Python API,
hard-negative mining); the server embeds them through its models' schedulers instead, from the same record
(`serving.search_routes`).

Owns: what embeds one folder's queries (`QueryModel`, read from its manifest by `query_model`: the model's
directory and fingerprint, the pipeline task of the folder's kind, `TASKS`, the family options, the window and
the precision the corpus was embedded with), the pipeline that embeds them (`query_pipeline`: a copy of the
model elsewhere must be the same files) and the query vectors of each kind (`embed_queries` dense,
`embed_sparse_queries`, `embed_multi_vector_queries` with the query role; `embed_query_vectors`: every kind a
searcher's `query_models` asks for, the vectors its `search` takes).

Below `searcher`, whose `query_models` names a `QueryModel` per kind, and beside the indexes it embeds for: it
imports no search.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.checkpoint_format import model_fingerprint
from bertforge.errors import ConfigError
from bertforge.inference.pipelines import DEFAULT_BATCH_SIZE, load_pipeline
from bertforge.metrics.sparse import SparseRows
from bertforge.retrieval.multi_vector_search import MULTI_VECTOR_TASK
from bertforge.retrieval.sparse_vectors import SPARSE_TASK, encode_sparse
from bertforge.retrieval.store import VectorFolder

# A folder's kind -> the pipeline task that embeds its corpus and its queries.
TASKS = {"dense": "embed", "sparse": SPARSE_TASK, "multi-vector": MULTI_VECTOR_TASK}


@dataclass(frozen=True)
class QueryModel:
    """How one folder's queries are embedded, as its corpus was: the model (its directory as the manifest names
    it, and its fingerprint: a copy elsewhere must match it), the pipeline task, the family options, the window
    and the precision the corpus was embedded with."""

    directory: Path
    fingerprint: str
    task: str
    options: dict[str, Any]
    max_length: int
    precision: str


def query_model(folder: VectorFolder) -> QueryModel:
    """The `QueryModel` of a folder, from its manifest (the prompt is the queries' own, not the corpus's)."""
    embedding = dict(folder.manifest["embedding"])
    embedding.pop("prompt")
    return QueryModel(Path(folder.manifest["model"]["path"]), folder.manifest["model"]["fingerprint"],
                      TASKS[folder.kind], embedding,
                      embedding.pop("max_length"), embedding.pop("precision"))


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
    precision; see `vector_search.search`)."""
    pipeline, embedding = query_pipeline(index, **loading)
    return pipeline.encode(list(queries), prompt_name=prompt_name, prompt=prompt, **embedding)  # [Q, D]


def embed_sparse_queries(index: VectorFolder | QueryModel, queries: Sequence[str], *, prompt_name: str | None = None,
                         prompt: str | None = None, **loading: Any) -> SparseRows:
    """Sparse query vectors, embedded as the folder's corpus was (`query_pipeline`: the same model, window,
    pooling, activation and `max_terms`); the prompt is the queries' own."""
    pipeline, options = query_pipeline(index, task=SPARSE_TASK, **loading)
    return encode_sparse(pipeline, list(queries), prompt_name=prompt_name, prompt=prompt, **options)


def embed_multi_vector_queries(index: Any, queries: Sequence[str], *, prompt_name: str | None = None,
                               prompt: str | None = None, **loading: Any) -> list[np.ndarray]:
    """Each query's token vectors [q, D] float32 (the query role: its marker, [MASK] expansion), embedded by the
    model that embedded the folder (`index`: it, or its `QueryModel`; `query_pipeline`: model, device,
    batch_size, precision, where)."""
    pipeline, options = query_pipeline(index, task=MULTI_VECTOR_TASK, **loading)
    prefix = pipeline.prompt_text(prompt_name, prompt)
    results = pipeline.run([prefix + query for query in queries], **{**options, "role": "query"})
    return [np.asarray(result["embeddings"], dtype=np.float32) for result in results]


def embed_query_vectors(searcher: Any, queries: Sequence[str], *, sparse_model: str | os.PathLike | None = None,
                        **embedding: Any) -> dict[str, np.ndarray | SparseRows]:
    """The query vectors `searcher.search` takes (a `Searcher`, or any index with its `query_models` and
    `where`: a Qdrant collection's), each side's embedded as its corpus was (`embed_queries`,
    `embed_sparse_queries`, `embed_multi_vector_queries`; `embedding`: model, device,
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


__all__ = ["TASKS", "QueryModel", "embed_multi_vector_queries", "embed_queries", "embed_query_vectors",
           "embed_sparse_queries", "query_model", "query_pipeline"]
