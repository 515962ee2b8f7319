"""`BertConfig`: presets and their parameter counts, JSON round trip, label helpers and validation messages."""

from __future__ import annotations

import json

import pytest
import torch

from bertforge.errors import ConfigError
from bertforge.model.bert import BertModel
from bertforge.model.config import PRESETS, BertConfig

# The BERT paper's sizes, counted with the pooler and the 30,522-word uncased vocabulary.
BASE_PARAMETERS = 109_482_240
LARGE_PARAMETERS = 335_141_888


def count_parameters(config: BertConfig) -> int:
    # The meta device allocates nothing, so even BERT-large builds in milliseconds.
    with torch.device("meta"):
        model = BertModel(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(("preset", "expected"), [("base", BASE_PARAMETERS), ("large", LARGE_PARAMETERS)])
def test_config_preset_parameter_count_matches_paper(preset, expected):
    assert count_parameters(BertConfig.preset(preset)) == expected


@pytest.mark.parametrize(
    ("preset", "layers", "hidden", "heads"),
    [("tiny", 2, 128, 2), ("mini", 4, 256, 4), ("small", 4, 512, 8), ("medium", 8, 512, 8),
     ("base", 12, 768, 12), ("large", 24, 1024, 16)],
)
def test_config_preset_sizes(preset, layers, hidden, heads):
    config = BertConfig.preset(preset)
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (layers, hidden, heads)
    assert config.intermediate_size == 4 * hidden
    assert config.head_size == 64
    assert (config.vocab_size, config.max_position_embeddings, config.type_vocab_size) == (30522, 512, 2)
    assert config.layer_norm_eps == 1e-12 and config.hidden_act == "gelu"


def test_config_presets_are_all_tested():
    assert sorted(PRESETS) == ["base", "large", "medium", "mini", "small", "tiny"]


def test_config_preset_accepts_overrides():
    config = BertConfig.preset("tiny", vocab_size=1000, hidden_act="relu")
    assert (config.vocab_size, config.hidden_act, config.hidden_size) == (1000, "relu", 128)


def test_config_preset_unknown_name_lists_choices():
    with pytest.raises(ConfigError, match="unknown model preset 'huge'.*'tiny'"):
        BertConfig.preset("huge")


def test_config_json_round_trip(tmp_path):
    config = BertConfig.preset("tiny", classifier_hidden_sizes=[64], feature_layers=[-1, -2],
                               position_embedding_type="sinusoidal").with_labels(["neg", "pos"], "single_label_classification")
    path = tmp_path / "config.json"
    path.write_text(config.to_json_string(), encoding="utf-8")
    assert json.loads(path.read_text())["id2label"] == {"0": "neg", "1": "pos"}  # JSON keys are strings
    assert BertConfig.from_json_file(path) == config


def test_config_label_maps_accept_string_keys_and_fill_each_other():
    config = BertConfig(id2label={"1": "pos", "0": "neg"})
    assert config.id2label == {0: "neg", 1: "pos"} and config.label2id == {"neg": 0, "pos": 1}
    assert BertConfig(label2id={"a": 0, "b": 1}).id2label == {0: "a", 1: "b"}
    assert config.label_names == ["neg", "pos"] and config.num_labels == 2


def test_config_num_labels_defaults_and_regression():
    assert BertConfig().num_labels == 2 and BertConfig().label_names == ["LABEL_0", "LABEL_1"]
    assert BertConfig(problem_type="regression").num_labels == 1


@pytest.mark.parametrize(
    ("fields", "field_name"),
    [
        ({"hidden_size": 100, "num_attention_heads": 12}, "hidden_size"),
        ({"hidden_act": "swish"}, "hidden_act"),
        ({"position_embedding_type": "rotary"}, "position_embedding_type"),
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"vocab_size": 12.5}, "vocab_size"),
        ({"hidden_dropout_prob": 1.0}, "hidden_dropout_prob"),
        ({"attention_probs_dropout_prob": -0.1}, "attention_probs_dropout_prob"),
        ({"classifier_dropout": 2.0}, "classifier_dropout"),
        ({"layer_norm_eps": 0.0}, "layer_norm_eps"),
        ({"pad_token_id": 30522}, "pad_token_id"),
        ({"problem_type": "ranking"}, "problem_type"),
        ({"classifier_hidden_sizes": [8, 8, 8, 8]}, "classifier_hidden_sizes"),
        ({"feature_layers": [13]}, "feature_layers"),
        ({"feature_layers": []}, "feature_layers"),
    ],
)
def test_config_validation_names_the_field(fields, field_name):
    with pytest.raises(ConfigError, match=rf"BertConfig\.{field_name}="):
        BertConfig(**fields)


def test_config_validation_says_how_to_fix_head_count():
    with pytest.raises(ConfigError, match=r"multiple of num_attention_heads \(12\)"):
        BertConfig(hidden_size=100)


def test_config_validation_lists_allowed_activations():
    with pytest.raises(ConfigError, match="'gelu', 'gelu_new'"):
        BertConfig(hidden_act="swish")


def test_config_from_dict_rejects_unknown_key():
    with pytest.raises(ConfigError, match=r"my.json: unknown BertConfig key\(s\) \['hiden_size'\]"):
        BertConfig.from_dict({"hiden_size": 64}, source="my.json")


def test_config_from_json_file_names_file_and_unknown_key(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4, "dropout": 0.1}))
    with pytest.raises(ConfigError, match=rf"{path}: unknown BertConfig key\(s\) \['dropout'\]"):
        BertConfig.from_json_file(path)


def test_config_from_json_file_names_file_and_bad_field(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_act": "swish"}))
    with pytest.raises(ConfigError, match=rf"{path}: BertConfig\.hidden_act='swish' is invalid"):
        BertConfig.from_json_file(path)


def test_config_from_json_file_missing_or_malformed(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        BertConfig.from_json_file(tmp_path / "absent.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match=rf"{broken}: cannot read as JSON"):
        BertConfig.from_json_file(broken)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        BertConfig.from_json_file(listed)


def test_config_with_labels_returns_copy():
    config = BertConfig.preset("tiny")
    labelled = config.with_labels(["a", "b", "c"], "single_label_classification")
    assert config.id2label is None and labelled.num_labels == 3
    assert labelled.label2id == {"a": 0, "b": 1, "c": 2} and labelled.problem_type == "single_label_classification"


def test_config_replace_validates():
    with pytest.raises(ConfigError, match="hidden_act"):
        BertConfig.preset("tiny").replace(hidden_act="tanh")
