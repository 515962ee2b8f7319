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

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tests.e2e.test_modernbert_deeper_classifier import finetune_tiny_classifier

from bertforge.cli import main
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

    texts = ["good day number 3", "bad day"]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    engines = [[]] + ([["--engine", "onnxruntime"]] if importlib.util.find_spec("onnxruntime") else [])
    for engine in engines:
        assert main(["predict", "--model", str(best), "--task", "classify", "--input", str(tmp_path / "in.txt"),
                     "--output", str(tmp_path / "out.jsonl"), "--device", "cpu", "--precision", "fp32",
                     *engine]) == 0
        answers = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
        for text, answer in zip(texts, answers, strict=True):
            with torch.no_grad():
                probabilities = model(torch.tensor([tokenizer.encode(text).ids])).logits.softmax(-1)[0]
            np.testing.assert_allclose([answer["scores"][name] for name in model.config.label_names],
                                       probabilities.numpy(), atol=1e-5)

    transformers = pytest.importorskip("transformers")
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        transformers.ModernBertForSequenceClassification.from_pretrained(best)
    _, info = transformers.ModernBertForSequenceClassification.from_pretrained(
        best, ignore_mismatched_sizes=True, output_loading_info=True)
    assert [key for key, *_ in info["mismatched_keys"]] == ["head.dense.weight"]
    assert not info["missing_keys"] and not info["unexpected_keys"]
