"""`bertforge search`'s entry points over a dense folder (`search_hits`, `search`; the Python API): the queries
embedded as the folder's corpus was, by a pipeline of their own (`query_embedding`), and searched through
`searcher.Searcher`, the one search path the server's `POST /search` takes too.

The exact index's names (`VectorIndex`, `block_top_k`, ...) and the query embedding's (`embed_queries`,
`embed_sparse_queries`, `embed_query_vectors`) are importable here too, where callers take them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from bertforge.inference.pipelines import DEFAULT_BATCH_SIZE
from bertforge.retrieval.query_embedding import embed_queries, embed_query_vectors, embed_sparse_queries
from bertforge.retrieval.searcher import Searcher, hits_of
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


def search_hits(directory: str | os.PathLike, queries: Sequence[str], *, top_k: int = DEFAULT_TOP_K,
                show_text: bool = False, field: str | None = None,
                rescore_multiplier: int = DEFAULT_RESCORE_MULTIPLIER, exact: bool = False,
                ef_search: int | None = None, filter: Any = None, **embedding: Any) -> list[list[dict[str, Any]]]:
    """The top-k hits of each query text in a dense folder, best first, as {"id", "score"} (plus "text" with
    `show_text`, or the record's `field`: `searcher.hits_of`); `rescore_multiplier`: see
    `VectorIndex.search_vectors`. A folder with an approximate index (`bertforge index`) is searched through
    it (`vector_ann`, `ef_search` candidates) unless `exact`. `filter`: conditions on the folder's metadata
    fields (`filters`; checked before the queries are embedded), the hits the top-k of the rows that meet them.

    `embedding`: how the queries are embedded (`query_embedding.embed_queries`: model, device, batch_size, prompt_name,
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
           "embed_queries", "embed_query_vectors", "embed_sparse_queries", "hits_of", "search",
           "search_hits", "top_k_merge"]
