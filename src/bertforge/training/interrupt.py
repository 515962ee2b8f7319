"""Ctrl-C during training: finish the current optimizer step, save it, then stop (`StepInterrupt`).

A KeyboardInterrupt raised at a random point of a step would leave the weights, the optimizer and the data
position of different steps, and the steps since the last checkpoint would be lost. So while the loop runs,
the first SIGINT only sets a flag; the loop sees it at the end of the step, writes that step's checkpoint
(atomically, like every checkpoint: a resume from it is exact) and raises `TrainingInterrupted`, which the
command line turns into "latest checkpoint ... resume with ..." and exit status 130. A second Ctrl-C stops at
once (the default handler is back after the first).

Only a single process takes the graceful path: under torchrun the ranks could see the signal at different
steps and the checkpoint is a collective, so there the interrupt stops at once, as before, and the latest
checkpoint written by `save_every` is the one to resume from.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger("bertforge.training")


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped training after `step`, whose checkpoint is `checkpoint` (the latest of `out_dir`)."""

    def __init__(self, step: int, checkpoint: Path | None, out_dir: Path):
        super().__init__(f"interrupted after step {step}; checkpoint {checkpoint}")
        self.step, self.checkpoint, self.out_dir = step, checkpoint, out_dir


class StepInterrupt:
    """The first SIGINT as a flag the loop reads at the end of a step (`requested`); `release()` puts the
    previous handler back. Inert (never requested) off the main thread or with more than one process."""

    def __init__(self, world_size: int = 1):
        self.requested, self.installed = False, False
        self.previous: Any = signal.default_int_handler
        if world_size == 1 and threading.current_thread() is threading.main_thread():
            # A handler installed outside Python reads back as None: Python's own then takes over again.
            self.previous = signal.signal(signal.SIGINT, self.handle) or signal.default_int_handler
            self.installed = True

    def handle(self, signum: int, frame: Any) -> None:  # noqa: ARG002 (a signal handler's signature)
        self.requested = True
        signal.signal(signal.SIGINT, self.previous)  # a second Ctrl-C stops at once
        log.warning("Ctrl-C: finishing this step and saving a checkpoint (Ctrl-C again to stop at once)")

    def check(self, step: int, checkpoint: Path | None, out_dir: str) -> None:
        """After step `step` was saved as `checkpoint`: stop if Ctrl-C was pressed."""
        if self.requested:
            raise TrainingInterrupted(step, checkpoint, Path(out_dir))

    def release(self) -> None:
        if self.installed and not self.requested:
            signal.signal(signal.SIGINT, self.previous)
        self.installed = False
