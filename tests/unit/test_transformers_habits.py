"""A script written in transformers' habits runs: a callable tokenizer returning tensors, outputs indexed as
tuples, `pooler_output`, transformers' pipeline task names, and the task read from the directory."""

from __future__ import annotations

import string

import numpy as np
import pytest
import torch

from bertforge.errors import InputError
from bertforge.families.classification import BertForSequenceClassification
from bertforge.families.question_answering import BertForQuestionAnswering
from bertforge.families.tagging import BertForTokenClassification
from bertforge.inference import pipelines as P
from bertforge.model.bert import BertModel
from bertforge.model.config import BertConfig
from bertforge.tokenization import Tokenizer, TokenizerConfig
from bertforge.tokenization.vocab import Vocab

WORDS = "the cat sat on mat paris is capital of france john lives in london".split()


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    letters = [c for c in string.ascii_lowercase if c not in WORDS]
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *".,?!", *letters]
    return Tokenizer(Vocab(tokens), TokenizerConfig(model_max_length=64))


@pytest.fixture(scope="module")
def config(tokenizer) -> BertConfig:
    return BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)


def test_tokenizer_call_returns_model_inputs_as_torch_tensors(tokenizer, config):
    inputs = tokenizer("the cat sat", return_tensors="pt")
    assert set(inputs) == {"input_ids", "token_type_ids", "attention_mask"}
    assert inputs["input_ids"].dtype == torch.int64 and inputs.input_ids.shape == (1, 5)
    assert inputs.input_ids[0].tolist() == tokenizer.encode("the cat sat").ids
    torch.manual_seed(0)
    model = BertModel(config).eval()
    with torch.no_grad():
        outputs = model(**inputs)
    assert torch.equal(outputs[0], outputs.last_hidden_state)
    assert torch.equal(outputs.pooler_output, outputs.pooled_output)
    assert torch.equal(outputs[1], outputs.pooled_output)


def test_tokenizer_call_takes_pairs_lists_and_pads(tokenizer):
    pair = tokenizer("john lives", "in london")
    assert pair["token_type_ids"] == tokenizer.encode("john lives", "in london").type_ids
    assert isinstance(pair["input_ids"][0], int)  # one text: flat lists, as transformers gives them
    batch = tokenizer(["the cat", "paris is the capital of france"], padding=True, return_tensors="np")
    assert batch["input_ids"].shape == (2, 8) and batch["attention_mask"][0].tolist() == [1] * 4 + [0] * 4
    assert isinstance(batch["input_ids"], np.ndarray)
    pairs = tokenizer(["the cat", "john"], ["sat", "lives in london"], padding=True)
    assert [len(row) for row in pairs["input_ids"]] == [7, 7] and pairs["token_type_ids"][1][3:6] == [1, 1, 1]
    with pytest.raises(InputError, match="padding=True"):
        tokenizer(["the cat", "paris is the capital"], return_tensors="pt")
    with pytest.raises(InputError, match="return_tensors"):
        tokenizer("the cat", return_tensors="tf")


def test_task_outputs_index_as_transformers_tuples(config):
    torch.manual_seed(0)
    model = BertForSequenceClassification(config.with_labels(["a", "b"])).eval()
    ids = torch.tensor([[2, 5, 6, 3]])
    out = model(ids)
    assert torch.equal(out[0], out.logits)
    with_loss = model(ids, labels=torch.tensor([1]))
    assert torch.equal(with_loss[0], with_loss.loss) and torch.equal(with_loss[1], with_loss.logits)
    qa = BertForQuestionAnswering(config).eval()(ids)
    assert torch.equal(qa[0], qa.start_logits) and torch.equal(qa[1], qa.end_logits)


@pytest.mark.parametrize(("name", "route"), [
    ("feature-extraction", "embed"), ("sentiment-analysis", "classify"), ("text-classification", "classify"),
    ("ner", "tag"), ("token-classification", "tag"), ("question-answering", "answer"), ("fill-mask", "fill-mask")])
def test_pipeline_transformers_task_names_are_aliases(name, route):
    from bertforge.families import registry

    assert registry.route(name) == route
    assert registry.for_task(registry.route(name)).task == route


def test_pipeline_transformers_names_load_and_task_comes_from_the_directory(tokenizer, config, tmp_path):
    torch.manual_seed(0)
    tagger = BertForTokenClassification(config.with_labels(["O", "B-PER", "I-PER"]))
    tagger.save_pretrained(tmp_path / "tagger", tokenizer=tokenizer)
    BertModel(config).save_pretrained(tmp_path / "encoder", tokenizer=tokenizer)
    assert P.load_pipeline(tmp_path / "tagger", "ner").task == "tag"
    assert P.load_pipeline(tmp_path / "tagger").task == "tag"
    assert P.load_pipeline(tmp_path / "encoder").task == "embed"
    assert P.load_pipeline(tmp_path / "encoder", "feature-extraction").encode(["the cat"]).shape == (1, 32)
