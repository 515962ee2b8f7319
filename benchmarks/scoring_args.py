"""What the scripts that score a fine-tuned model on `bertforge evaluate`'s path share: their command-line
arguments (`add_scoring_arguments`) and the markdown table of changes with paired intervals (`table`).
Used by benchmarks/accuracy_intervals.py and benchmarks/int8_variants.py."""

from __future__ import annotations

import argparse


def add_scoring_arguments(parser: argparse.ArgumentParser) -> None:
    """--model, --data, --resamples, --seed, --threads, --batch-size, --limit, --out."""
    parser.add_argument("--model", required=True, help="a directory saved by `bertforge finetune`")
    parser.add_argument("--data", required=True, help="the file to score, as `bertforge evaluate --data` takes it")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the resampling")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (torch, and ONNX Runtime's)")
    parser.add_argument("--batch-size", type=int, default=64, help="as `bertforge evaluate --batch-size`")
    parser.add_argument("--limit", type=int, help="score only the first N examples (a quick run)")
    parser.add_argument("--out", help="also write the JSON here")


def check_scoring_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.resamples < 1:
        parser.error("--resamples must be at least 1")


def table(report: dict) -> list[str]:
    """Markdown rows of `evaluation.intervals.paired_changes`' report: metric, comparison, point change and
    interval, in points (x100)."""
    lines = ["| metric | comparison | change (points) | 95% interval |", "|---|---|---|---|"]
    for metric, comparisons in report["changes"].items():
        for name, figure in comparisons.items():
            low, high = figure["interval_95"]
            lines.append(f"| {metric} | {name} | {100 * figure['point']:+.2f} | [{100 * low:+.2f}, {100 * high:+.2f}] |")
    return lines
