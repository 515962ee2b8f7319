"""One optimizer step's forward and backward passes over an accumulation window, and the statistics they
report: `WindowStep` (the passes, each loss term divided by its global count), `StepStats` (one step's
numbers on the host) and `LogWindow` (their sums until the next training log line, carried in checkpoints).

The statistics vector a window returns is, summed over micro-batches and ranks:
[term sums (n), term counts (n), metric sums (m), metric counts (m), tokens (1)], n = len(term_names),
m = len(metric_names). The recipes that change a micro-batch's passes (R-Drop, FGM) are pieces of
`training.recipes`, called here.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from bertforge.runtime import autocast
from bertforge.training import distributed
from bertforge.training.recipes import Fgm, RDrop


def as_tensor(value: Any, device: torch.device) -> torch.Tensor:
    if isinstance(value, int | float):  # filled on the device: a copy from the host could wait for it
        return torch.full((), float(value), dtype=torch.float32, device=device)
    return torch.as_tensor(value, dtype=torch.float32, device=device).detach().float()


@dataclass(frozen=True)
class StepStats:
    """One optimizer step's global statistics on the host (see the module docstring for their order)."""

    term_sums: list[float]
    term_counts: list[float]
    metric_sums: list[float]
    metric_counts: list[float]
    tokens: float

    @property
    def loss(self) -> float:
        """The step's loss: the sum over terms of sum / count."""
        return sum(s / max(c, 1.0) for s, c in zip(self.term_sums, self.term_counts))


@dataclass
class LogWindow:
    """Global sums since the last training log event; saved in checkpoints so resumed logs match exactly."""

    term_sums: list[float] = field(default_factory=list)
    term_counts: list[float] = field(default_factory=list)
    metric_sums: list[float] = field(default_factory=list)
    metric_counts: list[float] = field(default_factory=list)
    tokens: float = 0.0
    grad_norm: float = 0.0
    steps: int = 0
    skipped: int = 0
    # Steps taken on the device and not yet read: their statistics vectors summed there (`accumulate`).
    pending: torch.Tensor | None = field(default=None, repr=False)

    def accumulate(self, vector: torch.Tensor) -> None:
        """Add a step left on the device: [statistics vector, gradient norm (0 if skipped), skipped flag]."""
        self.pending = vector if self.pending is None else self.pending + vector
        self.steps += 1

    def fold(self, n: int, m: int) -> tuple[float, float | None]:
        """Read the pending steps into the sums (one device-to-host copy); returns their tokens and loss."""
        if self.pending is None:
            return 0.0, None
        values, self.pending = self.pending.tolist(), None
        stats = StepStats(values[:n], values[n:2 * n], values[2 * n:2 * n + m], values[2 * n + m:2 * n + 2 * m],
                          values[2 * n + 2 * m])
        if len(self.term_sums) != n or len(self.metric_sums) != m:
            self.term_sums, self.term_counts = [0.0] * n, [0.0] * n
            self.metric_sums, self.metric_counts = [0.0] * m, [0.0] * m
        self.add_sums(stats)
        self.grad_norm += values[-2]
        self.skipped += int(values[-1])
        return stats.tokens, stats.loss

    def add_sums(self, stats: StepStats) -> None:
        for totals, new in ((self.term_sums, stats.term_sums), (self.term_counts, stats.term_counts),
                            (self.metric_sums, stats.metric_sums), (self.metric_counts, stats.metric_counts)):
            for i, value in enumerate(new):
                totals[i] += value
        self.tokens += stats.tokens

    def add(self, stats: StepStats, grad_norm: float, skipped: bool) -> None:
        if not self.steps:
            n, m = len(stats.term_sums), len(stats.metric_sums)
            self.term_sums, self.term_counts = [0.0] * n, [0.0] * n
            self.metric_sums, self.metric_counts = [0.0] * m, [0.0] * m
        self.add_sums(stats)
        self.steps += 1
        self.skipped += int(skipped)
        if math.isfinite(grad_norm):
            self.grad_norm += grad_norm

    @property
    def loss(self) -> float:
        """The window's loss as its log line says it: the sum over terms of sum / count (NaN when empty)."""
        if not self.term_sums:
            return math.nan
        return sum(s / max(c, 1.0) for s, c in zip(self.term_sums, self.term_counts))

    def values(self, term_names: list[str], metric_names: list[str]) -> dict[str, float]:
        losses = {f"loss_{n}": s / max(c, 1.0) for n, s, c in zip(term_names, self.term_sums, self.term_counts)}
        values = {"loss": sum(losses.values()), **losses}
        for name, s, c in zip(metric_names, self.metric_sums, self.metric_counts):
            values[name] = s / max(c, 1.0)
        values["grad_norm"] = self.grad_norm / max(self.steps - self.skipped, 1)
        if self.skipped:
            values["skipped_steps"] = self.skipped
        return values


@dataclass
class Denominators:
    """The window's global counts (from `task.counts`, all-reduced before any forward pass).

    Attributes:
        counts: every term's global count, R-Drop's included [n].
        terms: what every term is divided by (counts clamped at 1) [n].
        task: what the task's own terms are divided by (FGM's adversarial pass has no R-Drop term).
    """

    counts: torch.Tensor
    terms: torch.Tensor
    task: torch.Tensor


class WindowStep:
    """Forward and backward of one accumulation window, with each loss term divided by its global count.

    With `task.counts`, the counts of the window are all-reduced before the first forward and every
    micro-batch backpropagates `sum / global_count * world_size`. A task without `counts` may have a single
    loss term: its micro-batches backpropagate `sum * world_size` and the accumulated gradients are divided
    by the global count afterwards — the same gradients, as the count is one number. Several terms need
    `counts` (each has its own denominator).

    Per micro-batch, `rdrop` runs the forward twice and adds its term, counted like the task's first term;
    `fgm` then backpropagates the task's loss (one pass) once more with the word embeddings perturbed, logged
    as the metrics `adv_<term>`. Under DDP only the micro-batch's last forward of the window's last
    micro-batch synchronises: DDP prepares its reducer once per backward, and FGM's direction is this rank's
    own gradient.
    """

    def __init__(self, runner: nn.Module, ddp: nn.Module | None, task: Any, scaler: torch.amp.GradScaler,
                 device: torch.device, precision: str, world: int, params: list[nn.Parameter], *,
                 rdrop: RDrop | None = None, fgm: Fgm | None = None):
        self.runner, self.ddp, self.task, self.scaler = runner, ddp, task, scaler
        self.device, self.precision, self.world, self.params = device, precision, world, params
        self.rdrop, self.fgm = rdrop, fgm
        self.counts_first = hasattr(task, "counts")
        self.task_terms: list[str] = []
        self.task_metrics: list[str] = []

    @property
    def term_names(self) -> list[str]:
        return self.task_terms + ([self.rdrop.name] if self.rdrop is not None else [])

    @property
    def metric_names(self) -> list[str]:
        return self.task_metrics + ([f"adv_{n}" for n in self.task_terms] if self.fgm is not None else [])

    def at_step(self, step: int, total_steps: int) -> None:
        """Tell a task that schedules its loss (`task.at_step`) which optimizer step the next window is."""
        if hasattr(self.task, "at_step"):
            self.task.at_step(step, total_steps)

    def __call__(self, micro_batches: list[Any]) -> torch.Tensor:
        """Run the window; return the global statistics vector (see `split`); gradients are left in .grad."""
        denominators = self.window_denominators(micro_batches) if self.counts_first else None
        term_stats = metric_stats = None
        tokens = torch.zeros(1, device=self.device)
        for index, batch in enumerate(micro_batches):
            terms, metrics = self.micro_batch(batch, denominators, last=index == len(micro_batches) - 1)
            term_stats = terms if term_stats is None else term_stats + terms
            metric_stats = metrics if metric_stats is None else metric_stats + metrics
            tokens += as_tensor(batch.num_tokens, self.device)
        return self.globalise(term_stats, metric_stats, tokens, denominators)

    def window_denominators(self, micro_batches: list[Any]) -> Denominators:
        """The global counts of the window's terms, known before any forward pass."""
        window_counts: dict[str, torch.Tensor] = {}
        for batch in micro_batches:
            for name, count in self.task.counts(batch).items():
                window_counts[name] = window_counts.get(name, 0) + as_tensor(count, self.device)
        if not self.task_terms:
            self.task_terms = list(window_counts)
        counts = distributed.all_reduce_sum(torch.stack([window_counts[n] for n in self.task_terms]))
        task = counts.clamp(min=1.0)
        if self.rdrop is not None:
            counts = self.rdrop.counted(counts)
        return Denominators(counts, counts.clamp(min=1.0), task)

    def micro_batch(self, batch: Any, denominators: Denominators | None,
                    last: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The passes of one micro-batch; returns its (term sums + counts, metric sums + counts) vectors."""
        clean_sync = last and self.fgm is None
        if self.fgm is not None:
            self.fgm.remember()  # what earlier micro-batches accumulated
        output, sums, term_counts = self.clean_passes(batch, clean_sync)
        self.backward(sums, None if denominators is None else denominators.terms, clean_sync)

        measured = self.task.metrics(output, batch)
        if not self.task_metrics:
            self.task_metrics = list(measured)
        metric_sums = [as_tensor(measured[n][0], self.device).view(1) for n in self.task_metrics]
        metric_counts = [as_tensor(measured[n][1], self.device).view(1) for n in self.task_metrics]
        if self.fgm is not None:
            adv_sums, adv_counts = self.adversarial(batch, None if denominators is None else denominators.task,
                                                    sync=last)
            metric_sums.append(adv_sums)
            metric_counts.append(adv_counts)
        metrics = torch.cat(metric_sums + metric_counts) if metric_sums else torch.zeros(0, device=self.device)
        return torch.cat([sums.detach(), term_counts]), metrics

    def clean_passes(self, batch: Any, sync: bool) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """(output, term sums, term counts) of the micro-batch: one forward, or R-Drop's two."""
        if self.rdrop is None:
            output = self.forward(batch, sync)
            return (output, *self.task_sums(output, batch))
        output = self.forward(batch, sync=False)
        second = self.forward(batch, sync=sync)
        sums_a, counts = self.task_sums(output, batch)
        sums_b, _ = self.task_sums(second, batch)
        consistency = self.rdrop.consistency(self.task, output, second, batch)
        return (output, *self.rdrop.combine(sums_a, sums_b, counts, consistency))

    def adversarial(self, batch: Any, denominators: torch.Tensor | None,
                    sync: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """FGM's pass: backpropagate the task's loss with the word embeddings perturbed; returns its
        (sums, counts)."""
        with self.fgm.perturbed():
            output = self.forward(batch, sync)
            sums, counts = self.task_sums(output, batch)
            self.backward(sums, denominators, sync)
        return sums.detach(), counts

    def globalise(self, term_stats: torch.Tensor, metric_stats: torch.Tensor, tokens: torch.Tensor,
                  denominators: Denominators | None) -> torch.Tensor:
        """All-reduce the window's statistics; without `counts`, divide the gradients by the global count."""
        n = len(self.term_names)
        if denominators is not None:
            # The loss is normalised by counts(); report those counts, not loss_terms' own.
            term_stats = torch.cat([term_stats[:n], denominators.terms.new_zeros(n)])
        stats = distributed.all_reduce_sum(torch.cat([term_stats, metric_stats, tokens]))
        if denominators is not None:
            stats[n:2 * n] = denominators.counts
        else:
            scale = 1.0 / stats[n].clamp(min=1.0)  # the single term's global count
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(scale.to(p.grad.dtype))
        return stats

    def synced(self, sync: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if self.ddp is None or sync else self.ddp.no_sync()

    def forward(self, batch: Any, sync: bool) -> Any:
        with self.synced(sync), autocast(self.device, self.precision):
            return self.runner(**batch.model_inputs())

    def backward(self, sums: torch.Tensor, denominators: torch.Tensor | None, sync: bool) -> None:
        loss = (sums if denominators is None else sums / denominators).sum() * self.world
        with self.synced(sync):
            self.scaler.scale(loss).backward()

    def task_sums(self, output: Any, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(sums, counts) of the task's loss terms, in `task_terms` order."""
        terms = self.task.loss_terms(output, batch)
        if not self.task_terms:
            self.task_terms = list(terms)
            if len(terms) > 1:
                raise TypeError(f"{type(self.task).__name__} returns several loss terms {list(terms)}; "
                                "it must also define counts(batch) so each term is normalised first")
        sums = torch.stack([terms[n][0].float() for n in self.task_terms])
        counts = torch.stack([as_tensor(terms[n][1], self.device) for n in self.task_terms])
        return sums, counts

    def split(self, values: list[float]) -> StepStats:
        """The host copy of a statistics vector, by part."""
        n, m = len(self.term_names), len(self.metric_names)
        return StepStats(values[:n], values[n:2 * n], values[2 * n:2 * n + m], values[2 * n + m:2 * n + 2 * m],
                         values[2 * n + 2 * m])
