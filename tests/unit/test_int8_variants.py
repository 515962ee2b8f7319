"""The int8 variants script: each variant is built as it says, and its `int8` is bertforge's own int8 (the score
`bertforge evaluate --precision int8` reports)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.int8_variants import main, variant_model
from torch import nn

from bertforge.engine.int8 import Int8Linear
from bertforge.evaluation.saved_model import evaluate, prepare_evaluation
from bertforge.training.finetune import run_finetuning
from bertforge.training.finetune_config import load_finetune_config
from conftest import finetune_values

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DATA = FIXTURES / "glue" / "STS-B" / "dev.tsv"


@pytest.fixture(scope="module")
def stsb_model(tiny_minilm_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("variants") / "stsb"
    values = {"model": str(tiny_minilm_model), "out_dir": str(out), "progress": False, "batch_size": 4, "steps": 2,
              "device": "cpu", "max_seq_length": 48, "lr": 1e-3, "dev": "", "evaluate_test": False, "task": "stsb",
              "data_root": str(FIXTURES)}
    return run_finetuning(load_finetune_config(values=finetune_values(**values))).model_dir


def kinds(model: nn.Module) -> dict[str, str]:
    """Projection name -> "float", "per tensor" or "per token", over every layer (one answer each)."""
    found: dict[str, set[str]] = {}
    for name, module in model.named_modules():
        owner, _, last = name.rpartition(".")
        if owner.endswith(".attention") and last in ("qkv", "output") or owner.endswith(".feed_forward") and last in (
                "up", "down"):
            if isinstance(module, Int8Linear):
                found.setdefault(last, set()).add("per token" if module.per_token else "per tensor")
            elif isinstance(module, nn.Linear):
                found.setdefault(last, set()).add("float")
    assert all(len(answers) == 1 for answers in found.values()), found
    return {name: answers.pop() for name, answers in found.items()}


def test_variant_model_builds_each_variant(stsb_model):
    prepared = prepare_evaluation(stsb_model, DATA, batch_size=8, device="cpu")
    assert kinds(variant_model(prepared, "int8")) == {"qkv": "per tensor", "output": "per tensor", "up": "per tensor",
                                                      "down": "per token"}
    assert set(kinds(variant_model(prepared, "per-tensor")).values()) == {"per tensor"}
    assert set(kinds(variant_model(prepared, "per-token")).values()) == {"per token"}
    assert kinds(variant_model(prepared, "fp32-qkv"))["qkv"] == "float"
    assert kinds(variant_model(prepared, "fp32-down")) == {"qkv": "per tensor", "output": "per tensor",
                                                           "up": "per tensor", "down": "float"}
    with pytest.raises(ValueError, match="unknown variant"):
        variant_model(prepared, "int4")


def test_int8_variant_scores_as_evaluate(stsb_model, tmp_path):
    out = tmp_path / "variants.json"
    main(["--model", str(stsb_model), "--data", str(DATA), "--variants", "int8", "fp32-down", "--resamples", "5",
          "--threads", "1", "--batch-size", "8", "--out", str(out)])
    report = json.loads(out.read_text())
    for precision, system in (("fp32", "fp32"), ("int8", "int8")):
        expected = evaluate(stsb_model, DATA, out_dir=tmp_path / precision, device="cpu", precision=precision)
        assert report["scores"][system] == pytest.approx(expected.metrics, abs=1e-12)
    assert set(report["changes"]["spearman"]) == {"int8 - fp32", "fp32-down - fp32"}
