"""The accuracy budget's intervals script: every system of the budget decodes the same examples through
`bertforge evaluate`'s path, and the point scores are what `bertforge evaluate` reports at each precision."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertforge.evaluation.saved_model import evaluate
from bertforge.training.finetune import run_finetuning
from bertforge.training.finetune_config import load_finetune_config
from conftest import finetune_values

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from benchmarks.accuracy_intervals import budget_changes, system_results, table  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_system_results_scores_as_evaluate(tiny_minilm_model, tmp_path):
    values = {"model": str(tiny_minilm_model), "out_dir": str(tmp_path / "stsb"), "progress": False, "batch_size": 4,
              "steps": 2, "device": "cpu", "max_seq_length": 48, "lr": 1e-3, "dev": "", "evaluate_test": False,
              "task": "stsb", "data_root": str(FIXTURES)}
    model = run_finetuning(load_finetune_config(values=finetune_values(**values))).model_dir
    data = FIXTURES / "glue" / "STS-B" / "dev.tsv"
    evaluation, results = system_results(model, data, threads=1, batch_size=8, limit=None)
    assert set(results) == {"bertforge fp32", "bertforge int8", "bertforge bf16", "ORT int8", "ORT int8 per-channel"}
    report = budget_changes(evaluation, results, resamples=20, seed=0)
    for precision in ("fp32", "int8"):
        expected = evaluate(model, data, out_dir=tmp_path / precision, device="cpu", precision=precision)
        assert report["scores"][f"bertforge {precision}"] == pytest.approx(expected.metrics, abs=1e-12)
    assert set(report["changes"]) == {"pearson", "spearman"}
    assert set(report["changes"]["spearman"]) == {
        "bertforge int8 - bertforge fp32", "bertforge bf16 - bertforge fp32", "ORT int8 - bertforge fp32",
        "ORT int8 per-channel - bertforge fp32", "bertforge int8 - ORT int8", "bertforge int8 - ORT int8 per-channel"}
    assert len(table(report)) == 2 + 2 * 6
