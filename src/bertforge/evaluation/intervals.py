"""Paired-bootstrap intervals of a change in score: how far two ways of running a model (two precisions, two
runtimes) move a metric on the same examples, and how much of that move the choice of examples alone could
make.

A dev set is a sample. An int8 model that scores 0.1 point below fp32 on 872 sentences may have flipped one
sentence: the change is real for this file and says little about the next. Owned here: resampling the
examples with replacement (the same resample for every system: paired, so what both get right or wrong
cancels) and reading the changes' 2.5th and 97.5th percentiles, a 95% interval. An interval that holds 0 is a
change this data cannot tell from sampling. The metrics are the family's own (`Evaluation.score` on each
resample), so an interval is about exactly the figure `bertforge evaluate` reports.

Used by `bertforge evaluate --against PRECISION` and by the CPU accuracy budget
(benchmarks/accuracy_intervals.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

RESAMPLES = 1000  # the default: percentiles at 2.5 / 97.5 steady to about a tenth of a point on a few thousand examples


def numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics that are numbers (a family may report counts or labels beside them)."""
    return {name: float(value) for name, value in metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


def paired_changes(evaluation, results: Mapping[str, Sequence[dict]], comparisons: Sequence[tuple[str, str]], *,
                   resamples: int = RESAMPLES, seed: int = 0) -> dict[str, dict]:
    """Point scores of every system, and each comparison's change with its 95% paired-bootstrap interval.

    Args:
        evaluation: the `Evaluation` the results were decoded for (its examples and `score`).
        results: system name -> one decoded result per example of `evaluation` (`EvalResult.results`).
        comparisons: (a, b) pairs of system names; the change is a's score minus b's.
        resamples: how many resamples of the examples (at least 1); seed: the resampling's seed.

    Returns:
        {"scores": {system: {metric: value}},
         "changes": {metric: {"a - b": {"point": change, "interval_95": [low, high]}}}} for the metrics every
        system reports.
    """
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    count = len(evaluation.examples)
    for name, values in results.items():
        if len(values) != count:
            raise ValueError(f"{name}: {len(values)} results for {count} examples")
    point = {name: numeric(evaluation.score(values)[0]) for name, values in results.items()}
    metrics = [m for m in next(iter(point.values())) if all(m in scores for scores in point.values())]
    drawn = {(a, b): {m: np.empty(resamples) for m in metrics} for a, b in comparisons}
    generator = np.random.default_rng(seed)
    for k in range(resamples):
        rows = generator.integers(0, count, count)
        resampled = {name: numeric(evaluation.score(values, rows=rows)[0]) for name, values in results.items()}
        for (a, b), per_metric in drawn.items():
            for m in metrics:
                per_metric[m][k] = resampled[a][m] - resampled[b][m]
    changes = {m: {f"{a} - {b}": {"point": point[a][m] - point[b][m],
                                  "interval_95": [float(np.percentile(drawn[(a, b)][m], 2.5)),
                                                  float(np.percentile(drawn[(a, b)][m], 97.5))]}
                   for a, b in comparisons} for m in metrics}
    return {"scores": point, "changes": changes}


__all__ = ["RESAMPLES", "paired_changes"]
