"""Embedding evaluations of any model through an `encode` function: STS, retrieval, paraphrase detection;
sparse retrieval and hybrid (dense + sparse, reciprocal rank fusion) retrieval.

Owns how a model's vectors become sentence-transformers' figures (the figures themselves are
`metrics.embedding`'s): which texts are encoded (each distinct text once), exact nearest-neighbour search
for retrieval (cosine as the dot product of unit vectors, over corpus chunks so memory stays bounded
whatever the corpus size: at most `query_chunk_size` x `corpus_chunk_size` scores at a time, merged into
each query's running top k with the document-id tie rule; products in float64 rounded to float32, so no
chunking changes a score or a tie), and optional re-ranking of each query's top documents by a
cross-encoder.

Nothing here loads a model: the caller passes ``encode(texts) -> float32 [N, H]`` (a bertforge
`EmbedPipeline.encode`, a sentence-transformers model's `encode`, anything), or for sparse vectors
``encode_sparse(texts) -> metrics.sparse.SparseRows``, so the layering stays downward (the CLI does the
loading) and any model can be compared on the same figures. Sparse retrieval is exact (dot products through
an inverted index, `metrics.sparse`); hybrid retrieval fuses each query's dense and sparse lists of
`fusion_depth` documents by reciprocal rank fusion (`metrics.fusion`), as sentence-transformers'
ReciprocalRankFusionEvaluator does, and reports the figures of all three lists.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np

from bertforge.data.retrieval import RetrievalSet
from bertforge.errors import InputError
from bertforge.metrics.embedding import (
    DEFAULT_K_VALUES,
    DEFAULT_MAP_AT,
    DEFAULT_MRR_AT,
    DEFAULT_NDCG_AT,
    check_matrix,
    check_vector,
    id_order,
    normalize_rows,
    pair_classification_scores,
    retrieval_depth,
    retrieval_scores,
    sts_scores,
    top_k,
)
from bertforge.metrics.fusion import DEFAULT_RRF_K, reciprocal_rank_fusion
from bertforge.metrics.sparse import SparseRows, rank_sparse

logger = logging.getLogger(__name__)

Encode = Callable[[list[str]], np.ndarray]
Rerank = Callable[[str, list[str]], np.ndarray]
EncodeSparse = Callable[[list[str]], SparseRows]

# Documents encoded (and scored) per step, and queries scored per block: 1024 x 10,000 scores (float64, then
# float32) and their int64 tie keys stay near 250 MB.
CORPUS_CHUNK_SIZE = 10_000
QUERY_CHUNK_SIZE = 1024


def embed(encode: Encode, texts: Sequence[str], what: str = "texts") -> np.ndarray:
    """`encode(texts)`, checked: one finite row per text.

    Args:
        encode: texts -> [N, H] vectors.
        texts: [N] strings.
        what: what the texts are, for the error message.

    Returns:
        [N, H] float32.

    Raises:
        InputError: the result is not [len(texts), H], or holds NaN / infinity.
    """
    texts = list(texts)
    if not texts:
        raise InputError(f"no {what} to encode")
    vectors = check_matrix(encode(texts), f"the encoded {what}", rows=len(texts))
    return np.asarray(vectors, dtype=np.float32)


def _embed_pairs(encode: Encode, sentences_a: Sequence[str],
                 sentences_b: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Vectors of both sides of the pairs, each distinct sentence encoded once: [N, H], [N, H]."""
    sentences_a, sentences_b = list(sentences_a), list(sentences_b)
    if len(sentences_a) != len(sentences_b):
        raise InputError(f"{len(sentences_a)} first sentences for {len(sentences_b)} second sentences")
    if not sentences_a:
        raise InputError("no sentence pairs to evaluate")
    distinct = list(dict.fromkeys(sentences_a + sentences_b))
    index = {text: i for i, text in enumerate(distinct)}
    vectors = embed(encode, distinct, "sentences")
    return vectors[[index[t] for t in sentences_a]], vectors[[index[t] for t in sentences_b]]


def evaluate_sts(encode: Encode, sentences_a: Sequence[str], sentences_b: Sequence[str],
                 scores: Sequence[float]) -> dict[str, float]:
    """Semantic textual similarity (as sentence-transformers' EmbeddingSimilarityEvaluator).

    Args:
        encode: texts -> float32 [N, H].
        sentences_a, sentences_b: [N] the pairs' sentences.
        scores: [N] gold similarity scores.

    Returns:
        {"pearson_cosine", "spearman_cosine"}.
    """
    gold = check_vector(scores, "scores", len(list(sentences_a)))
    vectors_a, vectors_b = _embed_pairs(encode, sentences_a, sentences_b)
    return sts_scores(vectors_a, vectors_b, gold)


def evaluate_paraphrase(encode: Encode, sentences_a: Sequence[str], sentences_b: Sequence[str],
                        labels: Sequence[int]) -> dict[str, float]:
    """Paraphrase / duplicate detection by cosine (as sentence-transformers' BinaryClassificationEvaluator).

    Args:
        encode: texts -> float32 [N, H].
        sentences_a, sentences_b: [N] the pairs' sentences.
        labels: [N] 1 (paraphrase) or 0.

    Returns:
        {"cosine_ap", "cosine_accuracy", "cosine_accuracy_threshold", "cosine_f1", "cosine_f1_threshold",
        "cosine_precision", "cosine_recall", "cosine_mcc"}.
    """
    check_vector(labels, "labels", len(list(sentences_a)))
    vectors_a, vectors_b = _embed_pairs(encode, sentences_a, sentences_b)
    return pair_classification_scores(vectors_a, vectors_b, labels)


def exact_search(encode: Encode, documents: Sequence[str], doc_ids: Sequence[str], query_vectors: np.ndarray,
                 k: int, *, corpus_chunk_size: int = CORPUS_CHUNK_SIZE,
                 query_chunk_size: int = QUERY_CHUNK_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """Each query's `k` nearest documents by cosine, best first; equal scores by ascending document id.

    The corpus is encoded and scored `corpus_chunk_size` documents at a time; each chunk's top k per query
    is merged into the running top k (`metrics.embedding.top_k` gives the same result as one pass over the
    whole corpus).

    Args:
        encode: texts -> float32 [N, H] (the documents' encoder).
        documents: [D] texts; doc_ids: [D] their distinct ids (the tie-break order).
        query_vectors: [Q, H] query vectors.
        k: documents per query.

    Returns:
        (indices [Q, min(k, D)] int64 into `documents`, scores [Q, min(k, D)] float32).
    """
    if not documents:
        raise InputError("the corpus is empty; there is nothing to retrieve")
    if corpus_chunk_size < 1 or query_chunk_size < 1:
        raise InputError("corpus_chunk_size and query_chunk_size must be positive")
    # Dot products in float64, rounded to float32: BLAS rounds a float32 product differently for different
    # matrix shapes, which would let the chunking (or the query block) decide between near-equal scores.
    queries = normalize_rows(check_matrix(query_vectors, "query vectors")).astype(np.float64)
    keys = id_order(list(doc_ids))
    best_index = np.zeros((len(queries), 0), dtype=np.int64)
    best_score = np.zeros((len(queries), 0), dtype=np.float32)
    for start in range(0, len(documents), corpus_chunk_size):
        stop = min(start + corpus_chunk_size, len(documents))
        chunk = normalize_rows(embed(encode, documents[start:stop], "documents")).astype(np.float64)
        if chunk.shape[1] != queries.shape[1]:
            raise InputError(f"document vectors have size {chunk.shape[1]}, query vectors {queries.shape[1]}")
        merged = [merge_top_k(best_index[q:q + query_chunk_size], best_score[q:q + query_chunk_size],
                              (queries[q:q + query_chunk_size] @ chunk.T).astype(np.float32), start, k, keys)
                  for q in range(0, len(queries), query_chunk_size)]  # [q, c] cosines per block
        best_index, best_score = np.concatenate([m[0] for m in merged]), np.concatenate([m[1] for m in merged])
        logger.debug("searched %d of %d documents", stop, len(documents))
    return best_index, best_score


def merge_top_k(best_index: np.ndarray, best_score: np.ndarray, scores: np.ndarray, start: int, k: int,
                keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The running top k [Q, <=k] (indices into the corpus, scores) merged with a corpus chunk's scores [Q, c]
    (documents start..start+c-1); `keys` [D]: the whole corpus's tie keys (`id_order`)."""
    local = top_k(scores, k, keys[start:start + scores.shape[1]])
    index = np.concatenate([best_index, local + start], axis=1)
    value = np.concatenate([best_score, np.take_along_axis(scores, local, axis=1)], axis=1)
    keep = top_k(value, k, keys[index])
    return np.take_along_axis(index, keep, axis=1), np.take_along_axis(value, keep, axis=1)


def rerank_lists(rerank: Rerank, query_texts: dict[str, str], ranked: dict[str, list[str]],
                 doc_texts: dict[str, str], depth: int) -> dict[str, list[str]]:
    """Each query's first `depth` documents re-ordered by `rerank(query, documents)` scores (higher is
    better; equal scores by document id), the rest of its list after them as it was.

    Args:
        rerank: (query text, [n] document texts) -> [n] scores, e.g. a cross-encoder's.
        query_texts: query id -> text; ranked: query id -> document ids, best first.
        doc_texts: document id -> the text given to `rerank`.
        depth: how many of each list are re-scored.

    Returns:
        query id -> document ids, best first.
    """
    if depth < 1:
        raise InputError(f"rerank_depth must be positive, got {depth}")
    out = {}
    for qid, docs in ranked.items():
        head, tail = docs[:depth], docs[depth:]
        scores = check_vector(rerank(query_texts[qid], [doc_texts[d] for d in head]),
                              f"the re-ranker's scores for query {qid!r}", len(head))
        out[qid] = [d for _, d in sorted(zip((-s for s in scores.tolist()), head))] + tail
    return out


def evaluate_retrieval(encode: Encode, retrieval_set: RetrievalSet, *, k_values: Sequence[int] = DEFAULT_K_VALUES,
                       mrr_at: Sequence[int] = DEFAULT_MRR_AT, ndcg_at: Sequence[int] = DEFAULT_NDCG_AT,
                       map_at: Sequence[int] = DEFAULT_MAP_AT, graded: bool = False, with_title: bool = True,
                       encode_documents: Encode | None = None, rerank: Rerank | None = None,
                       rerank_depth: int = 100, corpus_chunk_size: int = CORPUS_CHUNK_SIZE,
                       query_chunk_size: int = QUERY_CHUNK_SIZE) -> dict[str, float]:
    """Retrieval figures of exact cosine search (as sentence-transformers' InformationRetrievalEvaluator).

    Only the queries with a relevant document are encoded and averaged over (as there).

    Args:
        encode: texts -> float32 [N, H] (queries, and documents unless `encode_documents` is given).
        retrieval_set: corpus, queries, qrels.
        k_values: ks of accuracy@k, precision@k, recall@k; mrr_at, ndcg_at, map_at: ks of MRR, nDCG, MAP.
        graded: nDCG with graded gains (trec_eval) rather than binary (sentence-transformers).
        with_title: encode documents as "title text" (BEIR's usual input) rather than the text alone.
        encode_documents: a separate document encoder (asymmetric models, prompts).
        rerank: (query, [n] documents) -> [n] scores: re-scores each query's first `rerank_depth` documents;
            the figures after re-ranking are added under "rerank_<name>".
        corpus_chunk_size, query_chunk_size: the search's memory bound (see `exact_search`).

    Returns:
        {"accuracy@1", ..., "precision@k", "recall@k", "ndcg@10", "mrr@10", "map@100"} (+ "rerank_..." ones).

    Raises:
        InputError: no query has a relevant document, an empty corpus, or bad vectors from `encode`.
    """
    depth = retrieval_depth(k_values, mrr_at, ndcg_at, map_at)
    ranked = dense_rankings(encode, retrieval_set, max(depth, rerank_depth if rerank is not None else 0),
                            with_title=with_title, encode_documents=encode_documents,
                            corpus_chunk_size=corpus_chunk_size, query_chunk_size=query_chunk_size)
    options = {"k_values": k_values, "mrr_at": mrr_at, "ndcg_at": ndcg_at, "map_at": map_at, "graded": graded}
    figures = retrieval_scores(ranked, retrieval_set.qrels, **options)
    if rerank is not None:
        text_of = dict(zip(retrieval_set.query_ids, retrieval_set.query_texts))
        documents = dict(zip(retrieval_set.corpus_ids, retrieval_set.documents(with_title)))
        reranked = rerank_lists(rerank, text_of, ranked, documents, rerank_depth)
        figures.update({f"rerank_{name}": value for name, value in
                        retrieval_scores(reranked, retrieval_set.qrels, **options).items()})
    return figures


# --- sparse and hybrid retrieval ---------------------------------------------------------------------------

def embed_sparse(encode_sparse: EncodeSparse, texts: Sequence[str], what: str = "texts",
                 chunk_size: int = CORPUS_CHUNK_SIZE) -> SparseRows:
    """`encode_sparse(texts)` in chunks of `chunk_size`, checked: one row per text, finite weights."""
    texts = list(texts)
    if not texts:
        raise InputError(f"no {what} to encode")
    parts = []
    for start in range(0, len(texts), chunk_size):
        part = encode_sparse(texts[start:start + chunk_size])
        if not isinstance(part, SparseRows) or len(part) != len(texts[start:start + chunk_size]):
            raise InputError(f"the sparse encoder must return SparseRows with one row per text for the {what}")
        if not np.isfinite(part.values).all():
            raise InputError(f"the encoded {what} hold NaN or infinite weights")
        parts.append(part)
    return SparseRows.concatenate(parts)


def sparse_rankings(encode_sparse: EncodeSparse, retrieval_set: RetrievalSet, depth: int, *,
                    with_title: bool = True, encode_documents: EncodeSparse | None = None
                    ) -> tuple[dict[str, list[str]], SparseRows, SparseRows]:
    """(query id -> its `depth` best document ids by sparse dot product, query rows, document rows) for the
    queries with a relevant document; ties by document id."""
    evaluated = _evaluated(retrieval_set)
    text_of = dict(zip(retrieval_set.query_ids, retrieval_set.query_texts))
    queries = embed_sparse(encode_sparse, [text_of[qid] for qid in evaluated], "queries")
    documents = embed_sparse(encode_documents or encode_sparse, retrieval_set.documents(with_title), "documents")
    if queries.width != documents.width:
        raise InputError(f"query vectors have {queries.width} terms, document vectors {documents.width}")
    return rank_sparse(queries, documents, evaluated, retrieval_set.corpus_ids, depth), queries, documents


def dense_rankings(encode: Encode, retrieval_set: RetrievalSet, depth: int, *, with_title: bool = True,
                   encode_documents: Encode | None = None, corpus_chunk_size: int = CORPUS_CHUNK_SIZE,
                   query_chunk_size: int = QUERY_CHUNK_SIZE) -> dict[str, list[str]]:
    """Query id -> its `depth` best document ids by cosine (`exact_search`), for the queries with a relevant
    document."""
    evaluated = _evaluated(retrieval_set)
    text_of = dict(zip(retrieval_set.query_ids, retrieval_set.query_texts))
    query_vectors = embed(encode, [text_of[qid] for qid in evaluated], "queries")
    indices, _ = exact_search(encode_documents or encode, retrieval_set.documents(with_title),
                              retrieval_set.corpus_ids, query_vectors, depth, corpus_chunk_size=corpus_chunk_size,
                              query_chunk_size=query_chunk_size)
    ids = retrieval_set.corpus_ids
    return {qid: [ids[j] for j in row] for qid, row in zip(evaluated, indices.tolist())}


def _evaluated(retrieval_set: RetrievalSet) -> list[str]:
    evaluated = retrieval_set.evaluated_queries()
    if not evaluated:
        raise InputError(f"none of the {len(retrieval_set.query_ids)} queries has a relevant document in the "
                         "qrels (relevance > 0)")
    return evaluated


def evaluate_sparse_retrieval(encode_sparse: EncodeSparse, retrieval_set: RetrievalSet, *,
                              k_values: Sequence[int] = DEFAULT_K_VALUES, mrr_at: Sequence[int] = DEFAULT_MRR_AT,
                              ndcg_at: Sequence[int] = DEFAULT_NDCG_AT, map_at: Sequence[int] = DEFAULT_MAP_AT,
                              graded: bool = False, with_title: bool = True,
                              encode_documents: EncodeSparse | None = None) -> dict[str, float]:
    """Retrieval figures of exact sparse (dot-product) search, as `evaluate_retrieval`'s, plus `query_terms`
    and `document_terms`: the average number of non-zero terms of a query and of a document.

    Args:
        encode_sparse: texts -> `SparseRows` (e.g. `retrieval.sparse_vectors.encode_sparse` of a pipeline).
        encode_documents: a separate document encoder (inference-free or asymmetric models).
        Others: as `evaluate_retrieval`.
    """
    depth = retrieval_depth(k_values, mrr_at, ndcg_at, map_at)
    ranked, queries, documents = sparse_rankings(encode_sparse, retrieval_set, depth, with_title=with_title,
                                                 encode_documents=encode_documents)
    figures = retrieval_scores(ranked, retrieval_set.qrels, k_values=k_values, mrr_at=mrr_at, ndcg_at=ndcg_at,
                               map_at=map_at, graded=graded)
    return {**figures, "query_terms": queries.average_terms(), "document_terms": documents.average_terms()}


def evaluate_hybrid_retrieval(encode: Encode, encode_sparse: EncodeSparse, retrieval_set: RetrievalSet, *,
                              rrf_k: float = DEFAULT_RRF_K, fusion_depth: int = 100,
                              k_values: Sequence[int] = DEFAULT_K_VALUES, mrr_at: Sequence[int] = DEFAULT_MRR_AT,
                              ndcg_at: Sequence[int] = DEFAULT_NDCG_AT, map_at: Sequence[int] = DEFAULT_MAP_AT,
                              graded: bool = False, with_title: bool = True) -> dict[str, float]:
    """Figures of dense, sparse and fused retrieval of the same queries: each query's `fusion_depth` best
    documents by cosine and by sparse dot product, fused by reciprocal rank fusion (constant `rrf_k`).

    Returns:
        {"dense_<figure>", "sparse_<figure>", "hybrid_<figure>"} for every figure of `evaluate_retrieval`, plus
        "sparse_query_terms" and "sparse_document_terms".
    """
    depth = max(fusion_depth, retrieval_depth(k_values, mrr_at, ndcg_at, map_at))
    dense = dense_rankings(encode, retrieval_set, depth, with_title=with_title)
    sparse, queries, documents = sparse_rankings(encode_sparse, retrieval_set, depth, with_title=with_title)
    fused = {qid: [doc for doc, _ in reciprocal_rank_fusion([dense[qid], sparse[qid]], rrf_k)] for qid in dense}
    options = {"k_values": k_values, "mrr_at": mrr_at, "ndcg_at": ndcg_at, "map_at": map_at, "graded": graded}
    figures = {}
    for name, ranked in (("dense", dense), ("sparse", sparse), ("hybrid", fused)):
        figures.update({f"{name}_{key}": value for key, value in
                        retrieval_scores(ranked, retrieval_set.qrels, **options).items()})
    figures.update(sparse_query_terms=queries.average_terms(), sparse_document_terms=documents.average_terms())
    return figures
