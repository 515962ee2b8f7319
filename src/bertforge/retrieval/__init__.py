"""Retrieval: a corpus embedded into a vector folder, and everything that reads one. Above
`bertforge.inference` (its pipelines embed the texts), below `bertforge.serving` (whose `POST /search` runs
`Searcher`); never the web framework.

- `store`: the folder's format (manifest, shard files, what is finished) and `EmbedSettings`, what it stores
  (`embed_settings`); `fields`: the metadata stored per record (Parquet), `filters`: conditions on it;
- `embed_corpus`: the embed job (streamed, resumable, torchrun), writing through the store;
- `vector_index` (exact), `vector_ann` (HNSW), `sparse_search` (inverted index), `vector_quantization` (int8,
  binary), `multi_vector_search` (exact MaxSim over `token_rows`, a ColBERT model's vectors per token): the
  indexes; `searcher`: the one search path from query vectors to hits (dense, sparse, multi-vector, any of
  them fused, reranked);
- `query_embedding`: queries embedded as a folder's corpus was, by a pipeline of their own (`QueryModel`);
  `vector_search`, `hybrid_search`: `bertforge search`'s entry points;
- `qdrant_collection`: a folder exported into a Qdrant collection and searched there (with `qdrant_filters`,
  the only modules that import qdrant_client), `qdrant_locations`: where a collection is; `index_locations`: `open_index`, folders or a collection by what `--index` names;
- `text_chunks`, `vector_texts`, `embedding_map`, `negative_mining`, `mine_corpus`: chunks, texts behind hits,
  maps, hard negatives.

Names are imported lazily: importing this package loads nothing else.
"""

from bertforge.lazy import lazy_getattr

_LAZY = {
    "EmbedSettings": "bertforge.retrieval.store",
    "VectorFolder": "bertforge.retrieval.store",
    "embed_corpus": "bertforge.retrieval.embed_corpus",
    "Searcher": "bertforge.retrieval.searcher",
    "search": "bertforge.retrieval.vector_search",
    "folder_hits": "bertforge.retrieval.hybrid_search",
    "hybrid_search_hits": "bertforge.retrieval.hybrid_search",
    "open_index": "bertforge.retrieval.index_locations",
    "export_folders": "bertforge.retrieval.qdrant_collection",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = list(_LAZY)
