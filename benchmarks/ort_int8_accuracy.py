"""ONNX Runtime's dynamic int8 on a fine-tuned bertforge model, scored exactly as `bertforge evaluate` scores it:
the comparison column of the int8 accuracy budget (docs/cpu_inference.md).

Every task family `bertforge evaluate` handles works (classification and regression, sentence pairs, tagging,
extractive QA): the data is read, windowed and decoded, and the metrics computed, by the evaluation path
itself (`evaluation.saved_model.prepare_evaluation` -> `family.features` -> `evaluation.runner.Evaluation`),
and the model runs in ONNX Runtime through the engine `bertforge evaluate --engine onnxruntime` builds
(`engine.onnxruntime.OrtEngine`). So the ORT figures differ from `bertforge evaluate --precision P` in the
runtime only.

The graphs: our export through ONNX Runtime's BERT optimizer, parity-checked against PyTorch at 1e-4 (the
engine's fp32 graph: "ORT fp32"); `bertforge export --optimize --quantize int8`'s graph, ONNX Runtime's dynamic
quantizer with per-channel weight scales (the engine's int8 graph: "ORT int8 per-channel"); and
`onnxruntime.quantization.quantize_dynamic` of the fp32 graph with its defaults (QInt8 weights, one scale per
tensor), what a CPU user does with ONNX Runtime by hand ("ORT int8", run by the same engine on that file,
`OrtEngine.on_graph`).

    python -m benchmarks.ort_int8_accuracy --model runs/stsb/best --data ../shared/data/glue/STS-B/dev.tsv \
        --threads 1 --out runs/stsb/ort.json

The engine keeps its graphs in the user cache (`~/.cache/bertforge/onnx`, `$BERTFORGE_CACHE`): a second run
exports nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from bertforge.checkpoint_format import read_directory
from bertforge.engine.build import build_engine, plan_engine
from bertforge.engine.onnxruntime import OrtEngine
from bertforge.evaluation.runner import EvalResult, Evaluation
from bertforge.evaluation.saved_model import prepare_evaluation
from bertforge.families import registry
from bertforge.storage import write_json

SYSTEMS = ("ORT fp32", "ORT int8", "ORT int8 per-channel")


def evaluation_for(model_dir: str | os.PathLike, data_file: str | os.PathLike, batch_size: int = 64,
                   limit: int | None = None) -> tuple[Evaluation, dict]:
    """The evaluation `bertforge evaluate MODEL DATA` runs (`evaluation.saved_model.prepare_evaluation`), on
    the CPU at fp32, and the data report's counts."""
    prepared = prepare_evaluation(model_dir, data_file, batch_size=batch_size, limit=limit)
    return prepared.evaluation, prepared.report.to_dict().get("counts", {})


def ort_engines(model_dir: str | os.PathLike, work: Path, threads: int) -> dict[str, OrtEngine]:
    """System name -> the ONNX Runtime engine that runs it (`bertforge evaluate --engine onnxruntime`'s, built
    as `evaluation.saved_model.load_engine` builds it; "ORT int8": the fp32 engine's graph quantized by
    `quantize_dynamic` with its defaults, into `work`)."""
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model, _ = registry.load_model(read_directory(model_dir), device="cpu")
    family = registry.for_model(model)
    engines = {}
    for name, precision in (("ORT fp32", "fp32"), ("ORT int8 per-channel", "int8")):
        engines[name] = build_engine(model, plan_engine("cpu", precision, "onnxruntime", threads), model_dir)
        engines[name].prepare(family)
    default = work / "model.int8-default.onnx"
    # ONNX's shape inference does not know the fused com.microsoft operators: their outputs are float32.
    quantize_dynamic(str(engines["ORT fp32"].graph.path), str(default), weight_type=QuantType.QInt8,
                     extra_options={"DefaultTensorType": TensorProto.FLOAT})
    engines["ORT int8"] = engines["ORT int8 per-channel"].on_graph(default)
    return {name: engines[name] for name in SYSTEMS}


def score(evaluation: Evaluation, model: torch.nn.Module) -> tuple[EvalResult, float]:
    start = time.perf_counter()
    result = evaluation(model)
    return result, time.perf_counter() - start


def ort_accuracy(model_dir: str | os.PathLike, data_file: str | os.PathLike, *, threads: int = 1,
                 batch_size: int = 64, torch_fp32: bool = False, limit: int | None = None,
                 keep_predictions: bool = False) -> dict:
    """Metrics of each ORT system (and, with `torch_fp32`, of the PyTorch model at fp32 on the same path: it
    must equal `bertforge evaluate --precision fp32`) on `data_file`, plus what was run; with
    `keep_predictions` also each system's prediction records (`predictions.jsonl`'s)."""
    evaluation, counts = evaluation_for(model_dir, data_file, batch_size, limit)
    out: dict = {"model": os.fspath(model_dir), "data": os.fspath(data_file), "threads": threads,
                 "examples": len(evaluation.examples), "features": len(evaluation.features), "data_counts": counts,
                 "metrics": {}, "seconds": {}, "warnings": {}}
    predictions: dict[str, list[dict]] = {}
    if torch_fp32:
        model, _ = registry.load_model(read_directory(model_dir), device="cpu")
        result, out["seconds"]["bertforge fp32"] = score(evaluation, build_engine(model, plan_engine("cpu", "fp32")))
        out["metrics"]["bertforge fp32"], predictions["bertforge fp32"] = result.metrics, result.predictions
    with tempfile.TemporaryDirectory() as tmp:
        engines = ort_engines(model_dir, Path(tmp), threads)
        graph = engines["ORT fp32"].describe()["graphs"]["model"]
        out["export"] = {"fused": graph["fused"], "max_abs_diff_fp32_vs_pytorch": graph["max_abs_diff_fp32"],
                         "engines": {name: engine.describe() for name, engine in engines.items()}}
        for name, engine in engines.items():
            result, out["seconds"][name] = score(evaluation.at_precision(engine.plan.precision), engine)
            out["metrics"][name] = result.metrics
            out["warnings"][name] = result.warnings
            predictions[name] = result.predictions
    if keep_predictions:
        out["predictions"] = predictions
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a directory saved by `bertforge finetune`")
    parser.add_argument("--data", required=True, help="the file to score, as `bertforge evaluate --data` takes it")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (and torch's)")
    parser.add_argument("--batch-size", type=int, default=64, help="as `bertforge evaluate --batch-size`")
    parser.add_argument("--torch-fp32", action="store_true",
                        help="also score the PyTorch model at fp32 on the same path (a check of the path)")
    parser.add_argument("--limit", type=int, help="score only the first N examples (a quick run)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    out = {"started": started, **ort_accuracy(args.model, args.data, threads=args.threads,
                                              batch_size=args.batch_size,
                                              torch_fp32=args.torch_fp32, limit=args.limit),
           "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    if args.out:
        write_json(args.out, out)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
