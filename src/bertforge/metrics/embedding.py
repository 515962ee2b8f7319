"""Sentence-embedding metrics on numpy arrays: STS correlations, retrieval figures, pair classification.

Owns the figures sentence-transformers' evaluators report, with the same definitions, so a bertforge number
can be put next to a published one:

- STS (`sts_scores`, as `EmbeddingSimilarityEvaluator`): Pearson and Spearman correlation of the cosine
  similarity of each pair with its gold score (`pearson_cosine`, `spearman_cosine`). Spearman is Pearson of
  the average ranks (tied values share the mean of the ranks they span), as `scipy.stats.spearmanr`.
- Retrieval (`retrieval_scores`, as `InformationRetrievalEvaluator`): from each query's ranked document ids
  and the qrels (query id -> {doc id: relevance}), Accuracy@k, Precision@k, Recall@k, MRR@k, nDCG@k and
  MAP@k averaged over the queries that have a relevant document (the others are left out, as there).
  A document is relevant when its relevance is above 0. nDCG is binary by default (sentence-transformers'
  definition: gain 1 per relevant hit at rank i, discounted by log2(i + 1), over the ideal DCG of
  min(#relevant, k) hits); ``graded=True`` uses the relevance itself as the gain and the ideal ranking of
  the judged relevances (trec_eval's ndcg_cut, which BEIR reports). MAP@k divides by min(k, #relevant).
  Precision@k divides by k even where fewer than k documents were ranked.
- Ranking (`top_k`, `rank_documents`): the k best documents of a [Q, D] score matrix, best first. Equal
  scores are ordered by document id (ascending string order), the tie rule of sentence-transformers, so
  the ranking, and every figure, is the same whatever order or chunking the corpus is scored in.
- Pair classification (`pair_classification_scores`, as `BinaryClassificationEvaluator`): average
  precision of the cosine (`cosine_ap`, scikit-learn's step-wise AP: each distinct score is one threshold),
  and the best accuracy and F1 over thresholds placed between distinct scores, with those thresholds,
  precision, recall and Matthews correlation at the F1 threshold.

Row 0 of the layering: numpy only (no torch, no scipy). Every function checks its input and raises one
`InputError` for empty arrays, mismatched lengths and NaN or infinite values. A correlation with a constant
side is 0.0 (where scipy says NaN), as in `metrics.classification`, so JSON logs stay well defined.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from bertforge.errors import InputError
from bertforge.metrics.classification import pearson, spearman

# Every figure of `retrieval_scores`: accuracy/precision/recall at `k_values`, the others at their own ks.
DEFAULT_K_VALUES = (1, 5, 10, 100)
DEFAULT_MRR_AT = (10,)
DEFAULT_NDCG_AT = (10,)
DEFAULT_MAP_AT = (100,)
# torch.nn.functional.normalize's floor for a vector's norm: a zero vector has cosine 0 with everything.
NORM_EPS = 1e-12

Qrels = Mapping[str, Mapping[str, float]]


# --- input checks ----------------------------------------------------------------------------------------

def check_matrix(values: object, name: str, rows: int | None = None) -> np.ndarray:
    """`values` as a finite float array [N, H] (N > 0, H > 0), with N == `rows` when given.

    Raises:
        InputError: not two-dimensional, empty, the wrong number of rows, not numbers, or a NaN / infinite
            entry (naming the first such row).
    """
    array = np.asarray(values)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise InputError(f"{name} must be a non-empty [N, H] array of vectors, got shape {array.shape}")
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise InputError(f"{name} must hold numbers, got dtype {array.dtype}")
    if rows is not None and array.shape[0] != rows:
        raise InputError(f"{name} has {array.shape[0]} rows where {rows} are needed (one per text)")
    finite = np.isfinite(array).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise InputError(f"{name} row {int(bad[0])} holds NaN or infinity ({len(bad)} rows do); the model "
                         "produced invalid vectors (fp16 overflow?)")
    return array


def check_vector(values: object, name: str, size: int | None = None) -> np.ndarray:
    """`values` as a finite float64 array [N] (N > 0, N == `size` when given); InputError otherwise."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a sequence of numbers") from None
    if array.ndim != 1 or array.size == 0:
        raise InputError(f"{name} must be a non-empty sequence of numbers, got shape {array.shape}")
    if size is not None and array.size != size:
        raise InputError(f"{name} has {array.size} values where {size} are needed (one per pair)")
    if not np.isfinite(array).all():
        raise InputError(f"{name} holds NaN or infinity at position {int(np.flatnonzero(~np.isfinite(array))[0])}")
    return array


def check_labels(labels: object, size: int) -> np.ndarray:
    """Binary labels as an int64 array [size] of 0 and 1; InputError for anything else."""
    array = check_vector(labels, "labels", size)
    if not np.isin(array, (0.0, 1.0)).all():
        raise InputError(f"labels must be 0 or 1, got {sorted(set(array.tolist()) - {0.0, 1.0})[:5]}")
    return array.astype(np.int64)


# --- similarity ------------------------------------------------------------------------------------------

def normalize_rows(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled to unit length (a zero row stays zero), in float32.

    Args:
        vectors: [N, H] numbers.

    Returns:
        [N, H] float32.
    """
    array = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    return array / np.maximum(norms, NORM_EPS)


def cosine_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of row i of `a` with row i of `b` (0 where either is a zero vector).

    Args:
        a, b: [N, H] vectors (checked: same shape, finite).

    Returns:
        [N] float64, computed in float64 from the given values.
    """
    a = check_matrix(a, "embeddings_a").astype(np.float64)
    b = check_matrix(b, "embeddings_b", rows=a.shape[0]).astype(np.float64)
    if a.shape[1] != b.shape[1]:
        raise InputError(f"embeddings_a has vectors of size {a.shape[1]}, embeddings_b of size {b.shape[1]}")
    norms = np.maximum(np.linalg.norm(a, axis=1), NORM_EPS) * np.maximum(np.linalg.norm(b, axis=1), NORM_EPS)
    return np.einsum("nh,nh->n", a, b) / norms


def sts_scores(embeddings_a: np.ndarray, embeddings_b: np.ndarray, gold: object) -> dict[str, float]:
    """Semantic textual similarity: correlation of each pair's cosine with its gold score.

    Args:
        embeddings_a, embeddings_b: [N, H] vectors of the pairs' first and second sentences.
        gold: [N] gold similarity scores (e.g. STS-B's 0-5).

    Returns:
        {"pearson_cosine", "spearman_cosine"}.
    """
    cosine = cosine_pairs(embeddings_a, embeddings_b)
    gold = check_vector(gold, "scores", cosine.size)
    if cosine.size < 2:
        raise InputError("a correlation needs at least two pairs")
    # The correlations of regression scoring (`metrics.classification`): one home, exact sums.
    return {"pearson_cosine": pearson(gold, cosine), "spearman_cosine": spearman(gold, cosine)}


# --- ranking ---------------------------------------------------------------------------------------------

def id_order(ids: Sequence[str]) -> np.ndarray:
    """Each id's position in ascending string order: [D] int64 (the tie-break key of `top_k`)."""
    order = sorted(range(len(ids)), key=ids.__getitem__)
    keys = np.empty(len(ids), dtype=np.int64)
    keys[order] = np.arange(len(ids))
    return keys


def top_k(scores: np.ndarray, k: int, tie_keys: np.ndarray) -> np.ndarray:
    """Column indices of each row's `k` best scores, best first; equal scores by ascending tie key.

    The order is the total order (-score, tie key), so the k chosen among equal scores at the cut are
    always the ones with the smallest keys: the result does not depend on the column order, and merging
    the top k of corpus chunks (`top_k` again over their concatenation) gives the top k of the whole.

    Args:
        scores: [Q, D] finite scores.
        k: how many to keep (at most D are).
        tie_keys: [D] or [Q, D] int64 keys, distinct within a row (e.g. `id_order` of the document ids).

    Returns:
        [Q, min(k, D)] int64 column indices.
    """
    scores = np.asarray(scores)
    rows, columns = scores.shape
    keep = min(int(k), columns)
    if keep <= 0:
        return np.zeros((rows, 0), dtype=np.int64)
    keys = np.broadcast_to(np.asarray(tie_keys, dtype=np.int64), scores.shape)
    cut = np.partition(scores, columns - keep, axis=1)[:, columns - keep, None]  # [Q, 1]: the k-th best score
    # Everything above the cut is in; of the scores equal to it, those with the smallest keys fill the rest.
    # One integer key expresses that: above < tied < below, each by tie key.
    span = int(keys.max()) + 1
    selector = np.where(scores > cut, keys, np.where(scores == cut, keys + span, 2 * span))
    chosen = np.argpartition(selector, keep - 1, axis=1)[:, :keep]
    chosen_scores = np.take_along_axis(scores, chosen, axis=1)
    chosen_keys = np.take_along_axis(keys, chosen, axis=1)
    order = np.lexsort((chosen_keys, -chosen_scores), axis=1)  # last key sorts first: score, then tie key
    return np.take_along_axis(chosen, order, axis=1)


def rank_documents(scores: np.ndarray, query_ids: Sequence[str], doc_ids: Sequence[str],
                   k: int) -> dict[str, list[str]]:
    """Each query's `k` best document ids from a score matrix, best first (ties by document id).

    Args:
        scores: [Q, D] scores, higher is better (e.g. cosine similarities).
        query_ids: [Q] ids of the rows.
        doc_ids: [D] ids of the columns, distinct.
        k: documents kept per query.

    Returns:
        query id -> [min(k, D)] document ids.
    """
    scores = check_matrix(scores, "scores", rows=len(query_ids))
    if scores.shape[1] != len(doc_ids):
        raise InputError(f"scores has {scores.shape[1]} columns for {len(doc_ids)} document ids")
    if len(set(doc_ids)) != len(doc_ids):
        raise InputError("document ids must be distinct")
    best = top_k(scores, k, id_order(doc_ids))
    return {qid: [doc_ids[j] for j in row] for qid, row in zip(query_ids, best.tolist())}


# --- retrieval figures -----------------------------------------------------------------------------------

def _dcg(gains: Sequence[float]) -> float:
    # Rank i (0-based) is discounted by log2(i + 2).
    return math.fsum(g / math.log2(i + 2) for i, g in enumerate(gains) if g)


def _query_figures(ranked: Sequence[str], judged: Mapping[str, float], ks: dict[str, tuple[int, ...]],
                   graded: bool) -> dict[str, float]:
    """Every figure of one query with at least one relevant document."""
    relevant = {doc for doc, grade in judged.items() if grade > 0}
    hits = [doc in relevant for doc in ranked]
    figures = {}
    for k in ks["k_values"]:
        found = sum(hits[:k])
        figures[f"accuracy@{k}"] = float(found > 0)
        figures[f"precision@{k}"] = found / k
        figures[f"recall@{k}"] = found / len(relevant)
    for k in ks["ndcg_at"]:
        if graded:
            gains = [max(float(judged.get(doc, 0)), 0.0) for doc in ranked[:k]]
            ideal = sorted((float(g) for g in judged.values() if g > 0), reverse=True)[:k]
        else:
            gains = [float(h) for h in hits[:k]]
            ideal = [1.0] * min(len(relevant), k)
        figures[f"ndcg@{k}"] = _dcg(gains) / _dcg(ideal)
    for k in ks["mrr_at"]:
        first = next((rank for rank, hit in enumerate(hits[:k]) if hit), None)
        figures[f"mrr@{k}"] = 0.0 if first is None else 1.0 / (first + 1)
    for k in ks["map_at"]:
        precisions, found = [], 0
        for rank, hit in enumerate(hits[:k]):
            if hit:
                found += 1
                precisions.append(found / (rank + 1))
        figures[f"map@{k}"] = math.fsum(precisions) / min(k, len(relevant))
    return figures


def _check_ks(name: str, ks: Sequence[int]) -> tuple[int, ...]:
    values = tuple(ks)
    if not values or any(isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1 for k in values):
        raise InputError(f"{name} must be positive integers, got {list(values)}")
    return tuple(sorted(set(int(k) for k in values)))


def retrieval_depth(k_values: Sequence[int] = DEFAULT_K_VALUES, mrr_at: Sequence[int] = DEFAULT_MRR_AT,
                    ndcg_at: Sequence[int] = DEFAULT_NDCG_AT, map_at: Sequence[int] = DEFAULT_MAP_AT) -> int:
    """How many documents per query the figures look at: the largest k of any of them."""
    return max(max(_check_ks(name, ks)) for name, ks in
               (("k_values", k_values), ("mrr_at", mrr_at), ("ndcg_at", ndcg_at), ("map_at", map_at)))


def relevant_queries(query_ids: Sequence[str], qrels: Qrels) -> list[str]:
    """The queries that have a relevant document (relevance above 0): those the figures average over."""
    return [qid for qid in query_ids if any(grade > 0 for grade in qrels.get(qid, {}).values())]


def retrieval_scores(ranked: Mapping[str, Sequence[str]], qrels: Qrels, *,
                     k_values: Sequence[int] = DEFAULT_K_VALUES, mrr_at: Sequence[int] = DEFAULT_MRR_AT,
                     ndcg_at: Sequence[int] = DEFAULT_NDCG_AT, map_at: Sequence[int] = DEFAULT_MAP_AT,
                     graded: bool = False) -> dict[str, float]:
    """Retrieval figures of ranked lists, averaged over the queries with a relevant document.

    Args:
        ranked: query id -> its document ids, best first (distinct; only the first `retrieval_depth`
            count). Queries without a relevant document in `qrels` are left out, as in
            sentence-transformers; a relevant document missing from the list is simply not found.
        qrels: query id -> {document id: relevance}; relevant means relevance > 0.
        k_values: the ks of accuracy@k (a relevant document in the top k), precision@k (relevant share of k)
            and recall@k (share of the relevant documents in the top k).
        mrr_at, ndcg_at, map_at: the ks of MRR@k, nDCG@k and MAP@k (see the module docstring).
        graded: nDCG with the relevance as gain (trec_eval) instead of binary (sentence-transformers).

    Returns:
        {"accuracy@1": ..., "precision@1": ..., "recall@1": ..., "ndcg@10": ..., "mrr@10": ..., "map@100": ...}

    Raises:
        InputError: no ranked query has a relevant document, a list repeats a document, or a k is not a
            positive integer.
    """
    ks = {"k_values": _check_ks("k_values", k_values), "mrr_at": _check_ks("mrr_at", mrr_at),
          "ndcg_at": _check_ks("ndcg_at", ndcg_at), "map_at": _check_ks("map_at", map_at)}
    depth = max(max(values) for values in ks.values())
    evaluated = relevant_queries(list(ranked), qrels)
    if not evaluated:
        raise InputError(f"none of the {len(ranked)} ranked queries has a relevant document in the qrels "
                         "(relevance > 0); check that query ids match")
    totals: dict[str, list[float]] = {}
    for qid in evaluated:
        docs = list(ranked[qid])
        if len(set(docs)) != len(docs):
            raise InputError(f"the ranking of query {qid!r} lists a document twice")
        for name, value in _query_figures(docs[:depth], qrels[qid], ks, graded).items():
            totals.setdefault(name, []).append(value)
    return {name: math.fsum(values) / len(values) for name, values in totals.items()}


# --- pair classification ---------------------------------------------------------------------------------

def _score_groups(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, ...]:
    """Scores sorted high to low, cut into runs of equal scores: (sorted scores, index of each run's last
    element, positives up to and including each run, elements up to and including each run)."""
    order = np.argsort(-scores, kind="stable")
    ordered, ordered_labels = scores[order], labels[order]
    ends = np.flatnonzero(np.r_[ordered[1:] != ordered[:-1], True])
    return ordered, ends, np.cumsum(ordered_labels)[ends], ends + 1


def _between(ordered: np.ndarray, end: int) -> float:
    """The threshold just below run `end`: halfway to the next score (the run itself when the midpoint
    rounds onto the next score, or when it is the last run)."""
    if end == ordered.size - 1:
        return float(ordered[end])
    middle = (ordered[end] + ordered[end + 1]) / 2
    return float(ordered[end] if middle == ordered[end + 1] else middle)


def average_precision(scores: object, labels: object) -> float:
    """Average precision of a ranking by score (scikit-learn's `average_precision_score`): the sum over
    distinct scores, high to low, of precision there times the recall gained there.

    Args:
        scores: [N] scores, higher = more likely positive.
        labels: [N] 0/1 labels, at least one 1.
    """
    scores = check_vector(scores, "scores")
    labels = check_labels(labels, scores.size)
    positives = int(labels.sum())
    if positives == 0:
        raise InputError("labels hold no positive pair; average precision is undefined")
    _, _, true_positives, seen = _score_groups(scores, labels)
    recall = true_positives / positives
    gained = np.diff(np.r_[0.0, recall])
    return float(np.sum(gained * true_positives / seen))


def best_accuracy(scores: object, labels: object) -> tuple[float, float]:
    """The best accuracy of "positive when score >= threshold" and that threshold.

    Thresholds sit between distinct scores (halfway), plus one above every score (all negative), which is
    kept unless a threshold does strictly better; the first (highest) of equally good thresholds wins.

    Args:
        scores: [N] scores; labels: [N] 0/1.

    Returns:
        (accuracy, threshold).
    """
    scores = check_vector(scores, "scores")
    labels = check_labels(labels, scores.size)
    ordered, ends, true_positives, seen = _score_groups(scores, labels)
    negatives = int((labels == 0).sum())
    # Above the cut after each run: the positives so far are right, so are the negatives still to come.
    accuracies = (true_positives + negatives - (seen - true_positives)) / scores.size
    best = int(np.argmax(accuracies))
    if accuracies[best] > negatives / scores.size:
        return float(accuracies[best]), _between(ordered, int(ends[best]))
    return negatives / scores.size, float(np.nextafter(ordered[0], np.inf))


def best_f1(scores: object, labels: object) -> tuple[float, float, float, float]:
    """The best F1 of "positive when score >= threshold" (thresholds as in `best_accuracy`).

    Args:
        scores: [N] scores; labels: [N] 0/1.

    Returns:
        (f1, precision, recall, threshold); (0, 0, 0, 0.0) when there is no positive.
    """
    scores = check_vector(scores, "scores")
    labels = check_labels(labels, scores.size)
    ordered, ends, true_positives, seen = _score_groups(scores, labels)
    positives = int(labels.sum())
    if positives == 0:
        return 0.0, 0.0, 0.0, 0.0
    precision = true_positives / seen
    recall = true_positives / positives
    with np.errstate(invalid="ignore", divide="ignore"):
        f1 = np.where(true_positives > 0, 2 * precision * recall / (precision + recall), 0.0)
    best = int(np.argmax(f1))
    if f1[best] <= 0:
        return 0.0, 0.0, 0.0, 0.0
    return float(f1[best]), float(precision[best]), float(recall[best]), _between(ordered, int(ends[best]))


def binary_mcc(predicted: np.ndarray, labels: np.ndarray) -> float:
    """Matthews correlation of 0/1 predictions with 0/1 labels; 0.0 when undefined (scikit-learn's rule)."""
    predicted, labels = np.asarray(predicted, dtype=bool), np.asarray(labels, dtype=bool)
    tp, tn = float(np.sum(predicted & labels)), float(np.sum(~predicted & ~labels))
    fp, fn = float(np.sum(predicted & ~labels)), float(np.sum(~predicted & labels))
    denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / denominator if denominator else 0.0


def pair_classification_scores(embeddings_a: np.ndarray, embeddings_b: np.ndarray,
                               labels: object) -> dict[str, float]:
    """Paraphrase / duplicate detection by cosine similarity.

    Args:
        embeddings_a, embeddings_b: [N, H] vectors of the pairs' two sentences.
        labels: [N] 1 (paraphrase, duplicate, entailment) or 0.

    Returns:
        {"cosine_accuracy", "cosine_accuracy_threshold", "cosine_f1", "cosine_f1_threshold",
        "cosine_precision", "cosine_recall", "cosine_ap", "cosine_mcc"} (precision, recall and MCC at the F1
        threshold).
    """
    cosine = cosine_pairs(embeddings_a, embeddings_b)
    labels = check_labels(labels, cosine.size)
    accuracy, accuracy_threshold = best_accuracy(cosine, labels)
    f1, precision, recall, f1_threshold = best_f1(cosine, labels)
    return {"cosine_accuracy": accuracy, "cosine_accuracy_threshold": accuracy_threshold, "cosine_f1": f1,
            "cosine_f1_threshold": f1_threshold, "cosine_precision": precision, "cosine_recall": recall,
            "cosine_ap": average_precision(cosine, labels),
            "cosine_mcc": binary_mcc(cosine >= f1_threshold, labels)}
