"""int8 dynamic quantization (`engine/int8.py`) against the plain fp32 path, within named tolerances.

The tolerances are the stated int8 contract on a real checkpoint (all-MiniLM-L6-v2 on real SST-2 sentences):
mean-pooled embeddings keep cosine >= 1 - INT8_COSINE_TOLERANCE to fp32 for every sentence, and a
classifier's probabilities move by at most INT8_PROBABILITY_TOLERANCE. The figures they were set from are in
docs/notes/cpu_inference.md.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bertforge.engine.build import build_engine, plan_engine
from bertforge.engine.int8 import (
    LINEAR_DYNAMIC,
    REDUCE_RANGE,
    Int8Linear,
    float_linears,
    int8_linears,
    is_quantized,
    least_value,
    quantization_engine,
    quantize_int8,
)
from bertforge.engine.row_buckets import bucket_rows
from bertforge.errors import ConfigError
from bertforge.evaluation.runner import run_features
from bertforge.model.bert import BertModel
from bertforge.model.fast_paths import fast_paths_enabled, set_fast_paths

# Measured on 64 SST-2 dev sentences: min cosine 0.9913, mean 0.9955 (8-bit activations, per token for the
# feed-forward down projection; 0.9814 / 0.9899 with SmoothQuant and one scale per call everywhere).
INT8_COSINE_TOLERANCE = 1.5e-2
INT8_MEAN_COSINE_TOLERANCE = 1e-2
INT8_PROBABILITY_TOLERANCE = 5e-2

SENTENCES = [
    "it 's a charming and often affecting journey .",
    "unflinchingly bleak and desperate",
    "allows us to hope that nolan is poised to embark a major career as a commercial yet inventive filmmaker .",
    "the acting , costumes , music , cinematography and sound are all astounding given the production 's "
    "austere locales .",
    "it 's slow -- very , very slow .",
    "although laced with humor and a few fanciful touches , the film is a refreshingly serious look at young "
    "women .",
    "a sometimes tedious film .",
    "or doing last year 's taxes with your ex-wife .",
]


def batch(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    from bertforge.tokenization import Tokenizer

    encodings = Tokenizer.from_pretrained(path).encode_batch(SENTENCES, padding="longest")
    ids = torch.tensor([e.ids for e in encodings])  # [B, T]
    mask = torch.tensor([e.attention_mask for e in encodings])  # [B, T]
    return ids, mask


def mean_pooled(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        hidden = model(ids, attention_mask=mask).last_hidden_state  # [B, T, H]
    return (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)  # [B, H]


def test_quantize_int8_makes_every_encoder_linear_int8(tiny_config):
    from bertforge.families.classification import BertForSequenceClassification

    model = BertForSequenceClassification(tiny_config.with_labels(["a", "b", "c"]))
    quantize_int8(model)
    layers = tiny_config.num_hidden_layers
    names = int8_linears(model)
    assert len(names) == 4 * layers  # qkv, attention output, feed-forward up and down per layer
    assert {name.rsplit(".", 1)[-1] for name in names} == {"qkv", "output", "up", "down"}
    for module in model.modules():
        if isinstance(module, Int8Linear):
            assert module.int8_weight().dtype == torch.int8
    # Only the down projection, which reads the GELU's output, quantizes its activations per token.
    per_token = {name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                 if isinstance(module, Int8Linear) and module.per_token}
    assert per_token == {"down"}
    # Embeddings, LayerNorms, the pooler and the head stay float.
    assert sorted(float_linears(model)) == ["bert.pooler.dense", "classifier"]
    assert model.bert.embeddings.word.weight.dtype == torch.float32
    assert is_quantized(model) and not model.training


def test_quantize_int8_embeddings_stay_within_cosine_tolerance_of_fp32(minilm_path):
    ids, mask = batch(minilm_path)
    reference = mean_pooled(BertModel.from_pretrained(minilm_path), ids, mask)
    quantized = quantize_int8(BertModel.from_pretrained(minilm_path))
    cosine = F.cosine_similarity(reference, mean_pooled(quantized, ids, mask))  # [B]
    assert cosine.min() >= 1 - INT8_COSINE_TOLERANCE, cosine
    assert cosine.mean() >= 1 - INT8_MEAN_COSINE_TOLERANCE, cosine


def test_quantize_int8_classifier_probabilities_stay_within_tolerance(minilm_path):
    from bertforge.families.classification import BertForSequenceClassification

    torch.manual_seed(0)
    float_model = BertForSequenceClassification.from_pretrained(minilm_path, config_overrides={"id2label": {0: "neg", 1: "pos"}, "label2id": {"neg": 0, "pos": 1}})
    with torch.no_grad():
        float_model.classifier.weight.normal_(0, 1.0)  # a head as confident as a trained one
    int8_model = quantize_int8(copy.deepcopy(float_model))
    ids, mask = batch(minilm_path)
    with torch.inference_mode():
        expected = float_model(input_ids=ids, attention_mask=mask).logits.softmax(-1)  # [B, 2]
        actual = int8_model(input_ids=ids, attention_mask=mask).logits.softmax(-1)
    assert expected.max(-1).values.min() < 0.99  # a meaningful comparison: not every probability saturated
    assert (expected - actual).abs().max() <= INT8_PROBABILITY_TOLERANCE


def test_int8_linear_per_token_keeps_a_small_row_beside_a_large_one():
    # One row 200x the other, as a [CLS] token's GELU output beside an ordinary token's: on one scale per call
    # the small row keeps about 1 of int8's 256 steps; on its own scale, all of them.
    torch.manual_seed(0)
    weight, bias = torch.randn(16, 64), torch.randn(16)
    x = torch.randn(2, 64)
    x[0] *= 200.0
    expected = F.linear(x, weight, bias)  # [2, 16]
    engine = quantization_engine()
    per_token = Int8Linear(weight, bias, engine, per_token=True)(x)
    per_tensor = Int8Linear(weight, bias, engine)(x)

    def error(y):  # relative error of each row, [2]
        return (y - expected).norm(dim=-1) / (expected - bias).norm(dim=-1)

    assert error(per_token).max() < 0.02, error(per_token)
    assert error(per_tensor)[1] > 0.1, error(per_tensor)  # the small row, crushed
    zeros = Int8Linear(weight, bias, engine, per_token=True)(torch.zeros(3, 64))
    assert torch.equal(zeros, bias.expand(3, 16))  # a row of zeros: the bias, not NaN


def test_least_value_of_the_feed_forward_activations():
    assert least_value(F.gelu) == pytest.approx(-0.16997, abs=5e-4)
    assert least_value(lambda x: F.gelu(x, approximate="tanh")) == pytest.approx(-0.17, abs=5e-4)
    assert least_value(F.relu) == 0.0
    assert least_value(lambda x: x) is None  # not bounded below: the per-token scale takes |x|


def test_int8_linear_per_token_with_a_known_least_input_equals_the_plain_per_token_scale():
    # GELU outputs whose rows all reach above 0.17: max(row max, 0.17) is each row's max |x| exactly.
    torch.manual_seed(0)
    weight, bias = torch.randn(16, 64), torch.randn(16)
    x = F.gelu(3 * torch.randn(5, 64))
    engine = quantization_engine()
    bounded = Int8Linear(weight, bias, engine, per_token=True, least_input=least_value(F.gelu))
    assert torch.equal(bounded(x), Int8Linear(weight, bias, engine, per_token=True)(x))
    assert not bounded(torch.full((2, 64), -0.1)).isnan().any()  # rows below the floor stay finite


def test_quantize_int8_is_idempotent_and_keeps_the_fast_paths(tiny_config):
    model = quantize_int8(BertModel(tiny_config))
    before = int8_linears(model)
    assert int8_linears(quantize_int8(model)) == before
    set_fast_paths(model)  # re-applying the default fast paths leaves the int8 layers alone
    assert int8_linears(model) == before and fast_paths_enabled(model)["unpad"]
    with pytest.raises(ConfigError, match="no float QKV weights"):
        set_fast_paths(model, fused_qkv=False)


def test_quantize_int8_model_refuses_to_be_saved(tiny_config, tmp_path):
    model = quantize_int8(BertModel(tiny_config))
    with pytest.raises(ConfigError, match="cannot be saved"):
        model.state_dict()


def test_build_engine_quantizes_only_for_int8(tiny_config):
    assert not is_quantized(build_engine(BertModel(tiny_config), plan_engine("cpu", "fp32")))
    assert not is_quantized(build_engine(BertModel(tiny_config), plan_engine("cpu", "bf16")))
    assert is_quantized(build_engine(BertModel(tiny_config), plan_engine("cpu", "int8")))


def test_run_features_refuses_int8_on_a_float_model(tiny_config):
    from bertforge.data.finetuning import Feature

    features = [Feature(example_index=0, input_ids=[2, 5, 3], token_type_ids=[0, 0, 0])]
    with pytest.raises(ConfigError, match="is not int8-quantized"):
        run_features(BertModel(tiny_config), features, lambda model, batch: [], batch_size=2, pad_token_id=0,
                     precision="int8")
    with pytest.raises(ConfigError, match="is prepared for int8"):
        run_features(quantize_int8(BertModel(tiny_config)), features, lambda model, batch: [], batch_size=2,
                     pad_token_id=0, precision="fp32")


def test_pipeline_int8_runs_quantized_and_says_so(tiny_minilm_model: Path):
    from bertforge.inference.pipelines import load_pipeline

    fp32 = load_pipeline(tiny_minilm_model, "embed", device="cpu")
    int8 = load_pipeline(tiny_minilm_model, "embed", device="cpu", precision="int8")
    assert int8.describe()["precision"] == "int8" and is_quantized(int8.model)
    assert not is_quantized(fp32.model)
    texts = ["a quantized encoder", "answers the same question"]
    reference, candidate = fp32.encode(texts), int8.encode(texts)
    assert candidate.shape == reference.shape
    cosine = F.cosine_similarity(torch.as_tensor(reference), torch.as_tensor(candidate))
    assert cosine.min() >= 1 - INT8_COSINE_TOLERANCE


def test_quantization_engine_prefers_onednn_on_amx_and_x86_elsewhere(monkeypatch):
    import bertforge.engine.int8 as quantization

    supported = torch.backends.quantized.supported_engines
    monkeypatch.setattr(quantization, "has_amx", lambda: True)
    amx = quantization.quantization_engine()
    monkeypatch.setattr(quantization, "has_amx", lambda: False)
    other = quantization.quantization_engine()
    if "onednn" in supported:
        assert amx == "onednn"
    if "x86" in supported:
        assert other == "x86"


@pytest.mark.skipif("onednn" not in torch.backends.quantized.supported_engines, reason="no onednn engine")
def test_int8_linear_pads_onednn_rows_to_their_bucket_without_changing_them():
    torch.manual_seed(4)
    weight, bias = torch.randn(40, 24) * 0.1, torch.randn(40)
    linear = Int8Linear(weight, bias, "onednn")

    class Holder(torch.nn.Module):  # a traced module, as the layer graph is: padding must follow each call's size
        def __init__(self):
            super().__init__()
            self.linear = linear

        def forward(self, x):
            return self.linear(x)

    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.trace's deprecation notice; the layer graph silences it too
        traced = torch.jit.trace(Holder(), torch.randn(1, 20, 24), check_trace=False)
        for tokens in (20, 5, 32, 37, 300):
            x = torch.randn(1, tokens, 24)
            padded = F.pad(x[0], [0, 0, 0, bucket_rows(tokens) - tokens])
            expected = LINEAR_DYNAMIC(padded, linear._packed, REDUCE_RANGE)[:tokens]  # zero rows change nothing
            assert torch.equal(linear(x)[0], expected), tokens
            assert torch.equal(traced(x)[0], expected), tokens
            plain = LINEAR_DYNAMIC(x, linear._packed, REDUCE_RANGE)  # oneDNN's kernel at the unpadded count
            torch.testing.assert_close(linear(x), plain, rtol=0, atol=1e-5)
