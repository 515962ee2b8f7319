"""Sentence-embedding metrics (`metrics.embedding`): hand-computed cases for every figure, the tie rules,
and scipy / scikit-learn as references on random data (both are test dependencies only)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bertforge.errors import InputError
from bertforge.metrics import embedding as m

# --- correlations (one home: metrics.classification's, which STS scoring uses) --------------------------


def test_correlations_match_scipy_on_random_data():
    from bertforge.metrics.classification import pearson, spearman

    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for trial in range(40):
        gold = rng.integers(0, 6, 300).astype(float)  # STS-like: many ties
        predicted = rng.normal(size=300) + 0.3 * gold
        if trial % 2:
            predicted = np.round(predicted, 1)  # ties on both sides
        assert pearson(predicted, gold) == pytest.approx(stats.pearsonr(gold, predicted)[0], abs=1e-12)
        assert spearman(predicted, gold) == pytest.approx(stats.spearmanr(gold, predicted)[0], abs=1e-12)


# --- STS -------------------------------------------------------------------------------------------------

def test_sts_scores_cosine_hand_computed():
    a = np.array([[1, 0], [0, 1], [1, 1], [2, 0]], dtype=np.float32)
    b = np.array([[3, 0], [1, 0], [1, 0], [-1, 0]], dtype=np.float32)
    # Cosines 1, 0, 1/sqrt 2, -1: the gold order 4 > 2 > 3 > 1 is the cosine order.
    assert m.cosine_pairs(a, b) == pytest.approx([1.0, 0.0, math.sqrt(0.5), -1.0])
    figures = m.sts_scores(a, b, [4, 2, 3, 1])
    assert figures["spearman_cosine"] == pytest.approx(1.0)
    assert figures["pearson_cosine"] == pytest.approx(np.corrcoef([4, 2, 3, 1], [1, 0, math.sqrt(0.5), -1])[0, 1])


def test_cosine_pairs_zero_vector_scores_zero():
    assert m.cosine_pairs(np.zeros((1, 3)), np.ones((1, 3))).tolist() == [0.0]


def test_sts_scores_rejects_nan_vectors_naming_the_row():
    a = np.ones((3, 4), dtype=np.float32)
    a[1, 2] = np.nan
    with pytest.raises(InputError, match="row 1 holds NaN"):
        m.sts_scores(a, np.ones((3, 4)), [1, 2, 3])


def test_sts_scores_rejects_empty_and_mismatched_input():
    with pytest.raises(InputError, match="non-empty"):
        m.sts_scores(np.zeros((0, 4)), np.zeros((0, 4)), [])
    with pytest.raises(InputError, match="rows"):
        m.sts_scores(np.ones((3, 4)), np.ones((2, 4)), [1, 2, 3])
    with pytest.raises(InputError, match="size"):
        m.sts_scores(np.ones((3, 4)), np.ones((3, 5)), [1, 2, 3])
    with pytest.raises(InputError, match="3 are needed"):
        m.sts_scores(np.ones((3, 4)), np.ones((3, 4)), [1, 2])


# --- ranking ---------------------------------------------------------------------------------------------

def test_rank_documents_ties_by_ascending_document_id():
    scores = np.array([[0.5, 0.9, 0.5, 0.5]], dtype=np.float32)
    assert m.rank_documents(scores, ["q"], ["c", "a", "b", "d"], 3) == {"q": ["a", "b", "c"]}
    # Sorted ids are compared as strings, as sentence-transformers does: "10" < "9".
    assert m.rank_documents(np.zeros((1, 3)), ["q"], ["9", "10", "1"], 3) == {"q": ["1", "10", "9"]}


def test_top_k_is_independent_of_column_order_and_chunking():
    rng = np.random.default_rng(1)
    scores = np.round(rng.normal(size=(6, 40)), 0).astype(np.float32)  # many ties
    ids = [f"d{i:02d}" for i in rng.permutation(40)]
    expected = [[ids[j] for j in sorted(range(40), key=lambda j: (-scores[q, j], ids[j]))[:7]] for q in range(6)]
    keys = m.id_order(ids)
    assert [[ids[j] for j in row] for row in m.top_k(scores, 7, keys).tolist()] == expected
    perm = rng.permutation(40)
    shuffled = m.top_k(scores[:, perm], 7, keys[perm])
    assert [[ids[perm[j]] for j in row] for row in shuffled.tolist()] == expected
    # The top 7 of two halves' top 7s is the top 7 of the whole.
    halves = [m.top_k(scores[:, s], 7, keys[s]) + s.start for s in (slice(0, 20), slice(20, 40))]
    index = np.concatenate(halves, axis=1)
    merged = m.top_k(np.take_along_axis(scores, index, axis=1), 7, keys[index])
    assert [[ids[j] for j in row] for row in np.take_along_axis(index, merged, axis=1).tolist()] == expected


def test_top_k_keeps_every_column_when_k_exceeds_them():
    assert m.top_k(np.array([[0.1, 0.3]]), 5, np.array([0, 1])).tolist() == [[1, 0]]


# --- retrieval figures -----------------------------------------------------------------------------------

QRELS = {"q1": {"d1": 1, "d3": 1}, "q2": {"d2": 2, "d4": 1}, "q3": {"d5": 1}, "q4": {}, "q5": {"d1": 0}}
RANKED = {"q1": ["d1", "d2", "d3"], "q2": ["d4", "d2", "d1"], "q3": ["d1", "d2", "d3"], "q4": ["d1"], "q5": ["d1"]}
SMALL_KS = {"k_values": (1, 3), "mrr_at": (3,), "ndcg_at": (3,), "map_at": (3,)}


def test_retrieval_scores_hand_computed():
    # q1 hits ranks 1 and 3 of 2 relevant; q2 hits ranks 1 and 2; q3's one relevant document is never
    # retrieved (it still counts, as zeros); q4 (no judgements) and q5 (relevance 0 only) are left out.
    figures = m.retrieval_scores(RANKED, QRELS, **SMALL_KS)
    ndcg_q1 = (1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    expected = {"accuracy@1": 2 / 3, "precision@1": 2 / 3, "recall@1": 1 / 3, "accuracy@3": 2 / 3,
                "precision@3": 4 / 9, "recall@3": 2 / 3, "mrr@3": 2 / 3, "ndcg@3": (ndcg_q1 + 1) / 3,
                "map@3": ((1 + 2 / 3) / 2 + 1) / 3}
    assert figures == pytest.approx(expected, abs=1e-12)
    assert set(figures) == set(expected)


def test_retrieval_scores_graded_ndcg_uses_relevance_as_gain():
    figures = m.retrieval_scores(RANKED, QRELS, **SMALL_KS, graded=True)
    ndcg_q1 = (1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    # q2: gains (1, 2, 0) against the ideal (2, 1).
    ndcg_q2 = (1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3))
    assert figures["ndcg@3"] == pytest.approx((ndcg_q1 + ndcg_q2) / 3, abs=1e-12)
    assert figures["recall@3"] == pytest.approx(2 / 3)  # only nDCG is graded


def test_retrieval_scores_mrr_of_a_later_hit_and_a_short_list():
    figures = m.retrieval_scores({"q": ["x", "y", "a"]}, {"q": {"a": 1}}, k_values=(1, 10), mrr_at=(2, 3),
                                 ndcg_at=(10,), map_at=(10,))
    assert figures["mrr@2"] == 0.0 and figures["mrr@3"] == pytest.approx(1 / 3)
    assert figures["precision@10"] == pytest.approx(1 / 10)  # divided by k, not by the list's length
    assert figures["ndcg@10"] == pytest.approx(1 / math.log2(4))
    assert figures["map@10"] == pytest.approx(1 / 3)


def test_retrieval_scores_map_divides_by_min_of_k_and_relevant():
    qrels = {"q": {f"r{i}": 1 for i in range(5)}}
    figures = m.retrieval_scores({"q": ["r0", "x", "r1"]}, qrels, k_values=(3,), mrr_at=(3,), ndcg_at=(3,),
                                 map_at=(3,))
    assert figures["map@3"] == pytest.approx((1 + 2 / 3) / 3)
    assert figures["ndcg@3"] == pytest.approx((1 + 1 / 2) / (1 + 1 / math.log2(3) + 1 / 2))


def test_retrieval_scores_rejects_bad_input():
    with pytest.raises(InputError, match="none of the 1 ranked queries"):
        m.retrieval_scores({"q4": ["d1"]}, QRELS)
    with pytest.raises(InputError, match="twice"):
        m.retrieval_scores({"q1": ["d1", "d1"]}, QRELS)
    with pytest.raises(InputError, match="positive integers"):
        m.retrieval_scores(RANKED, QRELS, k_values=(0,))


def test_retrieval_depth_is_the_largest_k():
    assert m.retrieval_depth() == 100
    assert m.retrieval_depth((1, 3), (10,), (20,), (5,)) == 20


# --- pair classification ---------------------------------------------------------------------------------

SCORES = [0.9, 0.8, 0.8, 0.3, 0.1]
LABELS = [1, 1, 0, 0, 1]


def test_average_precision_hand_computed_with_tied_scores():
    # Thresholds 0.9, 0.8 (a tie: one step), 0.3, 0.1: recall 1/3, 2/3, 2/3, 1 at precision 1, 2/3, 1/2, 3/5.
    assert m.average_precision(SCORES, LABELS) == pytest.approx((1 + 2 / 3 + 3 / 5) / 3, abs=1e-15)


def test_average_precision_matches_scikit_learn_on_random_data():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(2)
    for _ in range(30):
        labels = rng.integers(0, 2, 200)
        scores = np.round(rng.normal(size=200), 1)
        assert m.average_precision(scores, labels) == pytest.approx(
            metrics.average_precision_score(labels, scores), abs=1e-12)


def test_best_accuracy_hand_computed():
    # Cut below 0.9: 3 of 5 right; the later cuts tie at 3/5 or do worse, and the first best wins.
    assert m.best_accuracy(SCORES, LABELS) == pytest.approx((0.6, 0.85))
    # Nothing beats calling everything negative: the threshold sits just above the top score.
    accuracy, threshold = m.best_accuracy([0.5, 0.4], [0, 0])
    assert accuracy == 1.0 and threshold > 0.5 and threshold == np.nextafter(0.5, 1)


def test_best_f1_hand_computed():
    # F1 0.5, 2/3, 4/7, 3/4 after each distinct score: the last wins, its threshold the score itself.
    assert m.best_f1(SCORES, LABELS) == pytest.approx((0.75, 0.6, 1.0, 0.1))
    assert m.best_f1([0.3, 0.2], [0, 0]) == (0.0, 0.0, 0.0, 0.0)


def test_pair_classification_scores_names_and_mcc():
    a = np.array([[1, 0], [1, 0], [0, 1], [1, 1]], dtype=np.float32)
    b = np.array([[1, 0], [1, 0.2], [1, 0], [1, 0]], dtype=np.float32)
    figures = m.pair_classification_scores(a, b, [1, 1, 0, 0])
    assert set(figures) == {"cosine_accuracy", "cosine_accuracy_threshold", "cosine_f1", "cosine_f1_threshold",
                            "cosine_precision", "cosine_recall", "cosine_ap", "cosine_mcc"}
    assert figures["cosine_ap"] == 1.0 and figures["cosine_accuracy"] == 1.0 and figures["cosine_f1"] == 1.0
    assert figures["cosine_mcc"] == pytest.approx(1.0)
    # All predicted positive: MCC is undefined, reported as 0.
    assert m.binary_mcc(np.ones(4), np.array([1, 0, 1, 0])) == 0.0


def test_pair_classification_rejects_bad_labels():
    with pytest.raises(InputError, match="0 or 1"):
        m.average_precision([0.1, 0.2], [0, 2])
    with pytest.raises(InputError, match="no positive"):
        m.average_precision([0.1, 0.2], [0, 0])
    with pytest.raises(InputError, match="needed"):
        m.best_f1([0.1, 0.2], [0])


# --- the evaluators over a fake encoder (evaluation.embedding) -------------------------------------------

def letter_counts(texts: list[str]) -> np.ndarray:
    """A deterministic toy encoder: counts of a-z per text, float32 [N, 26]."""
    out = np.zeros((len(texts), 26), dtype=np.float32)
    for row, text in enumerate(texts):
        for char in text.lower():
            if "a" <= char <= "z":
                out[row, ord(char) - 97] += 1
    return out


def toy_set():
    from bertforge.data.retrieval import RetrievalSet

    # Anagrams ("abc", "cab", "bca") have equal vectors: exact score ties the id rule must break.
    texts = ["abc", "cab", "bca", "xyz", "zzz", "aab", "hello", "world", "ab", "zy"]
    ids = ["d7", "d3", "d5", "d1", "d9", "d2", "d4", "d6", "d0", "d8"]
    queries = ["abc", "zyx", "hello there", "ab", "nothing"]
    qrels = {"q0": {"d5": 1}, "q1": {"d1": 1, "d8": 2}, "q2": {"d4": 1}, "q3": {"d0": 1, "d2": 1}, "q4": {}}
    return RetrievalSet(ids, [""] * 10, texts, [f"q{i}" for i in range(5)], queries, qrels)


def test_exact_search_is_the_same_for_every_chunking():
    from bertforge.evaluation.embedding import exact_search

    retrieval = toy_set()
    queries = letter_counts(retrieval.query_texts)
    whole = exact_search(letter_counts, retrieval.corpus_texts, retrieval.corpus_ids, queries, 6,
                         corpus_chunk_size=100)
    scores = m.normalize_rows(queries) @ m.normalize_rows(letter_counts(retrieval.corpus_texts)).T
    brute = [sorted(range(10), key=lambda j, q=q: (-scores[q, j], retrieval.corpus_ids[j]))[:6] for q in range(5)]
    assert whole[0].tolist() == brute
    assert [retrieval.corpus_ids[j] for j in whole[0][0][:3]] == ["d3", "d5", "d7"]  # the anagram tie, by id
    for corpus_chunk, query_chunk in ((1, 1), (3, 2), (4, 100)):
        chunked = exact_search(letter_counts, retrieval.corpus_texts, retrieval.corpus_ids, queries, 6,
                               corpus_chunk_size=corpus_chunk, query_chunk_size=query_chunk)
        assert chunked[0].tolist() == whole[0].tolist() and np.array_equal(chunked[1], whole[1])


def test_evaluate_retrieval_matches_ranking_by_hand_and_reranks():
    from bertforge.evaluation.embedding import evaluate_retrieval

    retrieval = toy_set()
    figures = evaluate_retrieval(letter_counts, retrieval, k_values=(1, 3), corpus_chunk_size=3)
    scores = m.normalize_rows(letter_counts(retrieval.query_texts[:4])) @ \
        m.normalize_rows(letter_counts(retrieval.corpus_texts)).T
    ranked = m.rank_documents(scores, retrieval.query_ids[:4], retrieval.corpus_ids, 100)
    assert figures == m.retrieval_scores(ranked, retrieval.qrels, k_values=(1, 3))
    # An oracle re-ranker (each query's relevant documents first) makes every first hit rank 1.
    relevant = {text: {retrieval.corpus_texts[retrieval.corpus_ids.index(d)] for d in retrieval.qrels[qid]}
                for qid, text in zip(retrieval.query_ids, retrieval.query_texts)}
    seen = []

    def oracle(query: str, documents: list[str]) -> np.ndarray:
        seen.append(len(documents))
        return np.array([float(doc in relevant[query]) for doc in documents])

    both = evaluate_retrieval(letter_counts, retrieval, k_values=(1, 3), rerank=oracle, rerank_depth=10)
    assert both["rerank_mrr@10"] == 1.0 and both["mrr@10"] == figures["mrr@10"] and seen == [10] * 4


def test_evaluators_encode_each_distinct_sentence_once_and_check_vectors():
    from bertforge.evaluation.embedding import evaluate_paraphrase, evaluate_sts

    calls = []

    def encode(texts):
        calls.append(list(texts))
        return letter_counts(texts)

    figures = evaluate_sts(encode, ["abc", "xyz", "abc"], ["abd", "xya", "ab"], [5, 1, 4])
    assert calls == [["abc", "xyz", "abd", "xya", "ab"]] and set(figures) == {"pearson_cosine", "spearman_cosine"}
    assert evaluate_paraphrase(letter_counts, ["abc", "xyz"], ["cab", "qqq"], [1, 0])["cosine_ap"] == 1.0
    with pytest.raises(InputError, match="rows where 2 are needed"):
        evaluate_sts(lambda texts: np.ones((1, 4)), ["a"], ["b"], [1])
    with pytest.raises(InputError, match="NaN"):
        evaluate_sts(lambda texts: np.full((len(texts), 4), np.nan), ["a", "c"], ["b", "d"], [1, 2])
    with pytest.raises(InputError, match="1 first sentences for 2"):
        evaluate_paraphrase(letter_counts, ["a"], ["b", "c"], [1])
