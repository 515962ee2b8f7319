"""Top-k search of query texts over an embedding folder: the queries embedded with the model and options
the manifest records, then scored exactly (`vector_index.VectorIndex`) or through the folder's approximate
index (`vector_ann`) when it has one; hits carry ids, scores and, on request, spans, texts or fields.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.errors import ConfigError
from bertforge.inference.pipelines import DEFAULT_BATCH_SIZE, load_pipeline
from bertforge.retrieval.embed_corpus import model_fingerprint
from bertforge.retrieval.vector_ann import open_ann
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
from bertforge.retrieval.vector_texts import record_texts


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


__all__ = ["BLOCK_ROWS", "DEFAULT_TOP_K", "QUERY_BLOCK", "check_top_k", "VectorIndex", "block_top_k", "embed_queries", "hits_of", "query_pipeline", "search",
           "search_hits", "top_k_merge"]
