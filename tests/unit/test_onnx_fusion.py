"""ONNX Runtime's BERT optimizer fuses our export for every head, and the fused graph answers as PyTorch does."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from bertforge.errors import ConfigError
from bertforge.families.classification import BertForSequenceClassification
from bertforge.families.multiple_choice import BertForMultipleChoice
from bertforge.families.question_answering import BertForQuestionAnswering
from bertforge.families.tagging import BertForTokenClassification
from bertforge.interop.sentence_transformers import SentenceSettings, settings_files
from bertforge.model.bert import BertModel
from bertforge.model.config import BertConfig

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")

from bertforge.engine.onnx_export import FP32_TOLERANCE, OnnxModule, export_onnx, graph_form  # noqa: E402
from bertforge.engine.onnx_graph import export_optimized  # noqa: E402

LAYERS = 2
TAGS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}
# Per head: (model class, config fields, the outputs it exports).
HEADS = {
    "classification": (BertForSequenceClassification, {"id2label": {0: "neg", 1: "neu", 2: "pos"}}, ["logits"]),
    # A pair is the same model fed segment B; `example_inputs` gives the second half token type 1.
    "pair": (BertForSequenceClassification, {"id2label": {0: "entailment", 1: "contradiction"}}, ["logits"]),
    "regression": (BertForSequenceClassification, {"problem_type": "regression"}, ["logits"]),
    "multi-label": (BertForSequenceClassification, {"problem_type": "multi_label_classification",
                                                    "id2label": {0: "a", 1: "b", 2: "c", 3: "d"}}, ["logits"]),
    # The CRF decodes outside the graph: the export holds its emissions (the tagger's logits).
    "tagging-crf": (BertForTokenClassification, {"id2label": TAGS, "use_crf": True}, ["logits"]),
    "question-answering": (BertForQuestionAnswering, {}, ["start_logits", "end_logits"]),
    "multiple-choice": (BertForMultipleChoice, {}, ["logits"]),
    "embedding": (BertModel, {}, ["last_hidden_state", "pooled_output", "sentence_embedding"]),
}


def tiny(cls, path, **fields):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=LAYERS, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, **fields)
    cls(config).save_pretrained(path)
    return path


@pytest.mark.parametrize("head", list(HEADS))
def test_export_optimized_fuses_every_head_and_matches_pytorch(tmp_path, head):
    cls, fields, names = HEADS[head]
    result = export_optimized(tiny(cls, tmp_path / "m", **fields), tmp_path / "out" / "model.onnx", speed_shape=None)
    assert result.outputs == names
    assert result.fused["Attention"] == LAYERS
    assert result.fused["EmbedLayerNormalization"] == 1
    assert result.fused["SkipLayerNormalization"] == 2 * LAYERS
    assert result.fused["BiasGelu"] == LAYERS
    assert result.fully_fused
    assert max(result.max_abs_diff.values()) <= FP32_TOLERANCE
    nodes = [node.op_type for node in onnx.load(str(result.optimized)).graph.node]
    assert nodes.count("Attention") == LAYERS and "Softmax" not in nodes  # no unfused attention left over
    assert json.loads(result.report.read_text())["fully_fused"] is True


def test_export_optimized_tanh_gelu_fuses_to_fast_gelu(tmp_path):
    result = export_optimized(tiny(BertForQuestionAnswering, tmp_path / "m", hidden_act="gelu_new"),
                              tmp_path / "model.onnx", speed_shape=None)
    assert result.fused["FastGelu"] == LAYERS and result.fused["Attention"] == LAYERS and result.fully_fused
    assert max(result.max_abs_diff.values()) <= FP32_TOLERANCE


def test_export_optimized_int8_reports_against_fp32(tmp_path, caplog):
    caplog.set_level(logging.INFO)  # as the CLI logs: ONNX Runtime's own fusion and tensor lines stay out
    result = export_optimized(tiny(BertForTokenClassification, tmp_path / "m", id2label=TAGS),
                              tmp_path / "model.onnx", quantize="int8", speed_shape=(2, 16), repeats=1)
    assert not [r.getMessage() for r in caplog.records if r.levelno < logging.ERROR and not
                r.name.startswith("bertforge")]
    nodes = [node.op_type for node in onnx.load(str(result.int8)).graph.node]
    assert "QAttention" in nodes and ("DynamicQuantizeMatMul" in nodes or "MatMulInteger" in nodes)
    assert 0 < result.int8_max_abs_diff["logits"] < 1.0
    assert 0.9 < result.int8_min_cosine["logits"] <= 1.0 + 1e-9
    assert 0.0 <= result.int8_agreement["logits"] <= 1.0
    report = json.loads(result.report.read_text())
    assert report["int8"] == str(result.int8) and set(report["onnxruntime_ms"]) == {"optimized", "int8"}
    assert "int8 vs fp32" in result.summary()


def test_export_optimized_rejects_unknown_quantization(tmp_path):
    with pytest.raises(ConfigError, match="quantize must be one of"):
        export_optimized(tmp_path / "m", tmp_path / "model.onnx", quantize="int4")


def test_export_sentence_embedding_uses_the_directorys_pooling(tmp_path):
    model_dir = tiny(BertModel, tmp_path / "m")
    for name, text in settings_files(SentenceSettings(pooling="cls+mean", normalize=True), 64).items():
        (model_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (model_dir / name).write_text(text)
    report = export_onnx(model_dir, tmp_path / "model.onnx", speed_shape=(2, 16), repeats=1)
    session = onnxruntime.InferenceSession(str(report.path), providers=["CPUExecutionProvider"])
    ids = np.array([[2, 5, 7, 9, 3, 0], [2, 8, 3, 0, 0, 0]])
    mask = (ids > 0).astype(np.int64)
    vectors, hidden = session.run(["sentence_embedding", "last_hidden_state"],
                                  {"input_ids": ids, "token_type_ids": np.zeros_like(ids), "attention_mask": mask})
    assert vectors.shape == (2, 64)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    real = mask[:, :, None]
    mean = (hidden * real).sum(1) / real.sum(1)
    expected = np.concatenate([hidden[:, 0], mean], axis=1)
    np.testing.assert_allclose(vectors, expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-5)


def test_graph_form_restores_the_plain_classes(tmp_path):
    model = BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=64)).eval()
    model.unpad = False
    plain = [type(m) for m in model.modules()]
    wrapper = OnnxModule(model, ["last_hidden_state"])
    ids = torch.tensor([[2, 5, 7, 9], [2, 8, 3, 0]])
    inputs = (ids, torch.zeros_like(ids), (ids > 0).long())
    with torch.inference_mode():
        reference = wrapper(*inputs)[0]
        with graph_form(model):
            assert [type(m) for m in model.modules()] != plain
            onnx_form = wrapper(*inputs)[0]
    assert [type(m) for m in model.modules()] == plain
    real = inputs[2].bool()
    assert torch.allclose(onnx_form[real], reference[real], atol=1e-5)
