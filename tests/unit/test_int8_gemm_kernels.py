"""The int8 kernel benchmark times the projections the models really have, on the engine the model would use."""

from __future__ import annotations

import json
import sys

import pytest
from benchmarks.int8_gemm_kernels import SIZES, main, shapes

from bertforge.engine.int8 import int8_linears, quantize_int8
from bertforge.model import BertConfig, BertModel


@pytest.mark.parametrize("model", sorted(SIZES))
def test_int8_gemm_kernels_shapes_are_the_models_projections(model):
    hidden, inner = SIZES[model]
    config = BertConfig(vocab_size=64, hidden_size=hidden, intermediate_size=inner, num_attention_heads=hidden // 64,
                        num_hidden_layers=1, max_position_embeddings=32)
    encoder = quantize_int8(BertModel(config, add_pooling_layer=False))
    modules = dict(encoder.named_modules())
    found = sorted((modules[name].in_features, modules[name].out_features) for name in int8_linears(encoder))
    assert found == sorted(shapes(model).values())


def test_int8_gemm_kernels_writes_a_row_per_shape_and_length(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "rows.json"
    monkeypatch.setattr(sys, "argv", ["int8_gemm_kernels", "--model", "minilm", "--tokens", "3", "--threads", "1",
                                      "--json", str(out)])
    main()
    written = json.loads(out.read_text())
    assert written["model"] == "minilm"
    assert [(r["in"], r["out"], r["tokens"]) for r in written["rows"]] == [(i, o, 3) for i, o in shapes("minilm").values()]
    assert all(r["torch_ms"] > 0 and r["ort_ms"] > 0 and r["int_mm_ms"] > 0 for r in written["rows"])
