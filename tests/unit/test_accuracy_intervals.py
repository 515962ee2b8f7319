"""The accuracy budget's paired-bootstrap intervals: every system is scored by the family's own `score` on the
same resamples, a change that no example carries has a zero interval, a change carried by a few examples has an
interval around it that a larger flip moves, and the point scores are what `bertforge evaluate` reports."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from bertforge.evaluation.saved_model import evaluate
from bertforge.training.finetune import run_finetuning
from bertforge.training.finetune_config import load_finetune_config
from conftest import finetune_values

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from benchmarks.accuracy_intervals import paired_intervals, system_results, table  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


class Accuracy:
    """A family stub whose `score` is accuracy of results' labels against the examples' (the only part of a
    family the bootstrap calls)."""

    @staticmethod
    def score(examples, results, config, **_):
        right = sum(e.label == r["label"] for e, r in zip(examples, results))
        return {"accuracy": right / len(examples)}, {}, []


def evaluation_of(labels: list[str]) -> SimpleNamespace:
    examples = [SimpleNamespace(label=label) for label in labels]
    return SimpleNamespace(examples=examples, family=Accuracy(), config=None, options={}, scoring={})


def results_of(labels: list[str]) -> list[dict]:
    return [{"label": label} for label in labels]


def test_paired_intervals_zero_where_no_example_changes():
    gold = ["a", "b"] * 50
    fp32 = results_of(gold[:90] + ["b"] * 10)
    report = paired_intervals(evaluation_of(gold), {"bertforge fp32": fp32, "bertforge int8": list(fp32),
                                                    "ORT int8": list(fp32)}, resamples=200, seed=0)
    for figure in report["differences"]["accuracy"].values():
        assert figure["point"] == 0.0 and figure["interval_95"] == [0.0, 0.0]


def test_paired_intervals_cover_the_change_and_widen_with_it():
    gold = ["a"] * 200
    fp32 = results_of(gold)
    few = results_of(["b"] * 2 + ["a"] * 198)  # 2 of 200 flipped: -1 point
    many = results_of(["b"] * 20 + ["a"] * 180)  # 20 flipped: -10 points
    report = paired_intervals(evaluation_of(gold), {"bertforge fp32": fp32, "bertforge int8": few, "ORT int8": many},
                              resamples=300, seed=1)
    changes = report["differences"]["accuracy"]
    int8, ort, versus = (changes["bertforge int8 - bertforge fp32"], changes["ORT int8 - bertforge fp32"],
                         changes["bertforge int8 - ORT int8"])
    assert int8["point"] == pytest.approx(-0.01) and ort["point"] == pytest.approx(-0.10)
    assert versus["point"] == pytest.approx(0.09)
    for figure in (int8, ort, versus):
        low, high = figure["interval_95"]
        assert low <= figure["point"] <= high and low < high
    # The larger change is measured further from zero: its interval lies wholly below the small one's.
    assert ort["interval_95"][1] < int8["interval_95"][0]
    assert versus["interval_95"][0] > 0  # int8 drops less than ORT here, beyond sampling
    assert table(report)[2] == "| accuracy | bertforge int8 - bertforge fp32 | -1.00 | " \
        f"[{100 * int8['interval_95'][0]:+.2f}, {100 * int8['interval_95'][1]:+.2f}] |"


def test_paired_intervals_same_seed_same_intervals():
    gold = ["a", "b"] * 30
    systems = {"bertforge fp32": results_of(gold), "bertforge int8": results_of(["a"] * 60)}
    first = paired_intervals(evaluation_of(gold), systems, resamples=50, seed=3)
    assert first == paired_intervals(evaluation_of(gold), systems, resamples=50, seed=3)


def test_system_results_scores_as_evaluate(tiny_minilm_model, tmp_path):
    values = {"model": str(tiny_minilm_model), "out_dir": str(tmp_path / "stsb"), "progress": False, "batch_size": 4,
              "steps": 2, "device": "cpu", "max_seq_length": 48, "lr": 1e-3, "dev": "", "evaluate_test": False,
              "task": "stsb", "data_root": str(FIXTURES)}
    model = run_finetuning(load_finetune_config(values=finetune_values(**values))).model_dir
    data = FIXTURES / "glue" / "STS-B" / "dev.tsv"
    evaluation, results = system_results(model, data, threads=1, batch_size=8, limit=None)
    assert set(results) == {"bertforge fp32", "bertforge int8", "bertforge bf16", "ORT int8", "ORT int8 per-channel"}
    report = paired_intervals(evaluation, results, resamples=20, seed=0)
    for precision in ("fp32", "int8"):
        expected = evaluate(model, data, out_dir=tmp_path / precision, device="cpu", precision=precision)
        assert report["scores"][f"bertforge {precision}"] == pytest.approx(expected.metrics, abs=1e-12)
    assert set(report["differences"]) == {"pearson", "spearman"}
