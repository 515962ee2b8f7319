"""ColBERT and SPLADE on a ModernBERT encoder, both ways with sentence-transformers (tiny random models, no remote
code): a PyLate directory around a transformers `ModernBertModel` (what GTE-ModernColBERT ships: its byte-level BPE
tokenizer.json holding PyLate's "[Q] " and "[D] " prefixes as added tokens, the Dense projection, PyLate's
settings) loads here with sentence-transformers 6's `MultiVectorEncoder`'s token vectors (which are PyLate 1.6.0's,
checked in the slow test against PyLate itself) within 1e-5 and MaxSim scores within 1e-4; saved here, it loads
there equal. A SparseEncoder directory around a transformers `ModernBertForMaskedLM` gives their SPLADE vectors
here, and ours saved here give ours there.

sentence-transformers and transformers are test dependencies only; the package never imports them.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.parity.test_colbert_parity import DOCUMENTS, QUERIES, assert_same, our_vectors

from bertforge.errors import CheckpointError
from bertforge.families import registry
from bertforge.families.colbert import ModernBertForColBERT
from bertforge.families.sparse import ModernBertForSparseEmbedding
from bertforge.inference.pipelines import load_pipeline
from bertforge.metrics.sparse import SparseRows
from bertforge.tokenization.tokenizer_json import train_bpe

st = pytest.importorskip("sentence_transformers")
transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CORPUS = QUERIES + DOCUMENTS + ["The quick brown fox jumps over the lazy dog.",
                                "Naive cafe owners serve creme brulee daily!"] * 10
PYLATE_PYTHON = Path("/work/pylate-venv/bin/python")
SPARSE = 1e-5


def hf_tokenizer(folder: Path, added: list[str]) -> int:
    """A byte-level BPE tokenizer trained here, saved as transformers saves it, with `added` tokens appended as
    PyLate appends its prefixes (`add_tokens`), [MASK] as its pad token as PyLate 1.6.0 saves it: its size."""
    ours = train_bpe(CORPUS, vocab_size=300)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=ours.backend, pad_token="[PAD]", unk_token="[UNK]",
                                                cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                                model_max_length=512)
    fast.add_tokens(added)
    fast.pad_token = "[MASK]"
    fast.save_pretrained(folder)
    return len(fast)


def hf_config(vocab_size: int, **fields):
    """transformers' ModernBERT config of a tiny model: 3 layers (global, local, local), a local window of 8."""
    return transformers.ModernBertConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=48,
                                         num_hidden_layers=3, num_attention_heads=2, local_attention=8,
                                         max_position_embeddings=512, pad_token_id=0, cls_token_id=2, sep_token_id=3,
                                         bos_token_id=2, eos_token_id=3, initializer_range=0.2, **fields)


def pylate_directory(folder: Path, seed: int = 0, **settings) -> Path:
    """A ColBERT directory as PyLate 1.6.0 writes it around a ModernBERT (its `ColBERT(...).save`): the
    transformers model at the root, its tokenizer with the prefixes added, `1_Dense`, PyLate's settings."""
    size = hf_tokenizer(folder, ["[Q] ", "[D] "])
    torch.manual_seed(seed)
    transformers.ModernBertModel(hf_config(size)).save_pretrained(folder)
    dense = st.base.modules.dense.Dense(32, 24, bias=False, activation_function=torch.nn.Identity(),
                                        module_input_name="token_embeddings")
    (folder / "1_Dense").mkdir()
    dense.save(str(folder / "1_Dense"))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}]))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512, "do_lower_case": False}))
    (folder / "config_sentence_transformers.json").write_text(json.dumps({
        "model_type": "ColBERT", "prompts": {"query": "", "document": ""}, "default_prompt_name": None,
        "similarity_fn_name": "MaxSim", "query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 16,
        "document_length": 20, "attend_to_expansion_tokens": False, "do_query_expansion": True, **settings}))
    return folder


# Queries of 16 positions with [MASK]s farther than the local window from any real token ("ok"); of 40, past
# 4 windows, so local layers take the banded path; attended expansion; none.
@pytest.mark.parametrize("settings", [{}, {"query_length": 40}, {"attend_to_expansion_tokens": True},
                                      {"do_query_expansion": False}])
def test_modernbert_colbert_pylate_directory_loads_here_with_their_vectors(tmp_path, settings):
    folder = pylate_directory(tmp_path / "pylate", **settings)
    model, _ = registry.load_model(folder)
    assert isinstance(model, ModernBertForColBERT) and model.dimension == 24
    assert model.colbert.query_marker == "[Q] " and (model.tokens.query_marker, model.tokens.document_marker) \
        == tuple(transformers.AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids(["[Q] ", "[D] "]))
    assert_same(folder, folder)


def test_modernbert_colbert_saved_here_loads_in_multi_vector_encoder_equal(tmp_path):
    pylate_directory(tmp_path / "pylate", seed=1)
    model, _ = registry.load_model(tmp_path / "pylate")
    model.save_pretrained(tmp_path / "ours", tokenizer=load_pipeline(tmp_path / "pylate", "embed").tokenizer)
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("modernbert", ["ModernBertModel"])
    settings = json.loads((tmp_path / "ours" / "config_sentence_transformers.json").read_text())
    assert (settings["query_prefix"], settings["document_prefix"]) == ("[Q] ", "[D] ")  # as PyLate wrote them
    assert_same(tmp_path / "ours", tmp_path / "ours")  # MultiVectorEncoder on our directory: our vectors
    for mine, first in zip(*(our_vectors(tmp_path / name) for name in ("ours", "pylate"))):
        for a, b in zip(mine, first):
            np.testing.assert_array_equal(a, b)


def test_modernbert_colbert_refuses_stanford_layout(tmp_path):
    model, _ = registry.load_model(pylate_directory(tmp_path / "pylate"))
    model.layout = "stanford"
    with pytest.raises(CheckpointError, match="Stanford ColBERT's layout holds a BERT encoder"):
        model.save_pretrained(tmp_path / "stanford")


def sparse_vectors(folder: Path, texts: list[str], vocab: int) -> np.ndarray:
    results = load_pipeline(folder, "embed-sparse", device="cpu")(list(texts))
    return SparseRows.from_vectors([(r["indices"], r["values"]) for r in results], vocab).dense()


def test_modernbert_sparse_encoder_both_ways(tmp_path):
    """Their SparseEncoder around a ModernBertForMaskedLM gives its vectors here; a plain masked-LM directory
    asked for sparse vectors loads as ours, and saved with SparseEncoder files, loads there with ours."""
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    size = hf_tokenizer(tmp_path / "mlm", [])
    torch.manual_seed(0)
    mlm = transformers.ModernBertForMaskedLM(hf_config(size))
    with torch.no_grad():
        mlm.decoder.bias.fill_(-2.0)  # most terms 0, as in a trained SPLADE model
    mlm.save_pretrained(tmp_path / "mlm")
    texts = QUERIES + DOCUMENTS
    encoder = st.SparseEncoder(modules=[Transformer(str(tmp_path / "mlm"), transformer_task="fill-mask"),
                                        SpladePooling("max")], device="cpu")
    theirs = encoder.encode(texts, convert_to_tensor=True, batch_size=3).to_dense().cpu().numpy()
    assert 0 < (theirs > 0).sum(1).min() and (theirs > 0).mean() < 0.5  # neither empty nor dense
    for folder in (tmp_path / "mlm", None):
        if folder is None:  # theirs saved, then ours saved and loaded there
            encoder.save(str(tmp_path / "theirs"))
            folder = tmp_path / "theirs"
        ours = sparse_vectors(folder, texts, size)
        assert np.abs(ours - theirs).max() <= SPARSE and ((ours > 0) == (theirs > 0)).all()
    model, _ = registry.load_model(tmp_path / "mlm", registry.class_for_tasks("ModernBertForMaskedLM",
                                                                              ["embed-sparse"]))
    assert isinstance(model, ModernBertForSparseEmbedding)
    model.save_pretrained(tmp_path / "ours", tokenizer=load_pipeline(tmp_path / "mlm", "embed").tokenizer)
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("modernbert", ["ModernBertForMaskedLM"])
    assert isinstance(registry.load_model(tmp_path / "ours")[0], ModernBertForSparseEmbedding)
    again = st.SparseEncoder(str(tmp_path / "ours"), device="cpu")
    there = again.encode(texts, convert_to_tensor=True, batch_size=3).to_dense().cpu().numpy()
    assert np.abs(sparse_vectors(tmp_path / "ours", texts, size) - there).max() <= SPARSE


PYLATE_SCRIPT = """
import json, sys
from pylate import models
folder, out, build = sys.argv[1], sys.argv[2], sys.argv[3] == "build"
texts = json.loads(sys.argv[4])
if build:  # a ColBERT around the transformers ModernBERT at `folder`: PyLate adds its prefixes and the Dense
    model = models.ColBERT(folder + "/hf", device="cpu", embedding_size=24, query_length=16, document_length=20)
    model.save(folder + "/pylate")
model = models.ColBERT(folder + "/pylate" if build else folder, device="cpu")
vectors = [x.tolist() for x in model.encode(texts["queries"], is_query=True, batch_size=3)] + \\
          [x.tolist() for x in model.encode(texts["documents"], is_query=False, batch_size=3)]
json.dump(vectors, open(out, "w"))
"""


def pylate_vectors(folder: Path, out: Path, build: bool) -> list[np.ndarray]:
    texts = json.dumps({"queries": QUERIES, "documents": DOCUMENTS})
    subprocess.run([str(PYLATE_PYTHON), "-c", PYLATE_SCRIPT, str(folder), str(out), "build" if build else "load",
                    texts], check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)
    return [np.array(v) for v in json.loads(out.read_text())]


@pytest.mark.slow
@pytest.mark.skipif(not PYLATE_PYTHON.is_file(), reason="PyLate 1.6.0's venv (/work/pylate-venv) is not here")
def test_modernbert_colbert_equals_pylate_itself_both_ways(tmp_path):
    """PyLate 1.6.0 (its own venv: it pins older torch/transformers than the suite) builds a ColBERT around a
    random transformers ModernBERT and encodes; ours loads that directory with its vectors, saves it, and PyLate
    loads ours with ours."""
    size = hf_tokenizer(tmp_path / "hf", [])
    torch.manual_seed(0)
    transformers.ModernBertModel(hf_config(size)).save_pretrained(tmp_path / "hf")
    theirs = pylate_vectors(tmp_path, tmp_path / "theirs.json", build=True)
    queries, documents = our_vectors(tmp_path / "pylate")
    for mine, reference in zip(queries + documents, theirs):
        assert mine.shape == reference.shape and np.abs(mine - reference).max() <= 1e-5
    model, _ = registry.load_model(tmp_path / "pylate")
    model.save_pretrained(tmp_path / "ours", tokenizer=load_pipeline(tmp_path / "pylate", "embed").tokenizer)
    again = pylate_vectors(tmp_path / "ours", tmp_path / "again.json", build=False)
    for mine, reference in zip(queries + documents, again):
        assert mine.shape == reference.shape and np.abs(mine - reference).max() <= 1e-5
