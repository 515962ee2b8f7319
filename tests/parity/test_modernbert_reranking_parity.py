"""Cross-encoders on ModernBERT (a one-output `ModernBertForSequenceClassification`, the shape of
gte-reranker-modernbert-base) against sentence-transformers' `CrossEncoder` on the same directory, both ways, on
tiny random models with a byte-level BPE tokenizer.json: a directory transformers saved reranks here (the `rerank`
pipeline, and bi-encoder top-k reranking in `evaluate_retrieval`) with CrossEncoder's scores, a long pair read in
one window of the model's own length; a reranker saved here loads in CrossEncoder with ours; lists of pairs
([B, L, T], listwise training) score as their rows do in transformers. max |Δ| ≤ 1e-5 fp32.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from tests.parity.test_modernbert_parity import FP32_ATOL, batch, tiny, twins

from bertforge.inference.pipelines import load_pipeline, load_pipelines, rerank_scores
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.fast_paths import set_fast_paths
from bertforge.model.modernbert import ModernBertForSequenceClassification
from bertforge.tokenization.tokenizer_json import train_bpe

st = pytest.importorskip("sentence_transformers")
transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

BOUND = 1e-5
CORPUS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France, said the guide.",
          "Naive cafe owners serve creme brulee daily!"] * 20
QUERY = "where is the capital of france"
# Short and long candidates (past the local window of 8), unknown bytes, and one past 512 tokens with the query.
TEXTS = ["Paris is the capital of France.", "the lazy dog " * 12, "cafe ñandú 北京", "creme brulee daily " * 160]
POSITIONS = 2048


def their_cross_encoder(folder, pooling: str = "cls"):
    """A random transformers `ModernBertForSequenceClassification` with one output and its tokenizer.json, as
    transformers saves it (no fine-tuning record): the shape of gte-reranker-modernbert-base."""
    tokenizer = train_bpe(CORPUS, vocab_size=300)
    tokenizer.save_pretrained(folder)
    config = transformers.ModernBertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
        num_attention_heads=2, local_attention=8, max_position_embeddings=POSITIONS,
        pad_token_id=tokenizer.pad_token_id, cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
        bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id, classifier_pooling=pooling,
        num_labels=1)
    torch.manual_seed(1)
    transformers.ModernBertForSequenceClassification(config).save_pretrained(folder)
    return tokenizer


def cross_encoder_scores(folder, texts=TEXTS) -> np.ndarray:
    return np.asarray(st.CrossEncoder(str(folder), device="cpu").predict([(QUERY, t) for t in texts]),
                      dtype=np.float64)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_modernbert_cross_encoder_saved_by_transformers_reranks_with_cross_encoders_scores(tmp_path, pooling):
    tokenizer = their_cross_encoder(tmp_path, pooling)
    assert len(tokenizer.encode(QUERY, TEXTS[-1]).ids) > 512  # read in one window, as CrossEncoder reads it
    pipeline = load_pipeline(tmp_path, "rerank", device="cpu")
    assert pipeline.max_length == POSITIONS
    ours = rerank_scores(pipeline, QUERY, TEXTS)
    theirs = cross_encoder_scores(tmp_path)
    assert np.abs(ours - theirs).max() <= BOUND
    # Served by default beside its own route, as a one-output BERT classifier is.
    assert list(load_pipelines(tmp_path, device="cpu")) == ["classify", "rerank", "embed"]


def test_modernbert_reranker_saved_here_loads_in_cross_encoder_with_our_scores(tmp_path):
    tokenizer = train_bpe(CORPUS, vocab_size=300)
    config = ModernBertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=48,
                              num_hidden_layers=3, num_attention_heads=2, local_attention=8,
                              max_position_embeddings=POSITIONS, pad_token_id=tokenizer.pad_token_id,
                              cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
                              classifier_pooling="mean", problem_type="regression")
    torch.manual_seed(2)
    ModernBertForSequenceClassification(config).save_pretrained(tmp_path, tokenizer=tokenizer)
    theirs = st.CrossEncoder(str(tmp_path), device="cpu")
    assert type(theirs.model).__name__ == "ModernBertForSequenceClassification"
    ours = rerank_scores(load_pipeline(tmp_path, "rerank", device="cpu"), QUERY, TEXTS)
    assert np.abs(ours - cross_encoder_scores(tmp_path)).max() <= BOUND


@pytest.mark.parametrize("unpad", [False, True], ids=["padded_layout", "unpadded_layout"])
def test_modernbert_cross_encoder_scores_lists_of_pairs_as_their_rows(unpad):
    """Listwise training feeds [B, L, T] lists: each pair's logit is transformers' logit of that row."""
    config = tiny(local_attention=4, id2label={0: "LABEL_0"}, problem_type="regression")
    ours, theirs = twins(ModernBertForSequenceClassification, config)
    set_fast_paths(ours, unpad=unpad)
    rows = batch(config, 12, padded=True, rows=3)
    lists = {name: torch.stack([rows[name], rows[name].flip(0)]) for name in rows}  # [2, 3, T]
    with torch.no_grad():
        scored = ours(**lists).logits
        expected = theirs(**{name: value.flatten(0, 1) for name, value in lists.items()}).logits.view(2, 3)
    assert scored.shape == (2, 3)
    torch.testing.assert_close(scored, expected, atol=FP32_ATOL, rtol=1e-5)


def test_modernbert_cross_encoder_reranks_bi_encoder_hits_as_cross_encoder_does(tmp_path):
    from bertforge.data.retrieval import RetrievalSet
    from bertforge.evaluation.embedding import evaluate_retrieval

    their_cross_encoder(tmp_path)
    pipeline = load_pipeline(tmp_path, "rerank", device="cpu")
    reference = st.CrossEncoder(str(tmp_path), device="cpu")
    corpus = ["Paris is in France.", "the lazy dog sleeps", "creme brulee daily", "the quick brown fox",
              "cafe owners in Paris", "France has a capital"]
    queries = ["capital of france", "a lazy dog", "brown fox"]
    data = RetrievalSet([f"d{i}" for i in range(6)], [""] * 6, corpus, ["q0", "q1", "q2"], queries,
                        {"q0": {"d0": 1, "d5": 1}, "q1": {"d1": 1}, "q2": {"d3": 1}})

    def letters(texts):  # a fixed bi-encoder: letter counts
        return np.asarray([[text.lower().count(c) for c in "abcdefghijklmnopqrstuvwxyz"] for text in texts],
                          dtype=np.float32)

    def theirs(query, documents):
        return np.asarray(reference.predict([(query, d) for d in documents]), dtype=np.float64)

    ours = evaluate_retrieval(letters, data, k_values=(1, 3), rerank=lambda q, d: rerank_scores(pipeline, q, d),
                              rerank_depth=4)
    expected = evaluate_retrieval(letters, data, k_values=(1, 3), rerank=theirs, rerank_depth=4)
    assert any(name.startswith("rerank_") for name in ours)
    assert ours == pytest.approx(expected, abs=1e-9)
