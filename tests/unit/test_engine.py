"""Engines (`bertforge.engine`): one plan rule for every command, model-shaped engines, and one parity test over
the `ENGINES` registry: for every task family in the registry (`families.registry.FAMILIES`), every engine on this
machine (each kind at fp32, int8 and bf16 where the kind runs it) answers within its named tolerance of the PyTorch
fp32 engine, through `evaluate` where evaluate takes the family (the saved tiny fixtures of tests/fixtures/saved_v1:
sentence pairs, regression, multi-label, a CRF tagger, SQuAD v2 windows, multiple choice; and tiny embedding and
sparse models scored on pairs), and through the pipelines' features -> engine -> decode path for every family
(`load_pipeline`: the reranking cross-encoder and fill-mask, which evaluate does not take, among them)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.checkpoint_format import read_directory
from bertforge.cli import main
from bertforge.constants import FINETUNING_NAME
from bertforge.engine.build import ENGINES, as_engine, build_engine, plan_engine
from bertforge.engine.engine import Engine, TorchEngine
from bertforge.engine.int8 import is_quantized, quantize_int8
from bertforge.engine.linears import replace_linears
from bertforge.engine.row_chunks import chunks_rows
from bertforge.engine.threads import cpu_quota
from bertforge.errors import ConfigError
from bertforge.evaluation.saved_model import evaluate
from bertforge.families import registry
from bertforge.families.task import reader_settings, task_of
from bertforge.model.bert import BertModel
from conftest import make_tiny_config

SAVED = Path(__file__).resolve().parents[1] / "fixtures" / "saved_v1"
FIXTURES = ("pair", "regression", "multilabel", "ner_iobes_crf", "qa_v2", "choice")
# Every score of an engine's answers against PyTorch's fp32 engine's: |difference| <= TOLERANCES[precision] * the
# answers' scale, max(1, the largest |score| among them) (probabilities: an absolute bound; SPLADE weights, logits,
# CRF path scores: relative to their size, as a quantization error is).
# fp32: the export's parity bound. int8: the cap PyTorch int8's own unit tests hold a tiny model's probabilities to
# (test_quantization.INT8_PROBABILITY_TOLERANCE). bf16: the same cap. Measured on these fixtures (2026-12-05):
# int8 at most 0.035 of the scale (both engines, SPLADE weights; at most 0.007 on every other family), bf16 at
# most 0.020 (SPLADE; 0.004 elsewhere), fp32 ONNX Runtime at most 1.2e-6.
TOLERANCES = {"fp32": 1e-4, "int8": 5e-2, "bf16": 5e-2}
# Below fp32 a near-tie of the tiny random models may flip a decision (choice: 0.500001 vs 0.499999), so int8 and
# bf16 are held on their scores only; the cosine of all of a file's scores to fp32's must stay this close as well.
REDUCED_MIN_COSINE = 0.999
# Metrics of the regression fixture are not compared: its model predicts a near-constant (std 2.4e-5), so a
# rounding difference far inside the fp32 tolerance moves its Pearson by whole hundredths.
ILL_CONDITIONED = ("regression",)
# The families evaluate scores here by fixture, and the pipeline inputs of every family (`pipeline_case`).
EVALUATED = {"pair": "classification", "regression": "classification", "multilabel": "classification",
             "ner_iobes_crf": "tagging", "qa_v2": "question_answering", "choice": "multiple_choice",
             "embedding": "embedding", "sparse": "sparse_embedding", "rerank": "reranking", "colbert": "colbert"}
PAIRS = [("a man is eating food", "a man eats something", 4.5), ("a cat sits on the mat", "the stock fell", 0.2),
         ("the stock market fell sharply today", "shares dropped", 3.8), ("it rains", "the weather is wet", 3.0)]


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
    """(engine kind, precision) of every engine this registry offers on this machine's CPU: each kind at fp32,
    int8 and bf16 where it runs them (PyTorch runs bf16 on every CPU: packed where oneDNN has bf16 kernels,
    autocast elsewhere)."""
    plans = []
    for kind, engine in ENGINES.items():
        if not _installed(kind):
            continue
        for precision in TOLERANCES:
            if not engine.precisions or precision in engine.precisions:
                plans.append((kind, precision))
    return plans


def _installed(kind: str) -> bool:
    """Whether the packages an engine kind needs are installed (ONNX Runtime's: the export extra)."""
    return kind != "onnxruntime" or all(importlib.util.find_spec(name) for name in ("onnx", "onnxruntime"))


def assert_close_scores(got: list[float], expected: list[float], precision: str, where) -> None:
    """Every score within its precision's tolerance (`TOLERANCES`), and at int8 and bf16 the cosine too."""
    assert len(got) == len(expected), where
    got, expected = np.array(got), np.array(expected)
    bound = TOLERANCES[precision] * max(1.0, float(np.abs(expected).max(initial=0.0)))
    worst = np.abs(got - expected) - bound
    assert worst.max(initial=-1.0) <= 0, (where, float(np.abs(got - expected).max()))
    if precision != "fp32" and len(got):
        cosine = got @ expected / (np.linalg.norm(got) * np.linalg.norm(expected))
        assert cosine >= REDUCED_MIN_COSINE, (where, cosine)


def evaluated_case(name: str, tmp_path: Path, tiny_minilm_model: Path, tiny_sparse_model: Path):
    """(model dir, data file, overrides) of a fixture evaluate scores."""
    if name in FIXTURES:
        shutil.copytree(SAVED / name, tmp_path / name)
        data = next(p for p in (tmp_path / name).iterdir() if p.name.startswith("data."))
        return tmp_path / name / "model", data, None
    if name == "rerank":  # a one-output cross-encoder fine-tuned on lists (ListNet), scored on them
        data = tmp_path / "lists.jsonl"
        answers = [b for _, b, _ in PAIRS]
        data.write_text("".join(json.dumps({"query": a, "docs": [answers[(i + 1) % 4], answers[(i + 2) % 4], b],
                                            "labels": [0, 0, 1]}) + "\n" for i, (a, b, _) in enumerate(PAIRS * 2)),
                        encoding="utf-8")
        assert main(["finetune", "--model", str(tiny_minilm_model), "--format", "rerank-lists", "--train",
                     str(data), "--dev", str(data), "--out", str(tmp_path / "run"), "--epochs", "1",
                     "--batch-size", "4"]) == 0
        return tmp_path / "run" / "best", data, None
    if name == "colbert":  # a ColBERT fine-tuned on pairs, scored by MaxSim retrieval among them
        data = tmp_path / "pairs.tsv"
        data.write_text("anchor\tpositive\n" + "".join(f"{a}\t{b}\n" for a, b, _ in PAIRS), encoding="utf-8")
        assert main(["finetune", "--model", str(tiny_minilm_model), "--format", "colbert-pairs", "--train", str(data),
                     "--dev", str(data), "--out", str(tmp_path / "run"), "--epochs", "1", "--batch-size", "4"]) == 0
        return tmp_path / "run" / "best", data, None
    model = tmp_path / name
    shutil.copytree(tiny_minilm_model if name == "embedding" else tiny_sparse_model, model)
    data = tmp_path / f"{name}.tsv"
    if name == "embedding":  # scored pairs: Pearson and Spearman of the cosines
        data.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in PAIRS))
        return model, data, {"reader": {"text_a_column": "sentence1", "text_b_column": "sentence2",
                                        "label_column": "score"}}
    data.write_text("anchor\tpositive\n" + "".join(f"{a}\t{b}\n" for a, b, _ in PAIRS))  # retrieval
    # A SPLADE model fine-tuned on pairs records that it reads no label column (a directory without the record
    # reads text_a / label, which sparse training refuses, and the reader override cannot unset a column).
    task = task_of(read_directory(model), registry.family("sparse_embedding"))
    task = task.replace(reader=reader_settings(text_a_column="anchor", text_b_column="positive"))
    (model / FINETUNING_NAME).write_text(json.dumps(task.to_json()), encoding="utf-8")
    return model, data, None


@pytest.mark.parametrize("name", list(EVALUATED))
def test_engine_parity_every_engine_scores_every_family_as_torch_fp32(name, tmp_path, tiny_minilm_model,
                                                                     tiny_sparse_model):
    model, data, overrides = evaluated_case(name, tmp_path, tiny_minilm_model, tiny_sparse_model)
    assert registry.for_directory(read_directory(model)).name == EVALUATED[name]
    reference = evaluate(model, data, out_dir=tmp_path / "torch-fp32", device="cpu", overrides=overrides)
    expected = numbers(reference.predictions)
    assert expected, name
    for kind, precision in engine_plans():
        if (kind, precision) == ("torch", "fp32"):
            continue
        out = tmp_path / f"{kind}-{precision}"
        result = evaluate(model, data, out_dir=out, device="cpu", engine=kind, precision=precision,
                          overrides=overrides)
        written = json.loads((out / "metrics.json").read_text())
        assert (written["engine"], written["precision"]) == (kind, precision)
        if precision == "fp32":
            assert_close_scores(numbers(result.predictions), expected, precision, kind)
            assert words(result.predictions) == words(reference.predictions), kind
            if name not in ILL_CONDITIONED:
                assert result.metrics == pytest.approx(reference.metrics, abs=TOLERANCES["fp32"]), kind
        else:  # the scores only (a near-tie may flip a decision below fp32)
            assert_close_scores(numbers_of_floats(result.predictions), numbers_of_floats(reference.predictions),
                                precision, (kind, precision))


# --- every family through the pipelines' features -> engine -> decode path ---------------------------------

def pipeline_case(family: str, tmp_path: Path, tokenizer_dir: Path) -> tuple[Path, list]:
    """(a tiny saved model of `family` with the real MiniLM tokenizer, inputs of its route)."""
    from bertforge.checkpoint_format import load_tokenizer
    from bertforge.families.classification import BertForSequenceClassification
    from bertforge.families.colbert import BertForColBERT
    from bertforge.families.multiple_choice import BertForMultipleChoice
    from bertforge.families.pretraining import BertForPretraining
    from bertforge.families.question_answering import BertForQuestionAnswering
    from bertforge.families.sparse import BertForSparseEmbedding
    from bertforge.families.tagging import BertForTokenClassification

    tokenizer = load_tokenizer(tokenizer_dir)
    # The MLM heads' models with larger weights (initializer_range 0.2), so that most SPLADE terms weigh 0 (with
    # the bias below) and fill-mask's top tokens stand apart (ids 2000-2004 favoured: top probabilities ~0.2, not
    # ~1e-4, so the tolerance bounds something); the other heads' outputs near-uniform, as in the fixtures.
    heads = family in ("pretraining", "sparse_embedding")
    config = make_tiny_config(vocab_size=tokenizer.vocab_size, initializer_range=0.2 if heads else 0.02)
    labels = {0: "negative", 1: "positive"}
    models = {
        "classification": (BertForSequenceClassification, {"id2label": labels}),
        "reranking": (BertForSequenceClassification, {"id2label": {0: "relevance"}}),  # one output
        "tagging": (BertForTokenClassification, {"id2label": {0: "O", 1: "B-PER", 2: "I-PER"}}),
        "question_answering": (BertForQuestionAnswering, {}),
        "multiple_choice": (BertForMultipleChoice, {}),
        "pretraining": (BertForPretraining, {}),
        "sparse_embedding": (BertForSparseEmbedding, {}),
        "colbert": (BertForColBERT, {}),
        "embedding": (BertModel, {}),
    }
    model_class, fields = models[family]
    torch.manual_seed(0)
    model = model_class(config.replace(**fields) if fields else config)
    with torch.no_grad():
        if family == "sparse_embedding":
            model.mlm.bias.fill_(-1.5)  # most terms 0, as in a trained SPLADE model
        elif family == "pretraining":
            model.mlm.bias[2000:2005] += 8.0
    model.save_pretrained(tmp_path / family, tokenizer=tokenizer)
    return tmp_path / family, list(registry.family(family).example_inputs)


def dense(answer):
    """An answer with each sparse vector ({"indices", "values"}) as {term: weight} over every term either side
    has (a term at 0 on one side reads 0 there: a weight crossing 0 is a difference of a weight, not a term)."""
    if isinstance(answer, dict) and "indices" in answer:
        return {"terms": dict(zip(answer["indices"], answer["values"]))}
    if isinstance(answer, list):
        return [dense(item) for item in answer]
    return answer


def sparse_numbers(got, expected) -> tuple[list[float], list[float]]:
    a, b = [], []
    for left, right in zip(got, expected):
        terms = sorted(set(left["terms"]) | set(right["terms"]))
        a += [left["terms"].get(t, 0.0) for t in terms]
        b += [right["terms"].get(t, 0.0) for t in terms]
    return a, b


@pytest.mark.parametrize("family", registry.names())
def test_engine_parity_every_engine_answers_every_family_route_as_torch_fp32(family, tmp_path, tiny_minilm_model):
    from bertforge.inference.pipelines import load_pipeline

    model_dir, inputs = pipeline_case(family, tmp_path, tiny_minilm_model)
    task = registry.family(family).task

    def answer(kind: str, precision: str):
        pipeline = load_pipeline(model_dir, task, device="cpu", engine=kind, precision=precision)
        described = pipeline.describe()["engine"]
        assert (described["kind"], described["precision"]) == (kind, precision)
        return dense(pipeline(inputs))

    reference = answer("torch", "fp32")
    for kind, precision in engine_plans():
        if (kind, precision) == ("torch", "fp32"):
            continue
        got = answer(kind, precision)
        if family == "sparse_embedding":
            a, b = sparse_numbers(got, reference)
            assert_close_scores(a, b, precision, (kind, precision))
            continue
        if precision == "fp32":
            assert_close_scores(numbers(got), numbers(reference), precision, kind)
            assert words(got) == words(reference), kind
        else:
            assert_close_scores(numbers_of_floats(got), numbers_of_floats(reference), precision, (kind, precision))


def test_engine_parity_covers_every_family_in_the_registry():
    """A new family fails here until the parity tests above run it (the route test takes every registered name;
    evaluate's fixtures name the families it takes)."""
    evaluated = set(EVALUATED.values())
    takes = {f.name for f in registry.FINETUNING_FAMILIES}
    assert evaluated == takes, "evaluate takes these families: give each a fixture in EVALUATED"
    assert {f.name for f in registry.FAMILIES} == set(registry.names())


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
    from bertforge.inference.pipelines import load_pipeline, load_pipelines
    from bertforge.inference.predict_corpus import predict_corpus
    from bertforge.retrieval.embed_corpus import embed_corpus

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
    assert plan.reason.startswith("auto: fp32") and "threads: 3 intra-op (requested" in plan.reason
    # never a silent default: the count is named, within the cores this process may use
    assert plan_engine("cpu").threads == min(torch.get_num_threads(), cpu_quota().cores)
    assert set(plan.describe()) == {"kind", "device", "precision", "threads", "tokenizer_threads", "reason"}


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
