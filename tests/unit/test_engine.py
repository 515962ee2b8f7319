"""Engines (`bertforge.engine`): one plan rule for every command, model-shaped engines, and one parity test over
the `ENGINES` registry: for every task family of the saved tiny fixtures (tests/fixtures/saved_v1: sentence
pairs, regression, multi-label, a CRF tagger, SQuAD v2 windows, multiple choice), every engine on this machine
scores through `evaluate` within its named tolerance of the PyTorch fp32 engine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.engine.build import ENGINES, as_engine, build_engine, plan_engine
from bertforge.engine.engine import Engine, TorchEngine
from bertforge.engine.int8 import is_quantized, quantize_int8
from bertforge.engine.linears import replace_linears
from bertforge.engine.row_chunks import chunks_rows
from bertforge.errors import ConfigError
from bertforge.evaluation.saved_model import evaluate
from bertforge.model.bert import BertModel
from conftest import make_tiny_config

SAVED = Path(__file__).resolve().parents[1] / "fixtures" / "saved_v1"
FAMILIES = ("pair", "regression", "multilabel", "ner_iobes_crf", "qa_v2", "choice")
# An fp32 engine against PyTorch's fp32 engine: every score of every prediction (the export's parity bound).
FP32_TOLERANCE = 1e-4
# An int8 engine: the cosine of all the scores of a file's predictions to fp32's (the tiny fixtures' figures:
# 0.99999999 or closer), and the same count of scores (the same labels, spans and n-best lists).
INT8_MIN_COSINE = 0.999
# Metrics of the regression fixture are not compared: its model predicts a near-constant (std 2.4e-5), so a
# rounding difference far inside FP32_TOLERANCE moves its Pearson by whole hundredths.
ILL_CONDITIONED = ("regression",)


def numbers(value) -> list[float]:
    """Every score of a prediction record, in a fixed order (ids and character offsets left out)."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, dict):
        return [n for key in sorted(value) if key not in ("id", "start", "end", "windows") for n in numbers(value[key])]
    if isinstance(value, list):
        return [n for item in value for n in numbers(item)]
    return []


def numbers_of_floats(value) -> list[float]:
    """The float scores of prediction records (decisions, ints, left out)."""
    if isinstance(value, float):
        return [value]
    if isinstance(value, dict):
        return [n for key in sorted(value) for n in numbers_of_floats(value[key])]
    if isinstance(value, list):
        return [n for item in value for n in numbers_of_floats(item)]
    return []


def words(value):
    """A prediction record without its scores (labels, spans, answers; a list of scores reads empty)."""
    if isinstance(value, dict):
        return {key: words(item) for key, item in value.items() if not isinstance(item, float)}
    if isinstance(value, list):
        return [words(item) for item in value if not isinstance(item, float)]
    return value


def engine_plans() -> list[tuple[str, str]]:
    """(engine kind, precision) of every engine this registry offers, at fp32 and, where it runs it, int8."""
    plans = []
    for kind, engine in ENGINES.items():
        for precision in ("fp32", "int8"):
            if not engine.precisions or precision in engine.precisions:
                plans.append((kind, precision))
    return plans


@pytest.mark.parametrize("name", FAMILIES)
def test_engine_parity_every_engine_scores_every_family_as_torch_fp32(name, tmp_path):
    shutil.copytree(SAVED / name, tmp_path / name)
    model = tmp_path / name / "model"
    data = next(p for p in (tmp_path / name).iterdir() if p.name.startswith("data."))
    reference = evaluate(model, data, out_dir=tmp_path / "torch-fp32", device="cpu")
    expected = numbers(reference.predictions)
    for kind, precision in engine_plans():
        out = tmp_path / f"{kind}-{precision}"
        result = evaluate(model, data, out_dir=out, device="cpu", engine=kind, precision=precision)
        got = numbers(result.predictions)
        assert len(got) == len(expected), (kind, precision)
        written = json.loads((out / "metrics.json").read_text())
        assert (written["engine"], written["precision"]) == (kind, precision)
        if precision == "fp32":
            assert np.abs(np.array(got) - np.array(expected)).max() <= FP32_TOLERANCE, kind
            assert words(result.predictions) == words(reference.predictions), kind
            if name not in ILL_CONDITIONED:
                assert result.metrics == pytest.approx(reference.metrics, abs=FP32_TOLERANCE), kind
        else:  # the scores only: a near-tie of the tiny models (choice: 0.500001 vs 0.499999) may flip a decision
            a, b = (np.array([x for x in numbers_of_floats(r.predictions)]) for r in (result, reference))
            assert a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) >= INT8_MIN_COSINE, kind


# --- one plan rule for every command ----------------------------------------------------------------------

def refusal(call) -> str:
    with pytest.raises(ConfigError) as error:
        call()
    return str(error.value)


@pytest.mark.parametrize("flags, words_of_the_rule", [
    ({"precision": "fp16"}, "fp16 needs a CUDA GPU"),
    ({"engine": "tensorrt"}, "unknown engine 'tensorrt'"),
    ({"threads": 0}, "threads must be a positive integer"),
])
def test_plan_refusals_are_the_same_for_every_command(flags, words_of_the_rule, tiny_minilm_model, tmp_path):
    """evaluate, predict (a file and a stream), embed, evaluate-embeddings and serve refuse the same flags with
    the same words, before any model loads."""
    from bertforge.inference.embed_corpus import embed_corpus
    from bertforge.inference.pipelines import load_pipeline, load_pipelines
    from bertforge.inference.predict_corpus import predict_corpus

    data = tmp_path / "lines.txt"
    data.write_text("good film\n")
    settings = {"device": "cpu", **flags}
    calls = {
        "evaluate": lambda: evaluate(tmp_path / "no-such-model", data, **settings),
        "predict": lambda: load_pipeline(tiny_minilm_model, "embed", **settings),
        "predict a file": lambda: predict_corpus(tiny_minilm_model, "embed", data, tmp_path / "out.jsonl", **settings),
        "embed": lambda: embed_corpus(tiny_minilm_model, data, tmp_path / "vectors", **settings),
        "serve": lambda: load_pipelines(tiny_minilm_model, None, **settings),
    }
    said = {command: refusal(call) for command, call in calls.items()}
    rule = plan_engine_refusal(settings)
    assert words_of_the_rule in rule
    assert all(rule in text for text in said.values()), said
    assert not (tmp_path / "vectors").exists() and not (tmp_path / "out.jsonl").exists()


def plan_engine_refusal(settings: dict) -> str:
    return refusal(lambda: plan_engine(settings["device"], settings.get("precision", "fp32"),
                                       settings.get("engine", "torch"), settings.get("threads")))


def test_plan_names_its_precision_threads_and_why():
    plan = plan_engine("cpu", "auto", threads=3)
    assert (plan.kind, plan.precision, plan.threads) == ("torch", "fp32", 3)
    assert plan.reason.startswith("auto: fp32") and "threads: requested" in plan.reason
    assert plan_engine("cpu").threads == torch.get_num_threads()  # never a silent default: the count is named
    assert set(plan.describe()) == {"kind", "device", "precision", "threads", "reason"}


# --- the torch engine --------------------------------------------------------------------------------------

def tiny_encoder() -> BertModel:
    torch.manual_seed(0)
    return BertModel(make_tiny_config())


def test_torch_engine_is_model_shaped_and_describes_itself():
    model = tiny_encoder()
    reference = model(torch.tensor([[2, 7, 9, 3]])).last_hidden_state.detach()
    engine = build_engine(model, plan_engine("cpu", "fp32"))
    assert isinstance(engine, TorchEngine) and engine.model is model
    assert engine.config is model.config and engine.bert is model  # attributes are the model's; a bare encoder
    assert chunks_rows(model)  # the CPU converters ran, in place
    model.train()
    with engine.running():
        assert not model.training and not torch.is_grad_enabled()
        out = engine(torch.tensor([[2, 7, 9, 3]])).last_hidden_state
    assert model.training  # restored
    torch.testing.assert_close(out, reference, atol=1e-6, rtol=0)
    described = engine.describe()
    assert described["converters"] == ["layer_graph", "row_chunks"] and described["kind"] == "torch"


def test_build_engine_returns_the_engine_of_its_plan_and_refuses_another():
    plan = plan_engine("cpu", "int8")
    engine = build_engine(tiny_encoder(), plan)
    assert is_quantized(engine.model) and build_engine(engine, plan) is engine
    with pytest.raises(ConfigError, match="this engine runs"):
        build_engine(engine, plan_engine("cpu", "fp32"))
    with pytest.raises(ConfigError, match="prepared for int8"):
        build_engine(quantize_int8(tiny_encoder()), plan_engine("cpu", "bf16"))


def test_as_engine_runs_a_model_as_it_is():
    model = tiny_encoder()
    engine = as_engine(model, precision="fp32")
    assert isinstance(engine, Engine) and engine.converters == () and not chunks_rows(model)
    assert as_engine(engine, precision="fp32") is engine
    with pytest.raises(ConfigError, match="not int8-quantized"):
        as_engine(model, precision="int8")
    with pytest.raises(ConfigError, match="prepared for fp32"):
        as_engine(engine, precision="bf16")


def test_replace_linears_is_one_walk_and_refuses_a_second_converter():
    model = quantize_int8(tiny_encoder())
    with pytest.raises(ConfigError, match="already replaced"):
        replace_linears(model, lambda site: torch.nn.Identity())
    roles = []
    replace_linears(tiny_encoder(), lambda site: roles.append(site.role) or torch.nn.Linear(*site.weight.shape[::-1]))
    assert roles == ["qkv", "output", "up", "down"] * make_tiny_config().num_hidden_layers


def test_load_pipelines_share_one_engine(tiny_sparse_model):
    from bertforge.inference.pipelines import load_pipelines

    threads = torch.get_num_threads()
    try:
        pipelines = load_pipelines(tiny_sparse_model, None, device="cpu", precision="int8", threads=1)
        assert len(pipelines) > 1 and len({id(p.engine) for p in pipelines.values()}) == 1
        assert torch.get_num_threads() == 1 and pipelines["embed"].describe()["engine"]["threads"] == 1
    finally:
        torch.set_num_threads(threads)
