"""The optimizer step after a window's backward passes (`Updater`): unscale (fp16), clip, the finite check (a
non-finite step is skipped; too many in a row raise `NonFiniteLossError`), the step, the EMA update and the
schedule.

Two ways to take it, the same updates:

- **On the device** (an optimizer that takes the AMP `found_inf` flag: the fused AdamW, the default on CUDA;
  not fp16, whose loss scaler decides itself): the finite check is a device tensor handed to the optimizer
  kernel, which skips the update when it is set; the EMA and the counts of skipped and consecutive skipped
  steps follow the flag on the device too. Nothing is read back, so the host queues the next step while the
  device still runs this one; the counts are read (and a run that kept failing stops) at the next log line
  (`settle`), so a diverged run stops within `log_every` steps of `max_nonfinite_steps`.
- **On the host** (every other optimizer, and fp16): one device-to-host read per step carries the loss and
  the gradient norm, and the step is skipped in Python, as it always was. On a CPU that read costs nothing.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.training.accumulation import StepStats, WindowStep
from bertforge.training.config import TrainingConfig
from bertforge.training.recipes import WeightAverage

log = logging.getLogger("bertforge.training")

# fp16 starts its loss scale at 2**16 and halves it on every overflow: up to 16 skipped steps in a row are
# the scaler calibrating itself, not divergence.
FP16_CALIBRATION_STEPS = 16


class NonFiniteLossError(BertforgeError, FloatingPointError):
    """Training diverged: the loss or gradients stayed NaN/inf for several consecutive steps."""


@dataclass(frozen=True)
class StepOutcome:
    """What one optimizer step did, read on the host: its statistics, gradient norm and loss, whether it was
    applied (finite), and the learning rate it used (the first group's)."""

    stats: StepStats
    grad_norm: float
    loss: float
    finite: bool
    lr: float


@dataclass(frozen=True)
class DeviceOutcome:
    """What one optimizer step did, left on the device: the window's statistics vector followed by the
    gradient norm (0 when skipped) and the skipped flag (1.0 / 0.0); the learning rate it used."""

    vector: torch.Tensor
    lr: float


class Updater:
    """Takes the optimizer steps (module docstring). `skipped` counts the run's skipped steps as last read
    on the host (a resumed run starts at its checkpoint's count); `settle` brings it up to date."""

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: Any, scaler: torch.amp.GradScaler,
                 params: list[nn.Parameter], config: TrainingConfig, precision: str, ema: WeightAverage | None,
                 skipped: int = 0):
        self.optimizer, self.scheduler, self.scaler, self.params = optimizer, scheduler, scaler, params
        self.precision, self.ema, self.skipped, self.consecutive = precision, ema, skipped, 0
        self.clip_norm = config.max_grad_norm if config.max_grad_norm > 0 else float("inf")
        self.limit = config.max_nonfinite_steps + (FP16_CALIBRATION_STEPS if precision == "fp16" else 0)
        self.on_device = bool(getattr(optimizer, "_step_supports_amp_scaling", False)) and precision != "fp16"
        # On-device counts since the last `settle`: skipped steps, the current and the longest run of them.
        self._counts: torch.Tensor | None = None
        self._first_unsettled = 0

    def __call__(self, stats: torch.Tensor, layout: WindowStep, step: int) -> StepOutcome | DeviceOutcome:
        """Take optimizer step `step + 1` on the accumulated gradients, given the window's `stats` vector."""
        fp16 = self.precision == "fp16"
        if fp16:
            self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        if self.on_device:
            return self.step_on_device(stats, grad_norm.detach().float(), layout, step, lr)
        # One device->host transfer per step: the logged numbers and the finite check.
        host = torch.cat([stats, grad_norm.detach().float().view(1)]).tolist()
        numbers, norm = layout.split(host[:-1]), host[-1]
        loss = numbers.loss
        finite = math.isfinite(loss) and math.isfinite(norm)
        if finite:
            self.consecutive = 0
            if fp16:
                self.scaler.step(self.optimizer)
            else:
                self.optimizer.step()
            if self.ema is not None:
                self.ema.update()
        else:
            self.skip(step + 1, loss, norm, lr)
        if fp16:
            self.scaler.update()
        self.finish_step()
        return StepOutcome(numbers, norm, loss, finite, lr)

    def step_on_device(self, stats: torch.Tensor, grad_norm: torch.Tensor, layout: WindowStep, step: int,
                       lr: float) -> DeviceOutcome:
        """The step with the finite check left on the device (module docstring)."""
        n = len(layout.term_names)
        loss = (stats[:n] / stats[n:2 * n].clamp(min=1.0)).sum()
        skipped = (~(torch.isfinite(loss) & torch.isfinite(grad_norm))).float()  # [] 1.0 = skip this step
        # The AMP protocol of PyTorch's fused optimizers (what GradScaler.step sets): no update where found_inf.
        self.optimizer.grad_scale, self.optimizer.found_inf = None, skipped
        try:
            self.optimizer.step()
        finally:
            del self.optimizer.grad_scale, self.optimizer.found_inf
        if self.ema is not None:
            self.ema.update(applied=1.0 - skipped)
        if self._counts is None:
            self._counts = torch.zeros(3, device=stats.device)
            self._first_unsettled = step + 1
        run = (self._counts[1] + skipped) * skipped
        self._counts = torch.stack([self._counts[0] + skipped, run, torch.maximum(self._counts[2], run)])
        self.finish_step()
        norm = torch.where(skipped > 0, torch.zeros_like(grad_norm), grad_norm)
        return DeviceOutcome(torch.cat([stats, norm.view(1), skipped.view(1)]), lr)

    def finish_step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()

    def settle(self, step: int) -> None:
        """Read the on-device skip counts up to `step` (a log line, a checkpoint, the end): warn about skipped
        steps and stop a run whose steps kept failing (a no-op on the host path)."""
        if self._counts is None:
            return
        skipped, _, longest = (int(v) for v in self._counts.tolist())
        self._counts = torch.stack([torch.zeros_like(self._counts[0]), self._counts[1], self._counts[1]])
        first, self._first_unsettled = self._first_unsettled, step + 1
        if not skipped:
            return
        self.skipped += skipped
        lr = self.optimizer.param_groups[0]["lr"]
        log.warning("steps %d-%d: %d steps had a non-finite loss or gradient norm; their updates were skipped",
                    first, step, skipped)
        if longest >= self.limit:
            raise NonFiniteLossError(
                f"step {step}: loss or gradients were NaN/inf for {longest} consecutive steps "
                f"({self.precision}, lr {lr:.3g}); {advice(lr)}")

    def skip(self, step: int, loss: float, grad_norm: float, lr: float) -> None:
        """Count a skipped step; raise once `limit` were skipped in a row."""
        self.consecutive += 1
        self.skipped += 1
        scale = f" (loss scale {self.scaler.get_scale():g})" if self.precision == "fp16" else ""
        log.warning("step %d: non-finite loss %s / gradient norm %s%s; skipping this update", step, loss,
                    grad_norm, scale)
        if self.consecutive >= self.limit:
            raise NonFiniteLossError(
                f"step {step}: loss or gradients were NaN/inf for {self.consecutive} consecutive steps "
                f"({self.precision}, lr {lr:.3g}); {advice(lr)}")


def advice(lr: float) -> str:
    return (f"lower training.lr (e.g. --training.lr={lr / 4:.2g}), lengthen warmup, keep max_grad_norm > 0, use "
            "bf16 instead of fp16, and check the data for empty or corrupt batches; earlier checkpoints are intact")
