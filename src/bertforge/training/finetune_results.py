"""What a fine-tuning run reports (`FinetuneResult`, `SeedsResult`), the evaluation log the loop carries
through checkpoints, and reading back the results of a run that already finished (row 4)."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertforge.training.checkpoint import checkpoint_step, resolve_resume, stopped_early
from bertforge.training.config import TrainingConfig

log = logging.getLogger("bertforge.finetuning")


@dataclass
class FinetuneResult:
    """What a run reports.

    Attributes:
        task: task (or format) name. metric: the metric that picked the best checkpoint.
        best_metrics: the dev metrics of the best evaluation ({} without a dev set).
        best_step: optimizer step of the best evaluation.
        history: every evaluation: {"step", "epoch", "metrics"}.
        model_dir: the saved best model (an artifact).
        out_dir: the run directory (metrics.jsonl, eval_results.json, dev_predictions.jsonl).
        data_report: counts of skipped/repaired/windowed inputs (see `DataReport`).
        warnings: e.g. prediction collapse, per evaluation.
        seconds: wall time of the run. seed: the seed.
        train_examples, dev_examples: how many were used.
        test_metrics: the best model's metrics on the task's test split, where it has one (MSRA NER).
        total_steps: the run's length in optimizer steps.
        resumed: what `training.resume` did, in words ("" for resume=never): the checkpoint and step it
            continued from, that it started fresh and why, or that the run was already complete.
        stopped_early: the run ended before total_steps because the dev metric stopped improving
            (`training.patience`).
    """

    task: str
    metric: str
    best_metrics: dict[str, float]
    best_step: int
    history: list[dict[str, Any]]
    model_dir: Path
    out_dir: Path
    data_report: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    seed: int = 0
    train_examples: int = 0
    dev_examples: int = 0
    test_metrics: dict[str, float] = field(default_factory=dict)
    total_steps: int = 0
    resumed: str = ""
    stopped_early: bool = False

    def summary(self) -> dict[str, Any]:
        """eval_results.json's fields (the run's config is added by the run)."""
        return {"task": self.task, "metric": self.metric, "best_metrics": self.best_metrics,
                "best_step": self.best_step, "total_steps": self.total_steps, "history": self.history,
                "stopped_early": self.stopped_early, "test_metrics": self.test_metrics,
                "data_report": self.data_report, "warnings": self.warnings, "seed": self.seed,
                "seconds": self.seconds, "train_examples": self.train_examples, "dev_examples": self.dev_examples}


class EvaluationLog:
    """The run's evaluations and their warnings; the loop carries it in every checkpoint (`extra_state`), so
    a resumed run reports the evaluations made before the interruption too."""

    def __init__(self) -> None:
        self.history: list[dict[str, Any]] = []
        self.warnings: list[str] = []

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history, "warnings": self.warnings}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.history[:] = list(state.get("history", []))
        self.warnings[:] = list(state.get("warnings", []))


def resume_note(resume: str, out_dir: Path, outcome) -> str:
    """What `training.resume` did, in words (the loop's TrainResult says where it started)."""
    if outcome.resumed_from is not None:
        return f"resumed from {outcome.resumed_from} (step {outcome.start_step} of {outcome.total_steps})"
    if resume == "auto":
        return f"resume auto: no checkpoint in {out_dir}, started a fresh run"
    return ""


def finished_run(settings: TrainingConfig, total_steps: int) -> FinetuneResult | None:
    """With `training.resume` auto (or a checkpoint) on a run that already reached `total_steps` and wrote its
    eval_results.json: that run's result, read back; nothing is trained, evaluated or rewritten. None otherwise
    (a run to start or continue)."""
    out_dir = Path(settings.out_dir)
    results = out_dir / "eval_results.json"
    if settings.resume == "never" or not results.is_file():
        return None
    checkpoint = resolve_resume(settings.resume, out_dir)
    if checkpoint is None or (checkpoint_step(checkpoint) < total_steps and not stopped_early(checkpoint)):
        return None
    try:
        stored = json.loads(results.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("total_steps") != total_steps:
        return None
    step = checkpoint_step(checkpoint)
    note = (f"already complete: {checkpoint} is step {step} of {total_steps}; nothing trained, the results in "
            f"{results} are kept")
    log.info("%s", note)
    return FinetuneResult(stored.get("task", ""), stored.get("metric", ""), dict(stored.get("best_metrics") or {}),
                          int(stored.get("best_step") or step), list(stored.get("history") or []), out_dir / "best",
                          out_dir, dict(stored.get("data_report") or {}), list(stored.get("warnings") or []),
                          float(stored.get("seconds") or 0.0), int(stored.get("seed", settings.seed)),
                          int(stored.get("train_examples") or 0), int(stored.get("dev_examples") or 0),
                          dict(stored.get("test_metrics") or {}), total_steps, note,
                          bool(stored.get("stopped_early", False)))


@dataclass
class SeedsResult:
    """Several runs of one configuration: per-seed results and, per metric, mean, std (n-1), min, max."""

    task: str
    metric: str
    seeds: list[int]
    runs: list[FinetuneResult]
    summary: dict[str, dict[str, float]]
    out_dir: Path

    def line(self) -> str:
        """e.g. "sst2 accuracy: 0.9123 ± 0.0041 over 5 seeds (min 0.9060, max 0.9163)"."""
        stats = self.summary.get(self.metric, {})
        return (f"{self.task} {self.metric}: {stats.get('mean', float('nan')):.4f} ± {stats.get('std', 0.0):.4f} "
                f"over {len(self.seeds)} seeds (min {stats.get('min', float('nan')):.4f}, "
                f"max {stats.get('max', float('nan')):.4f})")


def summarize(values: Sequence[float]) -> dict[str, float]:
    """mean, sample std (n-1; 0 for one value), min, max, n."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": n}
