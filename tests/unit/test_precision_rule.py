"""One precision rule for every path: `runtime.choose_precision` turns `auto` into bf16 on a CUDA device with
bf16 support and fp32 everywhere else (CPUs included), with no probe; evaluate, predict and serve all use it.
The GPU capability is monkeypatched, so these run on any machine."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from bertforge import runtime
from bertforge.cli import build_parser
from bertforge.errors import ConfigError
from bertforge.runtime import PRECISIONS, choose_precision, resolve_precision

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


def gpu_with_bf16(monkeypatch, supported: bool):
    """Patch the capability probe; the cached answer is forgotten before and after (`cuda_supports_bf16`)."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: supported)
    runtime._bf16_probe.cache_clear()
    yield
    runtime._bf16_probe.cache_clear()


@pytest.fixture
def bf16_gpu(monkeypatch):
    yield from gpu_with_bf16(monkeypatch, True)


@pytest.fixture
def old_gpu(monkeypatch):
    yield from gpu_with_bf16(monkeypatch, False)


def test_choose_precision_probes_the_gpu_once(monkeypatch):
    probes = []
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: probes.append(1) or True)
    runtime._bf16_probe.cache_clear()
    try:
        for _ in range(61):  # as many questions as one profiled `pretrain` asked
            assert resolve_precision("auto", CUDA) == "bf16"
            assert choose_precision("bf16", "cuda:0") == ("bf16", "requested")
    finally:
        runtime._bf16_probe.cache_clear()
    assert len(probes) == 1


def test_choose_precision_auto_on_a_bf16_gpu_is_bf16_without_a_probe(bf16_gpu):
    assert choose_precision("auto", CUDA) == ("bf16", "auto: bf16 on a CUDA device with bf16 support")
    assert resolve_precision("auto", "cuda:1") == "bf16"


def test_choose_precision_auto_on_a_gpu_without_bf16_is_fp32(old_gpu):
    precision, why = choose_precision("auto", CUDA)
    assert precision == "fp32" and why.startswith("auto: fp32")
    with pytest.raises(ConfigError, match="bf16 needs a GPU with bfloat16 support"):
        choose_precision("bf16", CUDA)
    assert choose_precision("fp16", CUDA) == ("fp16", "requested")


def test_choose_precision_auto_on_cpu_is_fp32_even_with_native_bf16(monkeypatch, bf16_gpu):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert choose_precision("auto", CPU) == ("fp32", "auto: fp32 (bf16 is chosen only on a CUDA device with bf16 "
                                                     "support; this is cpu)")
    assert choose_precision("bf16", CPU) == ("bf16", "requested")


def test_choose_precision_rejects_an_unknown_name_listing_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown precision 'half'; use one of auto, fp32, bf16, fp16"):
        choose_precision("half", CPU)


def subcommand(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


@pytest.mark.parametrize("command", ["evaluate", "predict", "serve", "embed", "pretrain", "finetune", "glue"])
def test_choose_precision_every_command_takes_the_same_names(command):
    action = subcommand(command)._option_string_actions["--precision"]
    # Commands that train take every name but the quantized ones (int8 is an inference precision).
    trains = command in ("pretrain", "finetune", "glue")
    expected = tuple(p for p in PRECISIONS if p not in runtime.QUANTIZED_PRECISIONS) if trains else PRECISIONS
    assert tuple(action.choices) == expected
    assert "auto = bf16 on a CUDA GPU with bf16 support, else fp32" in " ".join(action.help.split())


def test_choose_precision_int8_is_cpu_only():
    assert choose_precision("int8", CPU) == ("int8", "requested")
    with pytest.raises(ConfigError, match="int8 runs on the CPU only"):
        choose_precision("int8", CUDA)
    assert runtime.precision_dtype("int8") is torch.float32  # activations between the int8 matmuls


def save_classifier(directory: Path, encoder_dir: Path) -> Path:
    """A tiny random two-label classifier with the tiny MiniLM model's tokenizer and config."""
    from bertforge.checkpoint_format import read_directory
    from bertforge.families.classification import BertForSequenceClassification

    source = read_directory(encoder_dir)
    torch.manual_seed(0)
    config = source.config.replace(id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})
    BertForSequenceClassification(config).save_pretrained(directory, tokenizer=source.require_tokenizer())
    return directory


def test_choose_precision_int8_flows_into_evaluate(tmp_path, tiny_minilm_model: Path):
    """`evaluate --precision int8` scores the quantized model and records the precision it scored at."""
    import json

    from bertforge.engine.int8 import is_quantized
    from bertforge.evaluation import saved_model

    seen = []
    real = saved_model.Evaluation.__call__

    def spy(self, model):
        seen.append((self.precision, is_quantized(model)))
        return real(self, model)

    data = tmp_path / "dev.tsv"
    data.write_text("sentence\tlabel\ngood film\tpos\nbad film\tneg\n")
    model_dir = save_classifier(tmp_path / "clf", tiny_minilm_model)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(saved_model.Evaluation, "__call__", spy)
        saved_model.evaluate(model_dir, data, out_dir=tmp_path / "out", device="cpu", precision="int8",
                             overrides={"reader": {"text_a_column": "sentence", "label_column": "label"}})
    assert seen == [("int8", True)]
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["precision"] == "int8"


def test_choose_precision_is_what_evaluate_and_training_call():
    from bertforge.engine import build
    from bertforge.evaluation import saved_model
    from bertforge.inference import pipelines
    from bertforge.training import loop

    assert saved_model.plan_engine is build.plan_engine is pipelines.plan_engine  # which asks choose_precision
    assert loop.resolve_precision is runtime.resolve_precision


def test_choose_precision_is_what_the_pipelines_and_server_call(monkeypatch, tiny_minilm_model: Path):
    from bertforge.inference.pipelines import load_pipeline

    calls = []
    real = runtime.choose_precision
    monkeypatch.setattr(runtime, "choose_precision", lambda name, device: calls.append(name) or real(name, device))
    pipeline = load_pipeline(tiny_minilm_model, "embed", device="cpu", precision="auto")
    assert calls == ["auto"]
    assert pipeline.precision == "fp32" and pipeline.precision_report.startswith(real("auto", CPU)[1])
