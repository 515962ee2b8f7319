"""`engine.build_engine` on a ModernBERT model (fused Wqkv, GeGLU, rotary positions, local layers): the torch engine
at fp32 (equal to the model), int8 (dynamic int8 linears) and bf16 (packed bf16 linears), and ONNX Runtime at fp32
and int8 (the exported graph holding its banded masks at lengths beyond the traced one), each within the budgets
the BERT engine tests hold every engine to (tests/unit/test_engine.py: `TOLERANCES`, `REDUCED_MIN_COSINE`)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from test_engine import REDUCED_MIN_COSINE, TOLERANCES

from bertforge.engine.bf16 import Bf16Linear
from bertforge.engine.build import build_engine
from bertforge.engine.int8 import int8_linears
from bertforge.engine.plan import EnginePlan
from bertforge.families import registry
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.modernbert import ModernBertForSequenceClassification

LAYERS = 3


def tiny_model(local_attention: int = 4) -> ModernBertForSequenceClassification:
    torch.manual_seed(0)
    config = ModernBertConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=LAYERS,
                              num_attention_heads=2, pad_token_id=0, local_attention=local_attention,
                              id2label={0: "a", 1: "b", 2: "c"})
    return ModernBertForSequenceClassification(config).eval()


def padded_batch(rows: int = 8, tokens: int = 23, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids, every other row ending early (one after 2 tokens: its padding far beyond any real token)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 50, (rows, tokens), generator=generator)
    mask = torch.ones_like(ids)
    for row in range(1, rows, 2):
        mask[row, max(2, tokens - 3 * row):] = 0
        ids[row, max(2, tokens - 3 * row):] = 0
    return ids, mask


def run(engine, ids, mask) -> torch.Tensor:
    engine.prepare(registry.for_model(engine.model))
    with engine.running():
        return engine(ids, attention_mask=mask).logits.float()


def assert_within_budget(got: torch.Tensor, expected: torch.Tensor, precision: str) -> None:
    """`test_engine.assert_close_scores`'s rule: |difference| <= TOLERANCES[precision] x max(1, largest |score|),
    and below fp32 the cosine of all scores to fp32's >= REDUCED_MIN_COSINE."""
    got, expected = got.flatten().numpy().astype(np.float64), expected.flatten().numpy().astype(np.float64)
    bound = TOLERANCES[precision] * max(1.0, float(np.abs(expected).max()))
    assert float(np.abs(got - expected).max()) <= bound
    if precision != "fp32":
        assert got @ expected / (np.linalg.norm(got) * np.linalg.norm(expected)) >= REDUCED_MIN_COSINE


def test_modernbert_torch_fp32_engine_runs_the_model():
    model = tiny_model()
    ids, mask = padded_batch()
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
    engine = build_engine(model, EnginePlan(torch.device("cpu"), "fp32", "torch", threads=1))
    torch.testing.assert_close(run(engine, ids, mask), expected)


def test_modernbert_int8_engine_quantizes_every_projection_within_the_int8_budget():
    ids, mask = padded_batch()
    with torch.no_grad():
        expected = tiny_model()(ids, attention_mask=mask).logits
    engine = build_engine(tiny_model(), EnginePlan(torch.device("cpu"), "int8", "torch", threads=1))
    # Wqkv, the attention output, GeGLU's up and down projection of every layer; the head stays fp32
    assert len(int8_linears(engine.model)) == 4 * LAYERS
    got = run(engine, ids, mask)
    assert_within_budget(got, expected, "int8")
    assert (got.argmax(-1) == expected.argmax(-1)).all()


def test_modernbert_bf16_engine_on_padded_batches_has_no_nan_within_the_bf16_budget():
    ids, mask = padded_batch()
    with torch.no_grad():
        expected = tiny_model()(ids, attention_mask=mask).logits
    engine = build_engine(tiny_model(), EnginePlan(torch.device("cpu"), "bf16", "torch", threads=1))
    assert sum(isinstance(m, Bf16Linear) for m in engine.model.modules()) == 4 * LAYERS
    # GeGLU's activation runs on half of the up projection: never fused into it
    assert all(m.post_op == "none" for m in engine.model.modules() if isinstance(m, Bf16Linear))
    got = run(engine, ids, mask)
    assert not got.isnan().any()
    assert_within_budget(got, expected, "bf16")


onnx = pytest.mark.skipif(not all(importlib.util.find_spec(n) for n in ("onnx", "onnxruntime")),
                          reason="needs the export extra")


@onnx
@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_modernbert_onnxruntime_graph_holds_its_windows_beyond_the_traced_length(tmp_path, monkeypatch, precision):
    """A window of 20 each side, longer than the 16 tokens the graph is traced at: the graph must still hold
    the band, at 60 tokens (rows padded) where it cuts."""
    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path))
    ids, mask = padded_batch(rows=4, tokens=60)
    with torch.no_grad():
        expected = tiny_model(local_attention=40)(ids, attention_mask=mask).logits
    engine = build_engine(tiny_model(local_attention=40), EnginePlan(torch.device("cpu"), precision, "onnxruntime",
                                                                     threads=1))
    got = run(engine, ids, mask)
    assert engine.describe()["graphs"]  # ONNX Runtime ran it, not PyTorch
    assert_within_budget(got, expected, precision)
    if precision == "fp32":  # the graph is the banded model's, not one attending globally (10x closer at least)
        with torch.no_grad():
            unbanded = tiny_model(local_attention=200)(ids, attention_mask=mask).logits
        assert (got - expected).abs().max() < (unbanded - expected).abs().max() / 10
