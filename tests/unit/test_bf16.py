"""bf16 on the CPU (`engine/bf16.py`, `engine/build.py`): the cast-once, packed-once encoder linears compute
what autocast alone computes, and a prepared model runs at bf16 only."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from bertforge.engine.bf16 import Bf16Linear, is_bf16, onednn_bf16, pack_bf16
from bertforge.engine.build import build_engine, check_precision, plan_engine, prepared_precision
from bertforge.errors import ConfigError
from bertforge.evaluation.runner import run_features
from bertforge.model.bert import BertModel
from bertforge.model.fast_paths import set_fast_paths
from bertforge.runtime import autocast

CPU = torch.device("cpu")


def _autocast_linear(x, weight, bias):
    with torch.inference_mode(), autocast(CPU, "bf16"):
        return torch.nn.functional.linear(x, weight, bias)


@pytest.mark.parametrize("packed", [False, pytest.param(True, marks=pytest.mark.skipif(
    not onednn_bf16(), reason="PyTorch's oneDNN has no bf16 kernels on this CPU"))])
def test_bf16_linear_equals_autocast_linear(packed):
    generator = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(48, 32, generator=generator), torch.randn(48, generator=generator)
    x = torch.randn(3, 7, 32, generator=generator)  # [B, T, I]: leading dimensions are kept
    linear = Bf16Linear(weight, bias, packed=packed)
    with torch.inference_mode():
        out = linear(x)
    expected = _autocast_linear(x, weight, bias)
    assert out.dtype == torch.bfloat16 and out.shape == (3, 7, 48)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)  # same bf16 weights, same accumulation


@pytest.mark.parametrize("packed", [False, pytest.param(True, marks=pytest.mark.skipif(
    not onednn_bf16(), reason="PyTorch's oneDNN has no bf16 kernels on this CPU"))])
def test_bf16_linear_applies_its_activation_as_autocast_does(packed):
    generator = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(64, 32, generator=generator), torch.randn(64, generator=generator)
    x = torch.randn(5, 32, generator=generator)
    for act in (F.gelu, F.relu):
        linear = Bf16Linear(weight, bias, packed=packed, activation=act)
        assert (linear.post_op != "none") == packed  # fused into oneDNN's call only on the packed path
        with torch.inference_mode():
            out = linear(x)
        with torch.inference_mode(), autocast(CPU, "bf16"):
            expected = act(_autocast_linear(x, weight, bias))
        assert out.dtype == torch.bfloat16
        if packed and act is F.gelu:  # GELU of the fp32 result, then one rounding: within a bf16 step
            torch.testing.assert_close(out.float(), expected.float(), rtol=1e-2, atol=1e-2)
            exact = F.gelu((x.bfloat16().float() @ weight.bfloat16().float().T) + bias.bfloat16().float())
            assert (out.float() - exact).abs().max() <= (expected.float() - exact).abs().max() + 1e-6
        else:  # ReLU commutes with rounding; unpacked, the same operators as autocast's
            torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_pack_bf16_moves_the_feed_forward_activation_into_the_up_projection(tiny_config):
    torch.manual_seed(0)
    model = pack_bf16(set_fast_paths(BertModel(tiny_config)))
    for layer in model.encoder.layers:
        ff = layer.feed_forward
        assert isinstance(ff.act, torch.nn.Identity)
        assert (ff.up.post_op, ff.up.activation) == (("gelu", None) if ff.up.packed else ("none", F.gelu))
        assert ff.down.post_op == "none" and ff.down.activation is None


def test_pack_bf16_model_equals_autocast_model(tiny_config):
    torch.manual_seed(0)
    reference = BertModel(tiny_config).eval()
    prepared = BertModel(tiny_config).eval()
    prepared.load_state_dict(reference.state_dict())
    set_fast_paths(reference)
    set_fast_paths(prepared)
    pack_bf16(prepared)
    ids = torch.randint(5, tiny_config.vocab_size, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # a padded row: the unpadded path too
    with torch.inference_mode(), autocast(CPU, "bf16"):
        expected = reference(ids, attention_mask=mask).last_hidden_state
        out = prepared(ids, attention_mask=mask).last_hidden_state
    assert is_bf16(prepared) and not is_bf16(reference)
    linears = [m for m in prepared.modules() if isinstance(m, Bf16Linear)]
    assert len(linears) == 4 * tiny_config.num_hidden_layers  # QKV, output, up, down per layer
    # One bf16 rounding of a layer's output may differ where an op's order differs: bf16's resolution.
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_build_engine_packs_bf16_on_cpu_and_is_idempotent(tiny_config):
    plan = plan_engine("cpu", "bf16")
    engine = build_engine(BertModel(tiny_config), plan)
    assert prepared_precision(engine) == "bf16" and prepared_precision(engine.model) == "bf16"
    assert build_engine(engine, plan) is engine and pack_bf16(engine.model) is engine.model
    assert prepared_precision(build_engine(BertModel(tiny_config), plan_engine("cpu", "fp32")).model) is None
    assert prepared_precision(build_engine(BertModel(tiny_config), plan_engine("cpu", "int8")).model) == "int8"


def test_check_precision_refuses_a_bf16_model_at_another_precision(tiny_config):
    from bertforge.data.finetuning import Feature

    model = pack_bf16(BertModel(tiny_config))
    check_precision(model, "bf16")
    check_precision(BertModel(tiny_config), "bf16")  # an unprepared model may run under autocast
    features = [Feature(example_index=0, input_ids=[2, 5, 3], token_type_ids=[0, 0, 0])]
    for precision in ("fp32", "int8"):
        with pytest.raises(ConfigError, match="prepared for bf16"):
            run_features(model, features, lambda model, batch: [], batch_size=2, pad_token_id=0,
                         precision=precision)


def test_pack_bf16_model_refuses_to_be_saved(tiny_config):
    with pytest.raises(ConfigError, match="cannot be saved"):
        pack_bf16(BertModel(tiny_config)).state_dict()


def test_pipeline_bf16_runs_packed_and_stays_close_to_fp32(tiny_minilm_model: Path):
    from bertforge.inference.pipelines import load_pipeline

    texts = ["a packed encoder", "answers the same question as autocast"]
    packed = load_pipeline(tiny_minilm_model, "embed", device="cpu", precision="bf16")
    assert packed.describe()["precision"] == "bf16" and is_bf16(packed.model)
    plain = load_pipeline(tiny_minilm_model, "embed", device="cpu")
    cosine = torch.nn.functional.cosine_similarity(torch.as_tensor(plain.encode(texts)),
                                                   torch.as_tensor(packed.encode(texts)))
    assert not is_bf16(plain.model) and cosine.min() >= 0.99  # bf16 against fp32: rounding only
