"""`engine.build_engine` on a ModernBERT model: the torch engine at fp32 runs it (equal to the model); the
converters and ONNX Runtime, which know BERT's layers, are refused by name, or left for torch when `auto` chose
them."""

from __future__ import annotations

import pytest
import torch

from bertforge.engine.build import build_engine
from bertforge.engine.plan import EnginePlan
from bertforge.errors import ConfigError
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.modernbert import ModernBertForSequenceClassification


def tiny_model() -> ModernBertForSequenceClassification:
    torch.manual_seed(0)
    config = ModernBertConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                              num_attention_heads=2, pad_token_id=0, local_attention=4)
    return ModernBertForSequenceClassification(config).eval()


def test_modernbert_torch_fp32_engine_runs_the_model():
    model = tiny_model()
    ids = torch.randint(1, 50, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
        engine = build_engine(model, EnginePlan(torch.device("cpu"), "fp32", "torch", threads=1))
        torch.testing.assert_close(engine(ids, attention_mask=mask).logits, expected)
    # `auto` chose ONNX Runtime: ModernBERT runs on torch instead, and the plan says why.
    auto = build_engine(tiny_model(), EnginePlan(torch.device("cpu"), "fp32", "onnxruntime", threads=1, auto=True))
    assert auto.plan.kind == "torch" and "ModernBERT runs on torch" in auto.plan.reason


@pytest.mark.parametrize("precision,kind", [("int8", "torch"), ("bf16", "torch"), ("fp32", "onnxruntime")])
def test_modernbert_other_engines_are_refused_naming_the_fix(precision, kind):
    with pytest.raises(ConfigError, match="--engine torch --precision fp32"):
        build_engine(tiny_model(), EnginePlan(torch.device("cpu"), precision, kind, threads=1))
