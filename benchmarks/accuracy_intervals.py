"""Paired-bootstrap intervals for the int8/bf16 accuracy budget (docs/cpu_inference.md, "Accuracy budget").

A dev set is a sample: a change of 0.1 point between fp32 and int8 may be a few examples that flipped either
way. This scores one fine-tuned model on one data file with every system of the budget — bertforge fp32, int8
and bf16, ONNX Runtime int8 (`quantize_dynamic`'s defaults and the per-channel graph of `bertforge export
--quantize int8`) — through `bertforge evaluate`'s own path (`prepare_evaluation`, the family's features,
decoder and `score`; ONNX Runtime replaces only the model, as in `benchmarks/ort_int8_accuracy.py`). Then it
draws B resamples of the examples with replacement, the same resample for every system (paired), scores each
system on each resample with the family's `score` (`bertforge.evaluation.intervals`, which `bertforge evaluate
--against` uses too), and reports for every metric:

* each system's change against fp32, with the 2.5th and 97.5th percentiles of the resampled changes (a 95%
  interval: an interval that holds 0 is a change the dev set cannot tell from sampling);
* bertforge int8's score minus each ONNX Runtime int8's — the budget's comparison ("a drop no larger than
  ONNX Runtime's") as one figure with its interval.

    python -m benchmarks.accuracy_intervals --model runs/budget/squad/best \\
        --data runs/budget/squad/dev-eval-articles.json --out runs/budget/intervals/squad.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.ort_int8_accuracy import ort_engines
from benchmarks.scoring_args import add_scoring_arguments, check_scoring_arguments, table
from bertforge.engine.build import build_engine, plan_engine
from bertforge.evaluation.intervals import paired_changes
from bertforge.evaluation.saved_model import prepare_evaluation
from bertforge.families import registry
from bertforge.storage import write_json

PRECISIONS = ("fp32", "int8", "bf16")
REFERENCE = "bertforge fp32"
INT8 = "bertforge int8"


def system_results(model_dir, data_file, *, threads: int, batch_size: int, limit: int | None):
    """(the fp32 evaluation, {system: one decoded result per example}) for every system of the budget."""
    results: dict[str, list] = {}
    prepared = prepare_evaluation(model_dir, data_file, batch_size=batch_size, device="cpu", limit=limit)
    reference = prepared.evaluation
    for precision in PRECISIONS:
        model, _ = registry.load_model(prepared.directory, prepared.family.model_class, device="cpu")
        evaluation = reference.at_precision(precision)
        results[f"bertforge {precision}"] = evaluation.results(build_engine(model, plan_engine("cpu", precision)))
    with tempfile.TemporaryDirectory() as tmp:
        for name, engine in ort_engines(model_dir, Path(tmp), threads).items():
            if name != "ORT fp32":  # equal to bertforge fp32 on every budget task (docs); not needed here
                results[name] = reference.at_precision(engine.plan.precision).results(engine)
    return reference, results


def budget_changes(evaluation, results: dict[str, list], *, resamples: int, seed: int) -> dict:
    """Point scores, each system's change against fp32, and int8 minus each ORT int8, with 95% intervals."""
    comparisons = [(name, REFERENCE) for name in results if name != REFERENCE]
    comparisons += [(INT8, name) for name in results if name.startswith("ORT")]
    return paired_changes(evaluation, results, comparisons, resamples=resamples, seed=seed)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_scoring_arguments(parser)
    args = parser.parse_args(argv)
    check_scoring_arguments(parser, args)
    torch.set_num_threads(args.threads)
    started = time.time()
    evaluation, results = system_results(args.model, args.data, threads=args.threads, batch_size=args.batch_size,
                                         limit=args.limit)
    decoded = time.time()
    report = budget_changes(evaluation, results, resamples=args.resamples, seed=args.seed)
    out = {"model": args.model, "data": args.data, "examples": len(evaluation.examples),
           "resamples": args.resamples, "seed": args.seed,
           "seconds": {"decode": decoded - started, "bootstrap": time.time() - decoded}, **report}
    if args.out:
        write_json(args.out, out)
    print(json.dumps(out["scores"]))
    print("\n".join(table(report)))


if __name__ == "__main__":
    main()
