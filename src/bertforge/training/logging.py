"""Where training numbers go: `metrics.jsonl`, TensorBoard (when installed), the console and a progress bar.

`metrics.jsonl` holds one JSON object per log event — `{"step": 100, "split": "train", "time": ...,
"values": {"loss": ..., "loss_mlm": ..., "mlm_acc": ..., "lr": ...}}` — and is the record a run is judged by
(plots, docs, the resume test). Only the main process writes; the loop never calls these on other ranks.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from bertforge.storage import write_text

log = logging.getLogger("bertforge.training")

METRICS_NAME = "metrics.jsonl"


class MetricsLogger:
    """Appends log events to `out_dir/metrics.jsonl`, mirrors them to TensorBoard and the console.

    Args:
        out_dir: the run directory.
        tensorboard: write TensorBoard events under `out_dir/tensorboard` if the package is installed.
        console: also print each event through the `bertforge.training` logger.
    """

    def __init__(self, out_dir: str | os.PathLike, *, tensorboard: bool = True, console: bool = True):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / METRICS_NAME
        self.console = console
        self.handle = None
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                log.debug("tensorboard is not installed; metrics go to %s only", self.path)
            else:
                self.writer = SummaryWriter(str(self.out_dir / "tensorboard"))

    def start(self, resume_step: int | None) -> None:
        """Open the file: fresh for a new run; for a resumed one, keep only events up to `resume_step`.

        An interrupted run may have logged steps after its last checkpoint; the resumed run logs them
        again, so they are dropped to keep one event per (step, split).
        """
        kept: list[str] = []
        if resume_step is not None and self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    if json.loads(line)["step"] <= resume_step:
                        kept.append(line)
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a line cut short by a crash
        write_text(self.path, "".join(line + "\n" for line in kept))
        self.handle = open(self.path, "a", encoding="utf-8")

    def log(self, step: int, split: str, values: dict[str, float]) -> None:
        """Record one event: the values of `split` (`train`, `eval`, ...) after optimizer step `step`."""
        record = {"step": step, "split": split, "time": round(time.time(), 3),
                  "values": {k: json_number(v) for k, v in values.items()}}
        if self.handle is None:
            self.start(None)
        self.handle.write(json.dumps(record, sort_keys=False) + "\n")
        self.handle.flush()
        if self.writer is not None:
            for key, value in values.items():
                if isinstance(value, int | float) and math.isfinite(value):
                    self.writer.add_scalar(f"{split}/{key}", value, step)
        if self.console:
            log.info("step %d %s: %s", step, split, format_values(values))

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def json_number(value: Any) -> Any:
    """JSON has no NaN/inf: write them as strings so the file stays standard JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def format_values(values: dict[str, Any]) -> str:
    parts = []
    for key, value in values.items():
        if isinstance(value, float):
            parts.append(f"{key}={value:.4g}")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)


def read_metrics(out_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The events of `out_dir/metrics.jsonl`, in order."""
    path = Path(out_dir) / METRICS_NAME
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class Progress:
    """A tqdm bar over optimizer steps with loss and tokens/s; tqdm computes the ETA from the step rate."""

    def __init__(self, total: int, initial: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, smoothing=0.1)

    def update(self, steps: int, **postfix: Any) -> None:
        if self.bar is None:
            return
        self.bar.update(steps)
        if postfix:
            self.bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in postfix.items()},
                                 refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
