"""ONNX Runtime's dynamic int8 on a fine-tuned bertforge model, scored exactly as `bertforge evaluate` scores it:
the comparison column of the int8 accuracy budget (docs/cpu_inference.md).

Every task family `bertforge evaluate` handles works (classification and regression, sentence pairs, tagging,
extractive QA): the data is read, windowed and decoded, and the metrics computed, by the evaluation path
itself (`families.task.task_of` -> `family.features` -> `evaluation.runner.Evaluation`); only the model is
replaced, by `OrtTaskModel`, a module whose forward runs an ONNX Runtime session and returns the outputs a
bertforge task model returns (`logits`, or `start_logits`/`end_logits`). So the ORT figures differ from
`bertforge evaluate --precision P` in the runtime only.

The graphs (the recipe of the SST-2 row): our export through ONNX Runtime's BERT optimizer
(`engine.onnx_graph.export_optimized`, parity-checked against PyTorch at 1e-4), then
`onnxruntime.quantization.quantize_dynamic` with its defaults (QInt8 weights, one scale per tensor) — what a
CPU user does with ONNX Runtime. `--per-channel` adds `bertforge export --optimize --quantize int8`'s graph
(the same quantizer with per-channel weight scales).

    python -m benchmarks.ort_int8_accuracy --model runs/stsb/best --data ../shared/data/glue/STS-B/dev.tsv \
        --threads 1 --out runs/stsb/ort.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from bertforge.checkpoint_format import read_directory
from bertforge.engine.build import build_engine, plan_engine
from bertforge.evaluation.runner import EvalResult, Evaluation
from bertforge.evaluation.saved_model import prepare_evaluation
from bertforge.families import registry
from bertforge.storage import write_json

# System name -> which graph of `export_graphs` it runs.
SYSTEMS = {"ORT fp32": "optimized", "ORT int8": "int8", "ORT int8 per-channel": "int8_per_channel"}


class OrtTaskModel(torch.nn.Module):
    """A task model whose forward runs an ONNX Runtime session on the batch's three int64 inputs and returns
    the session's outputs by name (`out.logits`, `out.start_logits`, ...), as the family's `forward` reads a
    bertforge task model's output. A CRF tagger's transition scores (decoded outside the graph) come from the
    PyTorch model (`crf`)."""

    def __init__(self, session, crf=None):
        super().__init__()
        self.session = session
        self.crf = crf
        self.inputs = {item.name for item in session.get_inputs()}
        self.outputs = [item.name for item in session.get_outputs()]
        # The evaluation path reads the device from the model's parameters; the session runs on the CPU.
        self.anchor = torch.nn.Parameter(torch.zeros(()), requires_grad=False)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, **_):
        feeds = {"input_ids": input_ids,
                 "token_type_ids": torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids,
                 "attention_mask": torch.ones_like(input_ids) if attention_mask is None else attention_mask}
        arrays = {name: value.cpu().numpy().astype(np.int64) for name, value in feeds.items() if name in self.inputs}
        values = self.session.run(self.outputs, arrays)
        return SimpleNamespace(**{name: torch.from_numpy(value) for name, value in zip(self.outputs, values)},
                               crf=self.crf)


def evaluation_for(model_dir: str | os.PathLike, data_file: str | os.PathLike, batch_size: int = 64,
                   limit: int | None = None) -> tuple[Evaluation, dict]:
    """The evaluation `bertforge evaluate MODEL DATA` runs (`evaluation.saved_model.prepare_evaluation`), on
    the CPU at fp32, and the data report's counts."""
    prepared = prepare_evaluation(model_dir, data_file, batch_size=batch_size, limit=limit)
    return prepared.evaluation, prepared.report.to_dict().get("counts", {})


def export_graphs(model_dir: str | os.PathLike, work: Path, per_channel: bool = False) -> tuple[dict[str, Path], dict]:
    """Our export, fused by ONNX Runtime's BERT optimizer (fp32), and its `quantize_dynamic` int8 graph with the
    quantizer's defaults (and, with `per_channel`, export --quantize int8's per-channel graph); the fused
    operator counts and fp32 parity of the export's report."""
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from bertforge.engine.onnx_graph import export_optimized

    result = export_optimized(model_dir, work / "model.onnx", quantize="int8" if per_channel else None,
                              speed_shape=None)
    graphs = {"optimized": result.optimized, "int8": work / "model.int8-default.onnx"}
    # ONNX's shape inference does not know the fused com.microsoft operators: their outputs are float32.
    quantize_dynamic(str(result.optimized), str(graphs["int8"]), weight_type=QuantType.QInt8,
                     extra_options={"DefaultTensorType": TensorProto.FLOAT})
    if per_channel:
        graphs["int8_per_channel"] = result.int8
    return graphs, {"fused": result.fused, "max_abs_diff_fp32_vs_pytorch": result.max_abs_diff}


def session(path: Path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def crf_scores(model_dir: str | os.PathLike):
    """A CRF tagger's scores from its PyTorch model (None for every other model)."""
    directory = read_directory(model_dir)
    if not getattr(directory.config, "use_crf", False):
        return None
    model, _ = registry.load_model(directory, device="cpu")
    with torch.no_grad():
        return model.eval().crf.scores()


def score(evaluation: Evaluation, model: torch.nn.Module) -> tuple[EvalResult, float]:
    start = time.perf_counter()
    result = evaluation(model)
    return result, time.perf_counter() - start


def ort_accuracy(model_dir: str | os.PathLike, data_file: str | os.PathLike, *, threads: int = 1,
                 batch_size: int = 64, per_channel: bool = False, torch_fp32: bool = False,
                 limit: int | None = None, keep_predictions: bool = False) -> dict:
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
    crf = crf_scores(model_dir)
    with tempfile.TemporaryDirectory() as tmp:
        graphs, out["export"] = export_graphs(model_dir, Path(tmp), per_channel)
        for name, graph in SYSTEMS.items():
            if graph in graphs:
                result, out["seconds"][name] = score(evaluation, OrtTaskModel(session(graphs[graph], threads), crf))
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
    parser.add_argument("--per-channel", action="store_true",
                        help="also the per-channel int8 graph of `bertforge export --optimize --quantize int8`")
    parser.add_argument("--torch-fp32", action="store_true",
                        help="also score the PyTorch model at fp32 on the same path (a check of the path)")
    parser.add_argument("--limit", type=int, help="score only the first N examples (a quick run)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    out = {"started": started, **ort_accuracy(args.model, args.data, threads=args.threads,
                                              batch_size=args.batch_size, per_channel=args.per_channel,
                                              torch_fp32=args.torch_fp32, limit=args.limit),
           "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    if args.out:
        write_json(args.out, out)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
