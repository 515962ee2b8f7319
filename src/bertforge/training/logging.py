"""Where training numbers go: `metrics.jsonl`, TensorBoard (when installed), the console and the progress
(a bar on a terminal, periodic log lines when output goes to a file or a pipe).

`metrics.jsonl` holds one JSON object per log event — `{"step": 100, "split": "train", "time": ...,
"values": {"loss": ..., "loss_mlm": ..., "mlm_acc": ..., "lr": ...}}` — and is the record a run is judged by
(plots, docs, the resume test). Only the main process writes; the loop never calls these on other ranks.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from bertforge.storage import write_text
from bertforge.training.config import UNLIMITED_STEPS

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
    """Progress over optimizer steps: a tqdm bar on a terminal, periodic log lines everywhere else.

    A bar redraws itself with carriage returns, which is right on a terminal and a flood of partial lines in
    a log file, a CI console or `nohup` output. So when the stream (stderr by default) is not a terminal, the
    progress goes through the `bertforge.training` logger instead: one line when a tenth of the steps is done
    (or `every_fraction`) or `every_seconds` have passed since the last line, whichever comes first, each
    with the step, the loss, tokens/s, the elapsed time and the ETA.

    Args:
        total: the last step of the run (`UNLIMITED_STEPS`: not known, a time budget decides). initial: the step
            it starts from (a resumed run).
        enabled: False shows nothing.
        stream: where a bar draws (default sys.stderr); also decides bar or log lines (`isatty()`).
        every_seconds, every_fraction: how often a log line is written when the stream is not a terminal.
        clock: seconds, monotonic (tests pass a fake one).
        unit: what is counted ("step"; `bertforge embed` counts "text").
    """

    def __init__(self, total: int, initial: int, enabled: bool, *, stream: Any = None, every_seconds: float = 60.0,
                 every_fraction: float = 0.1, clock: Any = time.monotonic, unit: str = "step"):
        self.bar = None
        self.lines = False
        self.unit = unit
        self.total, self.step = total, initial
        self.known = total < UNLIMITED_STEPS
        if not enabled:
            return
        stream = stream if stream is not None else sys.stderr
        if is_terminal(stream):
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total if self.known else None, initial=initial, unit=unit, dynamic_ncols=True,
                            smoothing=0.1, file=stream)
            return
        self.lines = True
        self.clock, self.every_seconds = clock, every_seconds
        self.chunk = max(1, math.ceil(max(total - initial, 1) * every_fraction)) if self.known else total
        self.start_time = self.last_time = clock()
        self.start_step, self.last_step = initial, initial

    def update(self, steps: int, **postfix: Any) -> None:
        self.step += steps
        if self.bar is not None:
            self.bar.update(steps)
            if postfix:
                self.bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in postfix.items()},
                                     refresh=False)
            return
        if not self.lines:
            return
        now = self.clock()
        if (self.step - self.last_step >= self.chunk or now - self.last_time >= self.every_seconds
                or self.step >= self.total):
            log.info("%s", self.line(now, postfix))
            self.last_time, self.last_step = now, self.step

    def line(self, now: float, postfix: dict[str, Any]) -> str:
        """"step 120/1000 (12%) loss=6.81 tok_s=31200 elapsed 2m05s, ETA 15m20s"."""
        elapsed = now - self.start_time
        done = self.step - self.start_step
        parts = [f"{self.unit} {self.step}/{self.total} ({100 * self.step / max(self.total, 1):.0f}%)" if self.known
                 else f"{self.unit} {self.step}"]
        parts += [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in postfix.items()]
        eta = elapsed / done * (self.total - self.step) if done > 0 and self.known else None
        timing = f"elapsed {duration(elapsed)}" + (f", ETA {duration(eta)}" if eta is not None else "")
        return " ".join(parts) + " " + timing

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def is_terminal(stream: Any) -> bool:
    """Whether `stream` is an interactive terminal (a closed or odd stream counts as not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def duration(seconds: float) -> str:
    """45s, 2m05s, 3h07m."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
