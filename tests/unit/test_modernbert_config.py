"""`ModernBertConfig` validation and the ModernBERT config.json translation (`interop.modernbert`)."""

from __future__ import annotations

import pytest

from bertforge.errors import ConfigError
from bertforge.interop import modernbert as hf_modernbert
from bertforge.model.config.modernbert import PRESETS, ModernBertConfig


@pytest.mark.parametrize("field,value,fix", [
    ("hidden_size", 33, "multiple of num_attention_heads"),
    ("hidden_size", 6, "must be even"),  # head size 6 / 2 = 3: rotary turns pairs of features
    ("local_attention", 127, "even window"),
    ("layer_types", ["full_attention"], "one of"),
    ("layer_types", ["full_attention", "global", "full_attention"], "one of"),
    ("classifier_pooling", "max", "cls"),
    ("hidden_activation", "swish", "gelu"),
    ("pad_token_id", 10, "inside the vocabulary"),
    ("global_rope_theta", 0.0, "positive"),
    ("mlp_dropout", 1.0, "probability"),
    ("norm_bias", "yes", "true or false"),
    ("classifier_hidden_sizes", [64, 0], "at most 3 positive widths"),
    ("feature_layers", [4], r"layer indices in \[-4, 3\]"),
    ("feature_layers", [], "layer indices"),
    ("feature_layers", [-1.5], "layer indices"),
    ("use_crf", "yes", "true or false"),
])
def test_modernbert_config_refuses_bad_fields_naming_them(field, value, fix):
    fields = {"vocab_size": 10, "hidden_size": 48, "intermediate_size": 64, "num_hidden_layers": 3,
              "num_attention_heads": 2, "pad_token_id": 0, field: value}
    with pytest.raises(ConfigError, match=rf"ModernBertConfig\.{field}=.*{fix}"):
        ModernBertConfig(**fields)


def test_modernbert_config_layer_kinds_and_window():
    config = ModernBertConfig.preset("tiny", num_hidden_layers=7, local_attention=128)
    assert config.attention_kinds == ["full_attention", "sliding_attention", "sliding_attention"] * 2 + ["full_attention"]
    assert config.window_radius == 64
    explicit = config.replace(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    assert explicit.attention_kinds == ["sliding_attention", "full_attention"]
    assert ModernBertConfig().attention_kinds.count("full_attention") == 8  # base: 22 layers, every third global
    assert set(PRESETS) == {"tiny", "mini", "small", "base", "large"}
    assert all(ModernBertConfig.preset(name).head_size % 2 == 0 for name in PRESETS)


def test_modernbert_config_json_reads_both_spellings_and_round_trips():
    released = {"model_type": "modernbert", "architectures": ["ModernBertForMaskedLM"], "vocab_size": 50368,
                "global_rope_theta": 160000.0, "local_rope_theta": 10000.0, "global_attn_every_n_layers": 3,
                "layer_norm_eps": 1e-05, "norm_eps": 1e-05, "reference_compile": None, "position_embedding_type":
                "absolute", "deterministic_flash_attn": False, "sparse_prediction": False, "torch_dtype": "float32",
                "transformers_version": "4.48.0", "repad_logits_with_grad": False, "tie_word_embeddings": True}
    fields, architecture = hf_modernbert.config_from_hf(released, "config.json")
    config = ModernBertConfig.from_dict(fields, source="config.json")
    assert architecture == "ModernBertForMaskedLM" and config.global_rope_theta == 160000.0
    newer = {"model_type": "modernbert", "architectures": ["ModernBertForSomethingNew"], "num_labels": 3,
             "layer_types": ["full_attention", "sliding_attention"], "num_hidden_layers": 2,
             "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 8e4},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 5e3}}}
    fields, architecture = hf_modernbert.config_from_hf(newer, "config.json")
    config = ModernBertConfig.from_dict(fields)
    assert architecture == "ModernBertModel"  # a head we do not have: the encoder loads, the head is skipped
    assert (config.global_rope_theta, config.local_rope_theta, config.num_labels) == (8e4, 5e3, 3)
    written = hf_modernbert.config_to_hf(config.to_dict(), "ModernBertForTokenClassification")
    assert written["model_type"] == "modernbert" and written["num_labels"] == 3
    again = ModernBertConfig.from_dict(hf_modernbert.config_from_hf(written, "config.json")[0])
    assert again == config
    # Every head transformers 5.24 has is ours too; a span head's directory says 2 outputs, whatever labels we carry.
    for name in ("ModernBertForQuestionAnswering", "ModernBertForMultipleChoice"):
        assert hf_modernbert.config_from_hf({**newer, "architectures": [name]}, "config.json")[1] == name
    span = hf_modernbert.config_to_hf(config.to_dict(), "ModernBertForQuestionAnswering")
    assert span["num_labels"] == 2 and "id2label" not in span and "label2id" not in span


@pytest.mark.parametrize("data,fix", [
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1e4}}}, "rope_type is 'yarn'"),
    ({"rope_scaling": {"type": "linear"}}, "rope_scaling"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings"),
    ({"model_type": "bert"}, "not 'modernbert'"),
])
def test_modernbert_config_json_refuses_what_we_do_not_run(data, fix):
    with pytest.raises(ConfigError, match=fix):
        hf_modernbert.config_from_hf({"model_type": "modernbert", **data}, "config.json")


def test_modernbert_config_json_unknown_key_is_named():
    fields, _ = hf_modernbert.config_from_hf({"model_type": "modernbert", "hidden_sise": 8}, "dir/config.json")
    with pytest.raises(ConfigError, match=r"dir/config.json: unknown ModernBertConfig key\(s\) \['hidden_sise'\]"):
        ModernBertConfig.from_dict(fields, source="dir/config.json")
