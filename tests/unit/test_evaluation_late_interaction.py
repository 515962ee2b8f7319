"""Late-interaction retrieval evaluation: exact MaxSim over the corpus, whatever the chunking, reported with the
dense evaluator's figures; checked encoders; reranking a list by MaxSim."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from bertforge.data.retrieval import RetrievalSet
from bertforge.errors import InputError
from bertforge.evaluation.late_interaction import (
    embed_tokens,
    evaluate_late_interaction_retrieval,
    late_interaction_rankings,
    maxsim_reranker,
)
from bertforge.metrics.embedding import retrieval_scores


def token_vectors(text: str, width: int = 8) -> np.ndarray:
    """A text's unit token vectors, fixed by the text: 1 to 6 of them."""
    rng = np.random.default_rng(zlib.crc32(text.encode()))
    vectors = rng.standard_normal((1 + len(text) % 6, width)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def encode(texts: list[str]) -> list[np.ndarray]:
    return [token_vectors(t) for t in texts]


def small_set() -> RetrievalSet:
    ids = [f"d{i}" for i in range(9)]
    texts = [f"paragraph number {i} about {'x' * i}" for i in range(9)]
    queries = [f"question {i}?" for i in range(5)]
    qrels = {"q0": {"d3": 1}, "q1": {"d0": 1, "d8": 1}, "q2": {"d5": 1}, "q3": {"d1": 1}}  # q4: no relevant one
    return RetrievalSet(ids, [""] * 9, texts, [f"q{i}" for i in range(5)], queries, qrels)


def brute_force(data: RetrievalSet) -> dict[str, list[str]]:
    documents = dict(zip(data.corpus_ids, data.documents(True)))
    ranked = {}
    for qid, text in zip(data.query_ids, data.query_texts):
        if qid not in data.qrels:
            continue
        query = token_vectors(text)
        scores = {d: float(sum(max(float(q @ t) for t in token_vectors(doc)) for q in query))
                  for d, doc in documents.items()}
        ranked[qid] = sorted(scores, key=lambda d: (-round(scores[d], 5), d))
    return ranked


@pytest.mark.parametrize("chunk", [1, 2, 4, 100])
def test_late_interaction_rankings_are_exact_maxsim_at_any_corpus_chunk(chunk):
    data = small_set()
    ranked, summary = late_interaction_rankings(encode, data, 9, corpus_chunk_size=chunk)
    assert ranked == brute_force(data)  # q4 has no relevant document: not evaluated
    lengths = [len(token_vectors(t)) for t in data.documents(True)]
    assert summary["document_vectors"] == pytest.approx(sum(lengths) / 9)


def test_evaluate_late_interaction_retrieval_reports_the_dense_evaluators_figures():
    data = small_set()
    figures = evaluate_late_interaction_retrieval(encode, data, corpus_chunk_size=3)
    expected = retrieval_scores(brute_force(data), data.qrels)
    assert {"ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100", "map@100"} <= set(figures)
    for name, value in expected.items():
        assert figures[name] == pytest.approx(value, abs=1e-9), name
    assert figures["query_vectors"] > 0 and figures["document_vectors"] > 0


def test_late_interaction_uses_the_document_encoder_for_documents():
    data = small_set()
    seen: list[str] = []

    def documents(texts: list[str]) -> list[np.ndarray]:
        seen.extend(texts)
        return encode(texts)

    late_interaction_rankings(encode, data, 5, encode_documents=documents, corpus_chunk_size=4)
    assert seen == data.documents(True)  # every document once, in chunks, none of the queries


@pytest.mark.parametrize("bad, message", [
    (lambda texts: encode(texts)[:-1], "returned 2 results for 3"),
    (lambda texts: [np.zeros((2, 8)), np.zeros((2, 5)), np.zeros((1, 8))], r"texts\[1\] is \[2, 5\]"),
    (lambda texts: [np.zeros((2, 8)), np.zeros((0, 8)), np.zeros((1, 8))], r"texts\[1\] is \[0, 8\]"),
    (lambda texts: [np.zeros((2, 8)), np.full((1, 8), np.nan), np.zeros((1, 8))], "NaN"),
])
def test_embed_tokens_refuses_what_is_not_one_finite_matrix_per_text(bad, message):
    with pytest.raises(InputError, match=message):
        embed_tokens(bad, ["a", "b", "c"])


def test_maxsim_reranker_scores_each_candidate_by_maxsim():
    queries = {"q": token_vectors("the query")}
    documents = {name: token_vectors(name) for name in ("one", "two words", "three of them")}
    scores = maxsim_reranker(queries, documents)("q", list(documents))
    expected = [sum(max(float(q @ t) for t in d) for q in queries["q"]) for d in documents.values()]
    assert scores == pytest.approx(expected, abs=1e-5)
    assert maxsim_reranker(queries, documents)("q", []).shape == (0,)
