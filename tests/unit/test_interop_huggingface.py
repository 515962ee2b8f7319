"""The Hugging Face key table and config translation, and checkpoints crossing between us and `transformers`.

The key table must be a bijection between our parameter names and theirs and must cover exactly the
tensors of their matching class (minus tied copies and buffers). Round trips go through real directories:
ours saved -> their `from_pretrained` with no missing or unexpected keys -> same logits, and theirs saved
(safetensors, and a legacy `pytorch_model.bin`) -> our loader -> same logits.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from bertforge.families.classification import BertForSequenceClassification
from bertforge.families.multiple_choice import BertForMultipleChoice
from bertforge.families.pretraining import BertForMaskedLM, BertForPretraining
from bertforge.families.question_answering import BertForQuestionAnswering
from bertforge.families.registry import load_model
from bertforge.families.tagging import BertForTokenClassification
from bertforge.interop import huggingface as hf
from bertforge.model.bert import BertModel
from bertforge.model.fast_paths import fast_paths_enabled, set_fast_paths

transformers = pytest.importorskip("transformers")

FP32_ATOL = 1e-5
FP32_RTOL = 1e-5

MODEL_CLASSES = (BertModel, BertForPretraining, BertForSequenceClassification, BertForTokenClassification,
                 BertForQuestionAnswering, BertForMultipleChoice)
# Models whose main output has one row per token (padding positions included).
TOKEN_LEVEL = (BertModel, BertForPretraining, BertForTokenClassification)


def reference_class(cls):
    return getattr(transformers, hf.ARCHITECTURES[cls.__name__])


def reference_config(config, cls):
    return transformers.BertConfig.from_dict(hf.config_to_hf(config.to_dict(), cls.__name__))


def sample_inputs(config, cls, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    shape = (2, 3, 7) if cls is BertForMultipleChoice else (2, 7)
    input_ids = torch.randint(1, config.vocab_size, shape, generator=generator)
    attention_mask = torch.ones(shape, dtype=torch.long)
    attention_mask[..., 0, 5:] = 0  # padding in the first row
    token_type_ids = torch.zeros(shape, dtype=torch.long)
    token_type_ids[..., 3:5] = 1
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}


def main_output(output) -> torch.Tensor:
    """The one tensor that sums up a forward pass, for either side's output class."""
    for name in ("mlm_logits", "prediction_logits", "start_logits", "logits", "last_hidden_state"):
        if getattr(output, name, None) is not None:
            return getattr(output, name)
    raise AssertionError(f"no known output field in {type(output).__name__}")


def assert_same_outputs(ours, theirs, config, cls) -> None:
    """Same outputs as theirs: at every real token on our model as given (fast paths as it has them), and
    at every position, padding included, on our plain path (unpadded, unfused off)."""
    inputs = sample_inputs(config, cls)
    real = inputs["attention_mask"].bool()
    plain = set_fast_paths(copy.deepcopy(ours), unpad=False, fused_qkv=False)
    with torch.no_grad():
        their_output = main_output(theirs(**inputs))
        our_output, plain_output = main_output(ours(**inputs)), main_output(plain(**inputs))
    if cls is BertForQuestionAnswering:
        # Our span logits are masked at padding (so padding never enters the start/end softmax, whatever
        # the batch layout); theirs score padding from its hidden state. Only real tokens are comparable.
        for output in (our_output, plain_output):
            assert torch.all(output[~real] == torch.finfo(output.dtype).min)
        our_output, plain_output, their_output = our_output[real], plain_output[real], their_output[real]
    elif cls in TOKEN_LEVEL:
        # The unpadded fast path leaves padding positions out of every matmul (they come back as zeros
        # in the hidden state): per-token outputs are comparable at real tokens only; the plain path
        # below is compared at padding too.
        torch.testing.assert_close(our_output[real], their_output[real], atol=FP32_ATOL, rtol=FP32_RTOL)
        our_output = plain_output
    torch.testing.assert_close(our_output, their_output, atol=FP32_ATOL, rtol=FP32_RTOL)
    torch.testing.assert_close(plain_output, their_output, atol=FP32_ATOL, rtol=FP32_RTOL)


def labelled(config, cls):
    if cls in (BertForSequenceClassification, BertForTokenClassification):
        return config.with_labels(["negative", "neutral", "positive"], "single_label_classification"
                                  if cls is BertForSequenceClassification else None)
    return config


# --- key table -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", MODEL_CLASSES, ids=lambda c: c.__name__)
def test_key_table_is_bijective_and_complete(tiny_config, cls):
    config = labelled(tiny_config, cls)
    ours = cls(config).state_dict()
    mapped = {key: hf.to_hf_key(key) for key in ours}
    assert len(set(mapped.values())) == len(mapped), "two of our keys map to the same Hugging Face key"
    back = {theirs: hf.from_hf_key(theirs) for theirs in mapped.values()}
    assert all(back[mapped[key]] == key for key in ours), \
        [f"{key} -> {mapped[key]} -> {back[mapped[key]]}" for key in ours if back[mapped[key]] != key]
    reference = reference_class(cls)(reference_config(config, cls)).state_dict()
    expected = {key for key in reference if not hf.is_redundant_hf_key(key)}
    assert set(mapped.values()) == expected, {
        "ours only": sorted(set(mapped.values()) - expected), "reference only": sorted(expected - set(mapped.values()))}


def test_key_table_reads_legacy_layer_norm_names():
    assert hf.from_hf_key("bert.embeddings.LayerNorm.gamma") == "bert.embeddings.norm.weight"
    assert hf.from_hf_key("encoder.layer.11.output.LayerNorm.beta") == "encoder.layers.11.feed_forward.norm.bias"
    assert hf.from_hf_key("cls.predictions.bias") == "mlm.bias"
    assert hf.from_hf_key("bert.encoder.layer.0.crossattention.self.query.weight") is None


def test_key_table_rejects_unknown_parameter():
    with pytest.raises(KeyError, match="no Hugging Face name"):
        hf.to_hf_key("encoder.layers.0.attention.rotary.weight")


def test_redundant_keys_are_tied_copies_and_buffers():
    assert hf.is_redundant_hf_key("cls.predictions.decoder.weight")
    assert hf.is_redundant_hf_key("cls.predictions.decoder.bias")
    assert hf.is_redundant_hf_key("bert.embeddings.position_ids")
    assert not hf.is_redundant_hf_key("cls.predictions.bias")


def test_config_from_hf_strips_foreign_keys_and_names_architecture():
    data = {"model_type": "bert", "transformers_version": "5.0", "architectures": ["BertForMaskedLM"],
            "hidden_size": 64, "num_labels": 3, "use_cache": True}
    fields, architecture = hf.config_from_hf(data, "config.json")
    assert architecture == "BertForMaskedLM"
    assert hf.config_from_hf({**data, "architectures": ["BertLMHeadModel"]}, "config.json")[1] == "BertForPretraining"
    assert fields == {"hidden_size": 64, "id2label": {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}}


def test_config_from_hf_rejects_other_model_types():
    from bertforge.errors import ConfigError

    with pytest.raises(ConfigError, match="model_type is 'roberta'"):
        hf.config_from_hf({"model_type": "roberta"}, "some/config.json")


# --- ours -> theirs --------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", MODEL_CLASSES, ids=lambda c: c.__name__)
def test_our_checkpoint_loads_in_transformers(tmp_path, tiny_config, cls):
    torch.manual_seed(0)
    ours = cls(labelled(tiny_config, cls)).eval()
    ours.save_pretrained(tmp_path)
    loader = transformers.AutoModel if cls is BertModel else reference_class(cls)
    theirs, info = loader.from_pretrained(tmp_path, output_loading_info=True)
    assert type(theirs).__name__ == hf.ARCHITECTURES[cls.__name__]
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert_same_outputs(ours, theirs.eval(), ours.config, cls)


def test_our_pretraining_checkpoint_ties_their_decoder(tmp_path, tiny_config):
    torch.manual_seed(0)
    ours = BertForPretraining(tiny_config)
    ours.save_pretrained(tmp_path)
    theirs = transformers.BertForPreTraining.from_pretrained(tmp_path)
    decoder = theirs.cls.predictions.decoder
    torch.testing.assert_close(decoder.weight, ours.bert.embeddings.word.weight, atol=0, rtol=0)
    assert decoder.weight.data_ptr() == theirs.bert.embeddings.word_embeddings.weight.data_ptr()
    torch.testing.assert_close(decoder.bias, ours.mlm.bias, atol=0, rtol=0)


def test_our_labels_and_problem_type_reach_transformers(tmp_path, tiny_config):
    config = tiny_config.with_labels(["contradiction", "entailment", "neutral"], "single_label_classification")
    BertForSequenceClassification(config).save_pretrained(tmp_path)
    theirs = transformers.BertForSequenceClassification.from_pretrained(tmp_path)
    assert theirs.config.id2label == {0: "contradiction", 1: "entailment", 2: "neutral"}
    assert theirs.config.label2id == {"contradiction": 0, "entailment": 1, "neutral": 2}
    assert theirs.config.problem_type == "single_label_classification"
    assert theirs.config.num_labels == 3


def test_our_regression_checkpoint_loads_in_transformers(tmp_path, tiny_config):
    torch.manual_seed(0)
    ours = BertForSequenceClassification(tiny_config.replace(problem_type="regression")).eval()
    ours.save_pretrained(tmp_path)
    theirs, info = transformers.BertForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["mismatched_keys"], info
    assert theirs.config.num_labels == 1 and theirs.config.problem_type == "regression"
    assert_same_outputs(ours, theirs.eval(), ours.config, BertForSequenceClassification)


def test_our_sinusoidal_checkpoint_gives_identical_outputs_in_transformers(tmp_path, tiny_config):
    torch.manual_seed(0)
    ours = BertModel(tiny_config.replace(position_embedding_type="sinusoidal")).eval()
    ours.save_pretrained(tmp_path)
    # Their loaders must read the table as an ordinary absolute one (older releases drop any other kind).
    assert json.loads((tmp_path / "config.json").read_text())["position_embedding_type"] == "absolute"
    theirs = transformers.AutoModel.from_pretrained(tmp_path).eval()
    assert_same_outputs(ours, theirs, ours.config, BertModel)
    again = BertModel.from_pretrained(tmp_path)
    assert again.config.position_embedding_type == "sinusoidal"
    assert not again.embeddings.position.weight.requires_grad


# --- theirs -> ours --------------------------------------------------------------------------------------

def reference_model(cls, config, seed: int = 0):
    torch.manual_seed(seed)
    return reference_class(cls)(reference_config(config, cls)).eval()


@pytest.mark.parametrize("cls", MODEL_CLASSES, ids=lambda c: c.__name__)
def test_their_safetensors_checkpoint_loads_here(tmp_path, tiny_config, cls):
    config = labelled(tiny_config, cls)
    theirs = reference_model(cls, config)
    theirs.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    ours, report = load_model(tmp_path, cls)
    assert report.fresh == [] and report.skipped == []
    assert fast_paths_enabled(ours) == {"unpad": True, "fused_qkv": True,
                                          "activation_checkpointing": False}
    assert_same_outputs(ours, theirs, config, cls)


@pytest.mark.parametrize("cls", [BertForPretraining, BertForSequenceClassification], ids=lambda c: c.__name__)
def test_their_pytorch_bin_checkpoint_loads_here(tmp_path, tiny_config, cls):
    # transformers 5 writes safetensors only; an older release's pytorch_model.bin is a pickled state dict
    # that also holds the tied decoder copy and the position_ids buffer.
    config = labelled(tiny_config, cls)
    theirs = reference_model(cls, config)
    theirs.config.save_pretrained(tmp_path)
    state = dict(theirs.state_dict())
    state["bert.embeddings.position_ids"] = torch.arange(config.max_position_embeddings)[None]
    torch.save(state, tmp_path / "pytorch_model.bin")
    ours = cls.from_pretrained(tmp_path)
    assert_same_outputs(ours, theirs, config, cls)


def test_their_pretraining_checkpoint_ties_our_decoder(tmp_path, tiny_config):
    theirs = reference_model(BertForPretraining, tiny_config)
    theirs.save_pretrained(tmp_path)
    ours = BertForPretraining.from_pretrained(tmp_path)
    torch.testing.assert_close(ours.bert.embeddings.word.weight, theirs.cls.predictions.decoder.weight,
                               atol=0, rtol=0)
    torch.testing.assert_close(ours.mlm.bias, theirs.cls.predictions.decoder.bias, atol=0, rtol=0)


def test_their_labels_and_problem_type_reach_us(tmp_path, tiny_config):
    config = tiny_config.with_labels(["O", "B-ORG", "I-ORG"], "multi_label_classification")
    reference_model(BertForSequenceClassification, config).save_pretrained(tmp_path)
    ours = BertForSequenceClassification.from_pretrained(tmp_path)
    assert ours.config.label_names == ["O", "B-ORG", "I-ORG"]
    assert ours.config.label2id == {"O": 0, "B-ORG": 1, "I-ORG": 2}
    assert ours.config.problem_type == "multi_label_classification"


def test_their_pretraining_checkpoint_starts_a_classifier(tmp_path, tiny_config):
    # The usual fine-tuning start: their pretraining checkpoint, our classifier with a fresh head.
    reference_model(BertForPretraining, tiny_config).save_pretrained(tmp_path)
    ours, report = load_model(tmp_path, BertForSequenceClassification)
    assert sorted(report.fresh) == ["classifier.bias", "classifier.weight"]
    assert any(key.startswith("cls.seq_relationship") for key in report.skipped)


def test_round_trip_ours_theirs_ours_keeps_every_tensor(tmp_path, tiny_config):
    torch.manual_seed(0)
    config = tiny_config.with_labels(["a", "b"], "single_label_classification")
    ours = BertForSequenceClassification(config)
    ours.save_pretrained(tmp_path / "ours")
    transformers.BertForSequenceClassification.from_pretrained(tmp_path / "ours").save_pretrained(tmp_path / "theirs")
    back = BertForSequenceClassification.from_pretrained(tmp_path / "theirs")
    assert back.config.id2label == config.id2label and back.config.problem_type == config.problem_type
    for key, value in ours.state_dict().items():
        torch.testing.assert_close(back.state_dict()[key], value, atol=0, rtol=0, msg=key)


def test_their_masked_lm_checkpoint_loads_as_masked_lm(tmp_path, tiny_config):
    # BertForMaskedLM has no pooler and no NSP head, as ours (MLM-only pretraining): nothing starts fresh.
    torch.manual_seed(0)
    theirs = transformers.BertForMaskedLM(reference_config(tiny_config, BertForMaskedLM)).eval()
    theirs.config.architectures = ["BertForMaskedLM"]
    theirs.save_pretrained(tmp_path)
    ours, report = load_model(tmp_path)
    assert type(ours) is BertForMaskedLM and report.fresh == []
    assert_same_outputs(ours, theirs, tiny_config, BertForPretraining)
    with_nsp, report = load_model(tmp_path, BertForPretraining)  # continuing with NSP: its head starts fresh
    assert sorted(report.fresh) == ["bert.pooler.dense.bias", "bert.pooler.dense.weight", "nsp.bias", "nsp.weight"]


def test_our_masked_lm_checkpoint_loads_in_transformers_as_masked_lm(tmp_path, tiny_config):
    torch.manual_seed(0)
    ours = BertForMaskedLM(tiny_config).eval()
    ours.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    theirs, info = transformers.BertForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert_same_outputs(ours, theirs.eval(), tiny_config, BertForPretraining)


