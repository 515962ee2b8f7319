"""`bertforge evaluate --precision P --against Q`: the model scored at both precisions on the same examples, each
metric's change with its paired-bootstrap interval in metrics.json and on the terminal; the figures are those
of two plain `evaluate` runs; a comparison that cannot be made is refused before any model runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.cli import main
from bertforge.evaluation import saved_model
from bertforge.evaluation.saved_model import evaluate
from bertforge.training.finetune import run_finetuning
from bertforge.training.finetune_config import load_finetune_config
from conftest import finetune_values

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STSB = FIXTURES / "glue" / "STS-B" / "dev.tsv"


@pytest.fixture(scope="module")
def stsb_model(tiny_minilm_model, tmp_path_factory) -> Path:
    values = {"model": str(tiny_minilm_model), "out_dir": str(tmp_path_factory.mktemp("stsb") / "run"),
              "progress": False, "batch_size": 4, "steps": 2, "device": "cpu", "max_seq_length": 48, "lr": 1e-3,
              "dev": "", "evaluate_test": False, "task": "stsb", "data_root": str(FIXTURES)}
    return run_finetuning(load_finetune_config(values=finetune_values(**values))).model_dir


def test_evaluate_against_reports_the_change_of_two_plain_runs(stsb_model, tmp_path, capsys):
    code = main(["evaluate", "--model", str(stsb_model), "--data", str(STSB), "--precision", "int8", "--against",
                 "fp32", "--resamples", "60", "--device", "cpu", "--out", str(tmp_path / "int8")])
    assert code == 0
    written = json.loads((tmp_path / "int8" / "metrics.json").read_text())
    against = written["details"]["against"]
    int8 = evaluate(stsb_model, STSB, out_dir=tmp_path / "plain-int8", device="cpu", precision="int8").metrics
    fp32 = evaluate(stsb_model, STSB, out_dir=tmp_path / "plain-fp32", device="cpu", precision="fp32").metrics
    assert written["precision"] == "int8" and written["metrics"] == int8
    assert against["precision"] == "fp32" and against["metrics"] == pytest.approx(fp32, abs=1e-12)
    assert against["resamples"] == 60 and set(against["changes"]) == {"pearson", "spearman"}
    for metric, change in against["changes"].items():
        assert change["point"] == pytest.approx(int8[metric] - fp32[metric], abs=1e-12)
        low, high = change["interval_95"]
        assert low <= change["point"] <= high
    printed = capsys.readouterr().out
    spearman = against["changes"]["spearman"]
    assert (f"spearman: {int8['spearman']:.4f}  (fp32: {fp32['spearman']:.4f}; change {spearman['point']:+.4f}, "
            f"95% interval [{spearman['interval_95'][0]:+.4f}, {spearman['interval_95'][1]:+.4f}])") in printed


@pytest.mark.parametrize("flags, message", [
    (["--precision", "fp32", "--against", "fp32"], "--against fp32 names the precision being scored"),
    (["--precision", "int8", "--against", "fp32", "--unlabelled"], "--against compares metrics, which need labels"),
    (["--precision", "int8", "--against", "fp32", "--resamples", "0"], "--resamples must be at least 1"),
])
def test_evaluate_against_refuses_before_any_model_runs(stsb_model, tmp_path, capsys, monkeypatch, flags, message):
    monkeypatch.setattr(saved_model, "prepare_evaluation", lambda *a, **k: pytest.fail("read the data"))
    code = main(["evaluate", "--model", str(stsb_model), "--data", str(STSB), "--device", "cpu", *flags,
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()
