"""Layer features on a ModernBERT encoder, the feature-based approach: `bertforge finetune --feature-layers=-1,-2
--freeze-encoder` from a tiny random ModernBERT masked LM trains the head on the last two layers' hidden states
concatenated (the prediction head's dense layer reading 2H), leaves the encoder as it was, saves the layers in
config.json and the wider head under transformers' names, and loads back whole: `bertforge predict` answers with
the reloaded model's own scores, through torch and through ONNX Runtime. transformers has no such head: it
refuses the wider `head.dense` unless told to ignore mismatched sizes, and then starts that layer fresh.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from safetensors.torch import load_file
from tests.e2e.test_modernbert_deeper_classifier import (
    assert_predict_gives_the_model,
    finetune_tiny_classifier,
)

from bertforge.families import registry


def test_modernbert_finetunes_frozen_on_layer_features_saves_and_predicts(tmp_path):
    tokenizer, best = finetune_tiny_classifier(tmp_path, "--feature-layers=-1,-2", "--freeze-encoder")
    saved = json.loads((best / "config.json").read_text())
    assert saved["architectures"] == ["ModernBertForSequenceClassification"]
    assert saved["feature_layers"] == [-1, -2] and saved["freeze_encoder"] is True
    weights, base = load_file(best / "model.safetensors"), load_file(tmp_path / "base" / "model.safetensors")
    assert weights["head.dense.weight"].shape == (32, 64) and weights["classifier.weight"].shape == (2, 32)
    # The frozen encoder is saved as it was loaded; the head (fresh, then trained) is what changed.
    encoder = [key for key in weights if key.startswith("model.")]
    assert encoder and all(torch.equal(weights[key], base[key]) for key in encoder)

    model, report = registry.load_model(best, fast_path=False)
    assert model.config.feature_layers == [-1, -2] and report.fresh == [] and report.skipped == []
    assert model.head.dense.in_features == 64
    torch.testing.assert_close(model.head.dense.weight.detach(), weights["head.dense.weight"], rtol=0, atol=0)

    engines = [[]] + ([["--engine", "onnxruntime"]] if importlib.util.find_spec("onnxruntime") else [])
    for engine in engines:
        assert_predict_gives_the_model(tmp_path, best, model, tokenizer, *engine)

    transformers = pytest.importorskip("transformers")
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        transformers.ModernBertForSequenceClassification.from_pretrained(best)
    _, info = transformers.ModernBertForSequenceClassification.from_pretrained(
        best, ignore_mismatched_sizes=True, output_loading_info=True)
    assert [key for key, *_ in info["mismatched_keys"]] == ["head.dense.weight"]
    assert not info["missing_keys"] and not info["unexpected_keys"]
