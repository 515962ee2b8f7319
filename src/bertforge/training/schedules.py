"""Learning-rate schedules: the shape of the rate over a run, counted in optimizer steps or in time.

One shape function (`lr_factor`) serves both clocks. A position in the run is given in *units* — optimizer
steps, or seconds of a time budget — as the start and end of the step being scheduled:

- warmup (every schedule but one-cycle): the rate rises linearly, reaching lr at the end of the warmup; the
  first step already uses lr/W (the end of step 0), so no step is wasted at 0.
- `linear` (BERT's): after the warmup, linear decay to 0 at the end of the run; the last step uses lr/(T-W).
- `constant`: lr after the warmup.
- `wsd` (warmup-stable-decay): lr after the warmup until the last `decay_ratio` of the run (default 20%),
  then down to 0, by `1-sqrt` (default: factor 1 - sqrt(q) at fraction q of the decay, which Hägele et al.
  (2024) found better than linear) or `linear`. A WSD run can be continued from its stable phase.
- `one-cycle`: a triangle with its peak at the middle of the run — up over the first half, down to 0 over
  the second (the Cramming recipe's one-cycle); it is its own warmup, so the warmup settings do not apply.

`WarmupDecay` counts steps. `TimeBudgetSchedule` counts seconds of a time budget (`training.minutes`): the
position of a step is the time elapsed since training started (plus what a resumed run had used) over the
budget, so the same recipe decays on time whatever the machine's speed, and the run ends when `spent`. Its
clock is injected (tests pass a fake one): wall time, or with `budget_clock = "cpu"` the process's CPU time
(`process_cpu_seconds`), which other jobs on a shared machine do not use up; under torchrun the ranks agree on
rank 0's clock (`agree`), so every rank uses the same rate and stops after the same step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

try:
    import resource
except ImportError:  # Windows
    resource = None

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from bertforge.training import distributed
from bertforge.training.config import SCHEDULES, TrainingConfig


def lr_factor(schedule: str, start: float, end: float, total: float, warmup: float, decay_ratio: float = 0.2,
              decay_shape: str = "1-sqrt") -> float:
    """The lr multiplier of a step running from `start` to `end` in a run of `total` units (steps or seconds)
    with `warmup` units of warmup (see the module docstring for the shapes)."""
    if schedule == "one-cycle":
        warmup = total / 2
    if start < warmup:
        return min(1.0, end / warmup)
    if schedule == "constant":
        return 1.0
    if schedule in ("linear", "one-cycle"):
        return max(0.0, (total - start) / max(total - warmup, 1e-12))
    if schedule == "wsd":
        decay_start = max(warmup, total * (1.0 - decay_ratio))
        if start < decay_start:
            return 1.0
        left = max(0.0, (total - start) / max(total - decay_start, 1e-12))  # 1 at the decay's start, 0 at the end
        return left if decay_shape == "linear" else 1.0 - math.sqrt(1.0 - left)
    raise ValueError(f"unknown schedule {schedule!r}; use one of {SCHEDULES}")


class WarmupDecay:
    """LR multiplier of optimizer step s (0-based) in a run of `total_steps`: `lr_factor` over steps.

    Its attributes are plain values: the scheduler's state dict (saved in checkpoints) carries them.
    """

    def __init__(self, warmup_steps: int, total_steps: int, schedule: str = "linear", decay_ratio: float = 0.2,
                 decay_shape: str = "1-sqrt"):
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.schedule = schedule
        self.decay_ratio = decay_ratio
        self.decay_shape = decay_shape

    def __call__(self, step: int) -> float:
        return lr_factor(self.schedule, step, step + 1, self.total_steps, self.warmup_steps, self.decay_ratio,
                         self.decay_shape)


def build_scheduler(optimizer: Optimizer, warmup_steps: int, total_steps: int, schedule: str = "linear",
                    decay_ratio: float = 0.2, decay_shape: str = "1-sqrt") -> LambdaLR:
    """Warmup then `schedule` over `total_steps` optimizer steps, stepped once per step."""
    return LambdaLR(optimizer, WarmupDecay(warmup_steps, total_steps, schedule, decay_ratio, decay_shape))


class TimeBudgetSchedule(LambdaLR):
    """A schedule whose position is time: step k's rate is `lr_factor` at (elapsed, elapsed + the last step's
    duration) of `budget_s` seconds, with `warmup_ratio` of the budget as warmup.

    The clock starts at `start()` (the first training step); `step()` (after each optimizer step) reads it
    once and sets the rate of the next step. `elapsed_s` is in the state dict, so a resumed run continues on
    the time it had used; the clock itself is not saved.

    Args:
        clock: seconds, monotonic (default `time.monotonic`; tests pass a fake one).
        agree: maps this process's elapsed seconds to the value every rank uses (under torchrun: rank 0's);
            None = this process's own.
    """

    def __init__(self, optimizer: Optimizer, budget_s: float, warmup_ratio: float, schedule: str = "linear",
                 decay_ratio: float = 0.2, decay_shape: str = "1-sqrt", *,
                 clock: Callable[[], float] = time.monotonic, agree: Callable[[float], float] | None = None):
        if budget_s <= 0:
            raise ValueError(f"TimeBudgetSchedule: budget_s must be positive, got {budget_s}")
        self.budget_s, self.warmup_ratio, self.schedule = float(budget_s), float(warmup_ratio), schedule
        self.decay_ratio, self.decay_shape = decay_ratio, decay_shape
        self.elapsed_s, self.last_step_s = 0.0, 0.0
        self._clock, self._agree, self._started, self._offset = clock, agree, None, 0.0

        def factor(step: int) -> float:  # a function, not an object: LambdaLR keeps no state of it
            return lr_factor(self.schedule, self.elapsed_s, self.elapsed_s + self.last_step_s, self.budget_s,
                             self.warmup_ratio * self.budget_s, self.decay_ratio, self.decay_shape)

        super().__init__(optimizer, factor)

    def start(self) -> None:
        """Start the clock (a resumed run continues from the `elapsed_s` its checkpoint restored)."""
        self._started, self._offset = self._clock(), self.elapsed_s

    def step(self, epoch: Any = None) -> None:  # noqa: ARG002 (LRScheduler's signature)
        started = getattr(self, "_started", None)  # None while LambdaLR.__init__ takes its initial step
        if started is not None:
            now = self._offset + self._clock() - started
            if self._agree is not None:
                now = float(self._agree(now))
            self.last_step_s, self.elapsed_s = max(0.0, now - self.elapsed_s), now
        super().step()

    @property
    def spent(self) -> bool:
        """Whether the budget is used up (as of the last `step()`): the run ends after this step."""
        return self.elapsed_s >= self.budget_s

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in super().state_dict().items() if k not in _RUNTIME_ONLY}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict({k: v for k, v in state_dict.items() if k not in _RUNTIME_ONLY})


# What a TimeBudgetSchedule holds for this process only: never saved, never restored.
_RUNTIME_ONLY = frozenset({"_clock", "_agree", "_started", "_offset"})


def process_cpu_seconds() -> float:
    """The CPU seconds (user + system) this process has used, all its threads together, plus those of its child
    processes that have ended and been waited for (a data loader's workers count once they exit)."""
    if resource is None:  # not a Unix: this process's threads only
        return time.process_time()
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def budget_clock(config: TrainingConfig) -> Callable[[], float]:
    """The seconds a time budget counts: wall time (monotonic) or this process's CPU time (`budget_clock`)."""
    return process_cpu_seconds if config.budget_clock == "cpu" else time.monotonic


def schedule_for(optimizer: Optimizer, config: TrainingConfig, total_steps: int, warmup_steps: int, *,
                 world_size: int = 1, clock: Callable[[], float] | None = None) -> LambdaLR:
    """The run's scheduler: over `total_steps` steps, or over `config.minutes` of time (then a
    `TimeBudgetSchedule`, on `clock`, the ranks agreeing on rank 0's clock with one broadcast per step)."""
    if config.minutes > 0:
        agree = distributed.broadcast_object if world_size > 1 else None
        return TimeBudgetSchedule(optimizer, config.minutes * 60, config.warmup_ratio, config.schedule,
                                  config.decay_ratio, config.decay_shape, clock=clock or budget_clock(config),
                                  agree=agree)
    return build_scheduler(optimizer, warmup_steps, total_steps, config.schedule, config.decay_ratio,
                           config.decay_shape)
