"""Paired-bootstrap intervals (`evaluation.intervals`): a change no example carries has a zero interval, a
change carried by a few examples has an interval around it, a larger one lies further from zero, the same seed
gives the same intervals, and bad arguments are refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bertforge.evaluation.intervals import paired_changes


class AccuracyEvaluation:
    """The two things `paired_changes` asks of an `Evaluation`: its examples, and `score(results, rows=...)`
    (here accuracy of each result's label against its example's)."""

    def __init__(self, labels: list[str]):
        self.examples = [SimpleNamespace(label=label) for label in labels]

    def score(self, results, config=None, rows=None):
        rows = range(len(self.examples)) if rows is None else rows
        right = sum(self.examples[i].label == results[i]["label"] for i in rows)
        return {"accuracy": right / len(rows), "scheme": "n/a"}, {}, []


def labels(*runs: tuple[str, int]) -> list[dict]:
    return [{"label": label} for label, count in runs for _ in range(count)]


def test_paired_changes_zero_where_no_example_changes():
    gold = ["a", "b"] * 50
    fp32 = labels(*[(g, 1) for g in gold[:90]], ("b", 10))
    report = paired_changes(AccuracyEvaluation(gold), {"fp32": fp32, "int8": list(fp32)}, [("int8", "fp32")],
                            resamples=200)
    assert report["changes"] == {"accuracy": {"int8 - fp32": {"point": 0.0, "interval_95": [0.0, 0.0]}}}
    assert report["scores"]["int8"] == {"accuracy": 0.95}  # numbers only: the family's labels are left out


def test_paired_changes_cover_the_change_and_a_larger_one_lies_further_out():
    gold = ["a"] * 200
    systems = {"fp32": labels(("a", 200)), "int8": labels(("b", 2), ("a", 198)),  # 2 of 200 flipped: -1 point
               "other": labels(("b", 20), ("a", 180))}  # 20 flipped: -10 points
    report = paired_changes(AccuracyEvaluation(gold), systems, [("int8", "fp32"), ("other", "fp32"), ("int8", "other")],
                            resamples=300, seed=1)
    changes = report["changes"]["accuracy"]
    small, large, versus = changes["int8 - fp32"], changes["other - fp32"], changes["int8 - other"]
    assert small["point"] == pytest.approx(-0.01) and large["point"] == pytest.approx(-0.10)
    assert versus["point"] == pytest.approx(0.09)
    for figure in (small, large, versus):
        low, high = figure["interval_95"]
        assert low <= figure["point"] <= high and low < high
    assert large["interval_95"][1] < small["interval_95"][0]
    assert versus["interval_95"][0] > 0  # int8 loses less than "other", beyond what sampling makes


def test_paired_changes_same_seed_same_intervals():
    gold = ["a", "b"] * 30
    systems = {"fp32": labels(*[(g, 1) for g in gold]), "int8": labels(("a", 60))}
    first = paired_changes(AccuracyEvaluation(gold), systems, [("int8", "fp32")], resamples=50, seed=3)
    assert first == paired_changes(AccuracyEvaluation(gold), systems, [("int8", "fp32")], resamples=50, seed=3)
    assert first != paired_changes(AccuracyEvaluation(gold), systems, [("int8", "fp32")], resamples=50, seed=4)


def test_paired_changes_refuses_bad_arguments():
    evaluation = AccuracyEvaluation(["a", "b"])
    with pytest.raises(ValueError, match="resamples must be at least 1"):
        paired_changes(evaluation, {"x": labels(("a", 2))}, [], resamples=0)
    with pytest.raises(ValueError, match="int8: 1 results for 2 examples"):
        paired_changes(evaluation, {"fp32": labels(("a", 2)), "int8": labels(("a", 1))}, [("int8", "fp32")])
