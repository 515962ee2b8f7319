"""Late-interaction (ColBERT) retrieval evaluation: every query scored against every document of a retrieval set
by exact MaxSim, reported with the dense evaluator's figures (nDCG@10, MRR@10, recall@k, ... from
`metrics.embedding.retrieval_scores`, the one home of them).

Owns how token vectors become rankings (`late_interaction_rankings`: the corpus encoded `corpus_chunk_size`
documents at a time, each chunk's MaxSim with a block of queries (`families.colbert.maxsim`, the one home of
MaxSim) merged into each query's running top k by `evaluation.embedding.merge_top_k`, so memory stays bounded
and no chunking changes a ranking), `evaluate_late_interaction_retrieval` (the figures) and
`maxsim_reranker` (a `Rerank` that rescores a candidate list by MaxSim of vectors already computed: ColBERT
reranking another retriever's list). `pipeline_token_encoder` turns a loaded `embed-multi-vector` pipeline
into the encoder these take (queries with the query role, documents with the document role).

Nothing here loads a model: callers pass ``encode_tokens(texts) -> [t_i, D] float32 per text``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from bertforge.data.retrieval import RetrievalSet
from bertforge.errors import InputError
from bertforge.evaluation.embedding import CORPUS_CHUNK_SIZE, Rerank, merge_top_k
from bertforge.families.colbert import maxsim
from bertforge.metrics.embedding import (
    DEFAULT_K_VALUES,
    DEFAULT_MAP_AT,
    DEFAULT_MRR_AT,
    DEFAULT_NDCG_AT,
    id_order,
    relevant_queries,
    retrieval_depth,
    retrieval_scores,
)

EncodeTokens = Callable[[list[str]], list[np.ndarray]]
# Queries scored at once against a chunk's token vectors: [QUERY_BLOCK x q, tokens of the chunk] similarities.
QUERY_BLOCK = 16
# Documents per corpus chunk (a ColBERT document has up to ~180 vectors: 2,000 x 180 x 128 floats ~ 184 MB).
TOKEN_CORPUS_CHUNK = min(CORPUS_CHUNK_SIZE, 2000)


def embed_tokens(encode_tokens: EncodeTokens, texts: Sequence[str], what: str = "texts",
                 width: int | None = None) -> list[np.ndarray]:
    """`encode_tokens(texts)`, checked: one finite [t, D] float32 array per text, every D the same (`width`
    when given), at least one vector each."""
    texts = list(texts)
    if not texts:
        raise InputError(f"no {what} to encode")
    vectors = [np.asarray(v, dtype=np.float32) for v in encode_tokens(texts)]
    if len(vectors) != len(texts):
        raise InputError(f"the token encoder returned {len(vectors)} results for {len(texts)} {what}")
    width = width if width is not None else vectors[0].shape[-1] if vectors[0].ndim == 2 else None
    for i, v in enumerate(vectors):
        if v.ndim != 2 or v.shape[1] != width or not len(v):
            raise InputError(f"the encoded {what}[{i}] is {list(v.shape)}; expected [tokens >= 1, {width}]")
        if not np.isfinite(v).all():
            raise InputError(f"the encoded {what}[{i}] holds NaN or infinite values")
    return vectors


def padded(vectors: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """([N, t, D] float32, [N, t] bool mask) of [t_i, D] arrays of any lengths."""
    length, width = max(len(v) for v in vectors), vectors[0].shape[1]
    out = torch.zeros((len(vectors), length, width), dtype=torch.float32)
    mask = torch.zeros((len(vectors), length), dtype=torch.bool)
    for i, v in enumerate(vectors):
        out[i, :len(v)] = torch.from_numpy(v)
        mask[i, :len(v)] = True
    return out, mask


def maxsim_scores(queries: Sequence[np.ndarray], documents: Sequence[np.ndarray],
                  query_block: int = QUERY_BLOCK) -> np.ndarray:
    """MaxSim [Q, N] of every query against every document (float32), `query_block` queries at a time."""
    tokens = torch.from_numpy(np.concatenate(documents))
    owner = torch.repeat_interleave(torch.arange(len(documents)), torch.tensor([len(d) for d in documents]))
    blocks = []
    with torch.no_grad():
        for start in range(0, len(queries), query_block):
            block, mask = padded(queries[start:start + query_block])
            blocks.append(maxsim(block, mask, tokens, owner, len(documents)).numpy())
    return np.concatenate(blocks).astype(np.float32)


def late_interaction_rankings(encode_queries: EncodeTokens, retrieval_set: RetrievalSet, depth: int, *,
                              encode_documents: EncodeTokens | None = None, with_title: bool = True,
                              corpus_chunk_size: int = TOKEN_CORPUS_CHUNK, keep_vectors: bool = False
                              ) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """(query id -> its `depth` best document ids by exact MaxSim, best first, ties by document id; a summary:
    average vectors per query and per document, and with `keep_vectors` every query's and document's vectors
    by id) for the queries with a relevant document."""
    if corpus_chunk_size < 1:
        raise InputError("corpus_chunk_size must be positive")
    evaluated = relevant_queries(retrieval_set.query_ids, retrieval_set.qrels)
    if not evaluated:
        raise InputError(f"none of the {len(retrieval_set.query_ids)} queries has a relevant document in the "
                         "qrels (relevance > 0)")
    documents, ids = retrieval_set.documents(with_title), retrieval_set.corpus_ids
    if not documents:
        raise InputError("the corpus is empty; there is nothing to retrieve")
    text_of = dict(zip(retrieval_set.query_ids, retrieval_set.query_texts))
    queries = embed_tokens(encode_queries, [text_of[q] for q in evaluated], "queries")
    width = queries[0].shape[1]
    keys = id_order(list(ids))
    best_index = np.zeros((len(queries), 0), dtype=np.int64)
    best_score = np.zeros((len(queries), 0), dtype=np.float32)
    kept: dict[str, np.ndarray] = {}
    document_tokens = 0
    for start in range(0, len(documents), corpus_chunk_size):
        chunk = embed_tokens(encode_documents or encode_queries, documents[start:start + corpus_chunk_size],
                             "documents", width)
        document_tokens += sum(len(c) for c in chunk)
        if keep_vectors:
            kept.update(zip(ids[start:start + len(chunk)], chunk))
        best_index, best_score = merge_top_k(best_index, best_score, maxsim_scores(queries, chunk), start, depth,
                                             keys)
    ranked = {qid: [ids[j] for j in row] for qid, row in zip(evaluated, best_index.tolist())}
    summary: dict[str, Any] = {"query_vectors": sum(len(q) for q in queries) / len(queries),
                               "document_vectors": document_tokens / len(documents)}
    if keep_vectors:
        summary.update(queries=dict(zip(evaluated, queries)), documents=kept)
    return ranked, summary


def evaluate_late_interaction_retrieval(encode_queries: EncodeTokens, retrieval_set: RetrievalSet, *,
                                        encode_documents: EncodeTokens | None = None,
                                        k_values: Sequence[int] = DEFAULT_K_VALUES,
                                        mrr_at: Sequence[int] = DEFAULT_MRR_AT,
                                        ndcg_at: Sequence[int] = DEFAULT_NDCG_AT,
                                        map_at: Sequence[int] = DEFAULT_MAP_AT, graded: bool = False,
                                        with_title: bool = True,
                                        corpus_chunk_size: int = TOKEN_CORPUS_CHUNK) -> dict[str, float]:
    """Retrieval figures of exact MaxSim search, as `evaluation.embedding.evaluate_retrieval`'s (accuracy@k,
    precision@k, recall@k, nDCG, MRR, MAP), plus `query_vectors` and `document_vectors`: the average number
    of token vectors of a query and of a document.

    Args:
        encode_queries: query texts -> [q_i, D] float32 each (a ColBERT model's query role).
        encode_documents: document texts -> [t_i, D] each (its document role; default `encode_queries`).
        Others: as `evaluate_retrieval`.
    """
    depth = retrieval_depth(k_values, mrr_at, ndcg_at, map_at)
    ranked, summary = late_interaction_rankings(encode_queries, retrieval_set, depth,
                                                encode_documents=encode_documents, with_title=with_title,
                                                corpus_chunk_size=corpus_chunk_size)
    figures = retrieval_scores(ranked, retrieval_set.qrels, k_values=k_values, mrr_at=mrr_at, ndcg_at=ndcg_at,
                               map_at=map_at, graded=graded)
    return {**figures, "query_vectors": summary["query_vectors"], "document_vectors": summary["document_vectors"]}


def maxsim_reranker(query_vectors: dict[str, np.ndarray], document_vectors: dict[str, np.ndarray]) -> Rerank:
    """A `Rerank` (query text, document texts -> scores) by MaxSim of vectors already computed, keyed by text."""
    def rerank(query: str, documents: list[str]) -> np.ndarray:
        if not documents:
            return np.zeros(0, dtype=np.float32)
        return maxsim_scores([query_vectors[query]], [document_vectors[d] for d in documents])[0]

    return rerank


def pipeline_token_encoder(pipeline: Any, role: str) -> EncodeTokens:
    """`encode_tokens` of a loaded `embed-multi-vector` pipeline (a ColBERT model): each text's scored token
    vectors with `role` ("query": marker, [MASK] expansion; "document": marker, length cut, skiplist), taken
    from the family's outputs (no JSON lists in between)."""
    options = pipeline.check_options({"role": role})

    def encode(texts: list[str]) -> list[np.ndarray]:
        outputs = pipeline.forward(pipeline.features([pipeline.parse(t) for t in texts]), options)
        return [output.vectors.numpy() for output in outputs]

    return encode
