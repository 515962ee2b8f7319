"""Does the ONNX Runtime engine cost anything? `bertforge evaluate --engine onnxruntime` against a raw ONNX Runtime
`InferenceSession` on the same graph file, in the same run, at the same thread counts.

Accuracy: `evaluation.saved_model.evaluate` (what the `evaluate` command runs) with the engine at a precision, at
evaluate's batch size and at batch size 1, against the raw session's argmax at batch 1 over the same features (the
data read and tokenized by evaluate's path once; the raw side then runs `session.run` on numpy arrays and compares
with the features' labels: no bertforge code between the ids and the answer). Dynamic int8 quantizes a call's
activations with one range, padding included, so a padded batch may decide an example otherwise than batch 1.

Batch-1 latency, per call over every feature of the file, one feature per call (no padding), median of the
repeats:
- raw: `session.run` on prepared numpy arrays;
- engine: the engine called as a family calls it (tensors in, the model's fields out); raw and engine run each
  feature back to back (the order swapped from feature to feature), so both see the same moment of a busy
  machine, and the engine's ratio is also given as the median of each repeat's paired ratio;
- loop: `Evaluation.outputs` at batch size 1, a pass of its own after each paired pass: evaluate's whole model
  loop (batching, the family's forward and its output handling, the engine) without the decoding and metrics.
ONNX Runtime runs with the plan's intra-op threads and one inter-op thread on both sides (the engine's
session and the raw one are made the same way); torch gets the same count. The load average is reported.

    python -m benchmarks.ort_engine --model runs/budget/sst2/best --data ../shared/data/glue/SST-2/dev.tsv \
        --precision int8 --threads 1 --repeats 5 --out benchmarks/results/ort_engine.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from bertforge.checkpoint_format import read_directory
from bertforge.engine.build import build_engine, plan_engine
from bertforge.evaluation.saved_model import evaluate, prepare_evaluation
from bertforge.families import registry
from bertforge.storage import write_json


def raw_session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def feeds_of(features) -> list[dict[str, np.ndarray]]:
    """One batch-1 feed per feature: int64 [1, T] ids, token types and an all-ones mask."""
    out = []
    for f in features:
        ids = np.asarray([f.input_ids], dtype=np.int64)
        out.append({"input_ids": ids, "token_type_ids": np.asarray([f.token_type_ids], dtype=np.int64),
                    "attention_mask": np.ones_like(ids)})
    return out


def raw_accuracy(session: ort.InferenceSession, features, feeds) -> float:
    """Share of features whose argmax of the raw session's logits is the feature's label."""
    right = 0
    for feature, feed in zip(features, feeds):
        logits = session.run(["logits"], feed)[0]
        right += int(logits[0].argmax()) == feature.label
    return right / len(features)


def paired_pass(session, engine, feeds, tensors, engine_first: bool) -> tuple[float, float]:
    """One pass over every feature at batch 1, each feature run by the raw session and by the engine back to
    back (in the order given, swapped per feature): the two see the same moment of a busy machine. Seconds per
    call: (raw, engine)."""
    raw = eng = 0.0
    with engine.running():
        for i, (feed, tensor) in enumerate(zip(feeds, tensors)):
            for system in ((1, 0) if (i % 2 == 0) == engine_first else (0, 1)):
                began = time.perf_counter()
                if system == 0:
                    session.run(["logits"], feed)
                    raw += time.perf_counter() - began
                else:
                    _ = engine(tensor["input_ids"], tensor["token_type_ids"], tensor["attention_mask"]).logits
                    eng += time.perf_counter() - began
    return raw / len(feeds), eng / len(feeds)


def loop_pass(evaluation) -> float:
    """evaluate's model loop over every feature at batch 1 (`Evaluation.outputs`): seconds per call."""
    def run(engine) -> float:
        began = time.perf_counter()
        evaluation.outputs(engine)
        return (time.perf_counter() - began) / len(evaluation.features)
    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a fine-tuned classifier directory (bertforge finetune)")
    parser.add_argument("--data", required=True, help="its labelled dev file, as `bertforge evaluate --data`")
    parser.add_argument("--precision", default="int8", choices=["fp32", "int8"])
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (and torch's)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--limit", type=int, help="the first N examples only (a quick run)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load_before = os.getloadavg()

    # The command's figure: evaluate with the engine (exports the graph into the model's cache, or reuses it).
    scored = evaluate(args.model, args.data, out_dir=None, device="cpu", engine="onnxruntime",
                      precision=args.precision, threads=args.threads, limit=args.limit)
    # The same engine and the same cached graph, for the timing; the raw session opens that file.
    model, _ = registry.load_model(read_directory(args.model), device="cpu")
    engine = build_engine(model, plan_engine("cpu", args.precision, "onnxruntime", args.threads), args.model)
    engine.prepare(registry.for_model(model))
    described = engine.describe()
    graph = Path(described["graphs"]["model"]["file"])
    session = raw_session(graph, args.threads)
    prepared = prepare_evaluation(args.model, args.data, batch_size=1, precision=args.precision, limit=args.limit)
    features = prepared.evaluation.features
    feeds = feeds_of(features)
    raw = raw_accuracy(session, features, feeds)
    # evaluate's path at batch 1 (no padding: what the raw side runs); dynamic int8 quantizes each call's
    # activations with one range, padding included, so a padded batch of 64 may decide an example otherwise.
    batch1 = prepared.evaluation(engine).metrics["accuracy"]

    tensors = [{name: torch.from_numpy(value) for name, value in feed.items()} for feed in feeds]
    loop = loop_pass(prepared.evaluation)
    paired_pass(session, engine, feeds, tensors, True)  # warm-up: every length once, on both sides
    loop(engine)
    seconds: dict[str, list[float]] = {"raw onnxruntime": [], "engine call": [], "evaluate loop": []}
    for repeat in range(args.repeats):
        raw_s, engine_s = paired_pass(session, engine, feeds, tensors, engine_first=repeat % 2 == 1)
        seconds["raw onnxruntime"].append(raw_s)
        seconds["engine call"].append(engine_s)
        seconds["evaluate loop"].append(loop(engine))
    median = {name: statistics.median(times) * 1e3 for name, times in seconds.items()}
    # The ratio of each repeat's pair (same moment of the machine), then the median over repeats.
    paired = statistics.median(e / r for e, r in zip(seconds["engine call"], seconds["raw onnxruntime"]))
    metric = "accuracy"
    out = {
        "started": started, "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "model": args.model, "data": args.data, "precision": args.precision, "examples": len(prepared.evaluation.examples),
        "features": len(features), "graph": str(graph), "engine": described,
        "threads": {"onnxruntime_intra_op": args.threads, "onnxruntime_inter_op": 1, "torch": torch.get_num_threads()},
        "accuracy": {"bertforge evaluate --engine onnxruntime": scored.metrics[metric],
                     "bertforge evaluate --engine onnxruntime --batch-size 1": batch1, "raw onnxruntime batch 1": raw},
        "batch1_ms_median": median, "batch1_ms_all": {k: [t * 1e3 for t in v] for k, v in seconds.items()},
        "ratio_to_raw": {name: median[name] / median["raw onnxruntime"] for name in median},
        "engine_to_raw_paired_median": paired,
        "repeats": args.repeats, "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "onnxruntime": ort.__version__, "torch": torch.__version__,
    }
    print(f"{args.precision}: accuracy evaluate --engine onnxruntime {scored.metrics[metric]:.4f} (batch size 64), "
          f"{batch1:.4f} at --batch-size 1; raw onnxruntime at batch 1 {raw:.4f} ({len(features)} examples)")
    print(f"batch-1 ms per call (median of {args.repeats} interleaved passes over {len(feeds)} features): "
          + ", ".join(f"{name} {ms:.3f} ({out['ratio_to_raw'][name]:.3f}x raw)" for name, ms in median.items())
          + f"; engine / raw per repeat, median {paired:.3f}")
    print(f"threads: onnxruntime intra-op {args.threads}, inter-op 1, torch {torch.get_num_threads()}; "
          f"load average before {load_before}, after {out['load_average_after']}")
    if args.out:
        write_json(args.out, out)
    print(json.dumps({k: out[k] for k in ("accuracy", "batch1_ms_median", "ratio_to_raw",
                                          "engine_to_raw_paired_median")}))


if __name__ == "__main__":
    main()
