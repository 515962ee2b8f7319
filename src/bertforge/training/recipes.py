"""The loop's recipes, as small pieces it calls: when to log, evaluate and save (`Cadence`), the best model
(`BestCheckpoint`, `BestSoFar`, `BestKeeper`), early stopping (`EarlyStopping`), the EMA of the weights
(`WeightAverage`), FGM (`Fgm`) and R-Drop (`RDrop`); plus the checks and the description of the recipes a
run has on.

Each recipe is a `TrainingConfig` field, off by default, and combinable. They are pieces of the loop, not of
a task or a callback, because each changes what a step, an evaluation or a checkpoint *is*, and only the
loop sees all three (accumulation, DDP sync, autocast and the loss scaler, exact resume). What each does:

- the best model (`train(..., best=BestCheckpoint(...))`): after each evaluation, `values[metric]` is
  compared with the best so far; a better one saves the model (with the tokenizer and the extra files) to
  `directory`, replacing it atomically. The best step and value are in every training checkpoint (`best`),
  so a resumed run never replaces a better best with a worse one.
- early stopping (`patience`, `min_delta`): after `patience` evaluations in a row that did not beat the
  best by more than `min_delta`, write a checkpoint and return (`TrainResult.stopped_early`). The count
  (`best.stale`) is checkpointed; resuming a stopped run trains nothing.
- FGM (`fgm_epsilon`): per micro-batch, after the clean backward, the word embeddings move by
  eps * g / ||g|| (g: this micro-batch's gradient on them), the task's loss of one more forward pass is
  backpropagated with the same denominators (logged as the metrics `adv_<term>`), and the embeddings are
  restored from a copy (bit-exact). The direction is per micro-batch and per rank, so batch B with 2
  accumulation steps equals 2 processes with batch B, but not batch 2B.
- R-Drop (`rdrop_alpha`): per micro-batch two forward passes with independent dropout; the task's terms
  are their mean, plus the term `rdrop` = alpha * task.consistency(output_a, output_b, batch), normalised by
  the count of the task's first term (logged as `loss_rdrop`, part of `loss`).
- EMA of the weights (`ema_decay`): a float32 shadow updated after every applied step. Evaluation, the best
  model and every checkpoint's model weights are the shadow; the raw weights and the shadow travel in the
  training state, so a resume is exact; `train` returns with the shadow in the model.
- layer-wise learning-rate decay (`layer_lr_decay`) lives in the optimizer's groups (`optim`); it is only
  described here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge import checkpoint_format
from bertforge.errors import CheckpointError, ConfigError
from bertforge.model.fast_paths import is_encoder
from bertforge.training import distributed
from bertforge.training.config import TrainingConfig
from bertforge.training.optim import encoder_depths

log = logging.getLogger("bertforge.training")


# --- when the loop logs, evaluates and saves -------------------------------------------------------------

@dataclass(frozen=True)
class Cadence:
    """After which optimizer steps the loop logs, evaluates and writes a checkpoint.

    The last step always logs, evaluates (with an evaluation) and saves, and a run that stops early saves
    where it stopped (so a resume knows it stopped). How many checkpoints are kept (`keep_last`) is
    `checkpoint.save_checkpoint`'s business.

    Attributes:
        total_steps: the run's length.
        log_every, eval_every, save_every: `TrainingConfig`'s (0: never, but for the last step).
        evaluates_at_all: whether the run has an evaluation.
        save_also: save_also(step) -> True adds a checkpoint (fine-tuning: epoch ends); None adds none.
    """

    total_steps: int
    log_every: int
    eval_every: int = 0
    save_every: int = 0
    evaluates_at_all: bool = False
    save_also: Callable[[int], bool] | None = None

    @classmethod
    def of(cls, config: TrainingConfig, total_steps: int, evaluates_at_all: bool,
           save_also: Callable[[int], bool] | None = None) -> Cadence:
        return cls(total_steps, config.log_every, config.eval_every, config.save_every, evaluates_at_all,
                   save_also)

    def ending_at(self, step: int) -> Cadence:
        """This cadence for a run that ends after `step` (a time budget spent): that step logs, evaluates, saves."""
        return dataclasses.replace(self, total_steps=step)

    def logs(self, step: int) -> bool:
        return step % self.log_every == 0 or step == self.total_steps

    def evaluates(self, step: int) -> bool:
        every = bool(self.eval_every) and step % self.eval_every == 0
        return self.evaluates_at_all and (every or step == self.total_steps)

    def saves(self, step: int, stopping: bool = False) -> bool:
        every = bool(self.save_every) and step % self.save_every == 0
        also = self.save_also is not None and self.save_also(step)
        return every or step == self.total_steps or stopping or also


# --- the best model and early stopping -------------------------------------------------------------------

@dataclass(frozen=True)
class BestCheckpoint:
    """Which evaluation's model the loop keeps, and where (`train(..., best=...)`).

    Attributes:
        metric: the evaluation value that ranks evaluations (a key of eval_fn's dict).
        lower_is_better: True for losses and errors (mse), False for accuracy, F1, correlations.
        directory: where the best model is saved (a complete model directory, replaced atomically).
        extra_files: more files for that directory, {file name: text or bytes} (e.g. finetuning.json).
        on_best: called as on_best(step, values) on every rank after a new best was saved (e.g. to keep
            that evaluation's predictions); None for nothing.
    """

    metric: str
    lower_is_better: bool
    directory: Path | str
    extra_files: Mapping[str, str | bytes] = field(default_factory=dict)
    on_best: Callable[[int, dict[str, float]], None] | None = None

    def improves(self, value: float, than: float | None, min_delta: float = 0.0) -> bool:
        """Whether `value` beats the best so far `than` (None: nothing yet) by more than `min_delta`; NaN never
        beats a number."""
        if than is None:
            return True
        if math.isnan(value) or math.isnan(than):
            return not math.isnan(value)
        return value < than - min_delta if self.lower_is_better else value > than + min_delta

    def value_of(self, values: Mapping[str, float]) -> float:
        """`values[metric]`, or a ConfigError listing the evaluation's values."""
        if self.metric not in values:
            raise ConfigError(f"the best checkpoint is chosen by {self.metric!r}, which is not among the "
                              f"evaluation's values {sorted(values)}; choose one of those (fine-tuning: "
                              "--metric NAME)")
        return float(values[self.metric])


@dataclass
class BestSoFar:
    """The best evaluation of a run so far (saved in every checkpoint as `best`, restored on resume), and
    `stale`: the evaluations since the last one that beat the best by more than `min_delta` (patience)."""

    step: int | None = None
    value: float | None = None
    values: dict[str, float] = field(default_factory=dict)
    stale: int = 0


@dataclass(frozen=True)
class EarlyStopping:
    """`training.patience` and `training.min_delta`: the run ends after `patience` evaluations in a row that
    did not beat the best so far by more than `min_delta` (patience 0: it never ends early)."""

    patience: int = 0
    min_delta: float = 0.0

    def significant(self, best: BestCheckpoint, value: float, than: float | None) -> bool:
        """Whether `value` is a real gain over the best so far `than`: one that resets the count."""
        return best.improves(value, than, self.min_delta)

    def observe(self, record: BestSoFar, significant: bool) -> bool:
        """Count one evaluation into `record.stale`; True when the run should stop here."""
        record.stale = 0 if significant else record.stale + 1
        return self.patience > 0 and record.stale >= self.patience


class BestKeeper:
    """After each evaluation: decide whether it is the best so far, save its model when it is, and say
    whether early stopping ends the run.

    Rank 0 decides and broadcasts, so every rank takes the same branch (and joins the same broadcasts).

    Args:
        best: what to keep and where.
        record: the best so far (a resumed run's comes from its checkpoint); updated in place.
        stopping: the early-stopping rule.
        tokenizer: saved with the best model.
        is_main: whether this process writes.
    """

    def __init__(self, best: BestCheckpoint, record: BestSoFar, stopping: EarlyStopping, tokenizer: Any = None,
                 is_main: bool = True):
        self.best, self.record, self.stopping = best, record, stopping
        self.tokenizer, self.is_main = tokenizer, is_main

    def observe(self, model: nn.Module, step: int, values: dict[str, float]) -> bool:
        """Judge the evaluation `values` of `model` after `step`; True when the run should stop."""
        best, record = self.best, self.record
        value = best.value_of(values)
        improved, significant, value, values = distributed.broadcast_object(
            (best.improves(value, record.value), self.stopping.significant(best, value, record.value), value,
             values))
        stop = self.stopping.observe(record, significant)
        if improved:
            self.keep(model, step, value, values)
        return stop

    def keep(self, model: nn.Module, step: int, value: float, values: dict[str, float]) -> None:
        """Save `model` as the best (replacing the directory atomically), record it, tell `on_best`."""
        best = self.best
        error = None
        if self.is_main:
            try:
                checkpoint_format.save_model(model, best.directory, tokenizer=self.tokenizer,
                                             extra_files=dict(best.extra_files))
            except (CheckpointError, OSError) as exc:
                error = f"{best.directory}: the best model (step {step}) could not be saved ({exc})"
        error = distributed.broadcast_object(error)
        if error is not None:
            raise CheckpointError(error)
        self.record.step, self.record.value, self.record.values = step, value, dict(values)
        if self.is_main:
            log.info("step %d: best %s so far (%.6g); saved to %s", step, best.metric, value, best.directory)
        if best.on_best is not None:
            best.on_best(step, dict(values))


# --- EMA of the weights ----------------------------------------------------------------------------------

class WeightAverage:
    """EMA of the trainable parameters (`training.ema_decay`): a float32 shadow, starting at the initial
    weights, updated as shadow = d * shadow + (1 - d) * weights after every applied optimizer step.

    Tied parameters appear once (under their first name).
    """

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.reset()

    def reset(self) -> None:
        """Start the average at the model's current weights."""
        self.shadow = [p.detach().float().clone() for p in self.params]

    @torch.no_grad()
    def update(self, applied: torch.Tensor | None = None) -> None:
        """Average in the current weights; with `applied` (a device scalar, 1.0 or 0.0: was the optimizer step
        taken?) the update happens on the device only where it is 1, without reading it on the host."""
        weights = [p.detach().float() for p in self.params]
        if applied is None:
            torch._foreach_mul_(self.shadow, self.decay)
            torch._foreach_add_(self.shadow, weights, alpha=1.0 - self.decay)
            return
        keep = 1.0 - (1.0 - self.decay) * applied  # decay, or 1 where the step was skipped
        torch._foreach_mul_(self.shadow, keep)
        torch._foreach_add_(self.shadow, torch._foreach_mul(weights, 1.0 - keep))

    @contextlib.contextmanager
    def applied(self) -> Iterator[list[torch.Tensor]]:
        """The shadow in the model for the block, then the raw weights back (copied, so bit-exact); yields
        the raw weights (copies)."""
        raw = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for param, shadow in zip(self.params, self.shadow):
                param.copy_(shadow)
        try:
            yield raw
        finally:
            with torch.no_grad():
                for param, weights in zip(self.params, raw):
                    param.copy_(weights)

    @torch.no_grad()
    def finish(self) -> None:
        """Leave the shadow in the model (the end of training)."""
        for param, shadow in zip(self.params, self.shadow):
            param.copy_(shadow)

    def state_dict(self, raw: list[torch.Tensor]) -> dict[str, Any]:
        """The checkpoint's `ema`: the decay, the shadow and the raw training weights `raw`, by name."""
        return {"decay": self.decay, "shadow": dict(zip(self.names, self.shadow)),
                "raw": dict(zip(self.names, raw))}

    def load_shadow(self, shadow: Mapping[str, torch.Tensor], path: Path) -> None:
        missing = [n for n in self.names if n not in shadow]
        if missing:
            raise CheckpointError(f"{path}: its EMA state lacks {missing[:3]}; resume with the same model "
                                  "settings the run started with")
        for index, name in enumerate(self.names):
            self.shadow[index] = shadow[name].to(self.params[index].device, torch.float32).clone()


def averaged(ema: WeightAverage | None) -> contextlib.AbstractContextManager:
    """The EMA weights in the model for a block (evaluation, saving), or nothing without EMA; yields the raw
    weights (copies), or None."""
    return ema.applied() if ema is not None else contextlib.nullcontext()


# --- FGM -------------------------------------------------------------------------------------------------

def word_embedding_weight(model: nn.Module) -> nn.Parameter:
    """The word-embedding weight FGM perturbs: `model.get_input_embeddings()` when the model has it, else the
    bertforge encoder's `embeddings.word` (found as `model.fast_paths` finds encoders)."""
    getter = getattr(model, "get_input_embeddings", None)
    module = getter() if callable(getter) else None
    if module is None:
        for candidate in model.modules():
            if is_encoder(candidate) and hasattr(candidate, "embeddings"):
                embeddings = candidate.embeddings
                module = getattr(embeddings, "word", None)
                module = module if module is not None else getattr(embeddings, "word_embeddings", None)
                break
    weight = getattr(module, "weight", None)
    if not isinstance(weight, nn.Parameter):
        raise ConfigError("training.fgm_epsilon perturbs the word embeddings, but the model has none (no "
                          "get_input_embeddings() and no bertforge encoder); set training.fgm_epsilon 0")
    if not weight.requires_grad:
        raise ConfigError("training.fgm_epsilon perturbs the word embeddings, which are frozen (e.g. "
                          "model.freeze_encoder): they get no gradient to follow; train them or set "
                          "training.fgm_epsilon 0")
    return weight


class Fgm:
    """Fast Gradient Method on the word embeddings (`training.fgm_epsilon`), one micro-batch at a time.

    `remember()` before a micro-batch's clean backward notes what earlier micro-batches accumulated in the
    weight's gradient; `perturbed()` then moves the weight by eps * g / ||g||, g being this micro-batch's
    own gradient (the accumulated one minus the remembered one), for the block, and restores it from a copy.
    """

    def __init__(self, weight: nn.Parameter, epsilon: float):
        self.weight, self.epsilon = weight, epsilon
        self.before: torch.Tensor | None = None

    def remember(self) -> None:
        """Note the gradient accumulated so far (before this micro-batch's backward)."""
        grad = self.weight.grad
        self.before = grad.detach().clone() if grad is not None else None

    def direction(self) -> torch.Tensor:
        """eps * g / ||g|| in float32, g: the gradient since `remember()` (zero without one)."""
        grad = self.weight.grad
        if grad is None:
            grad = torch.zeros_like(self.weight)
        elif self.before is not None:
            grad = grad - self.before
        grad = grad.detach().float()
        # The loss scale and the denominators only scale g: its direction is the same.
        return grad * (self.epsilon / grad.norm().clamp(min=1e-30))

    @contextlib.contextmanager
    def perturbed(self) -> Iterator[None]:
        """The word embeddings moved along `direction()` for the block, then bit-exactly what they were."""
        delta = self.direction()
        saved = self.weight.detach().clone()
        with torch.no_grad():
            self.weight.add_(delta.to(self.weight.dtype))
        try:
            yield
        finally:
            with torch.no_grad():
                self.weight.copy_(saved)  # a copy, not weight - delta: rounding would drift the embeddings


# --- R-Drop ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RDrop:
    """R-Drop (`training.rdrop_alpha`): the loss terms of two dropout passes and their consistency term.

    The consistency term `rdrop` is counted like the task's first term, so its count (denominator) is that
    term's, appended after the task's.
    """

    alpha: float
    name: str = "rdrop"

    def counted(self, counts: torch.Tensor) -> torch.Tensor:
        """The task terms' counts [n] followed by the consistency term's (the first term's) [n + 1]."""
        return torch.cat([counts, counts[:1]])

    def consistency(self, task: Any, output_a: Any, output_b: Any, batch: Any) -> torch.Tensor:
        """alpha * task.consistency(output_a, output_b, batch) (a sum over the first term's items), float32."""
        term = task.consistency(output_a, output_b, batch)
        if isinstance(term, tuple):  # (sum, count): the count is the first term's, by contract
            term = term[0]
        return self.alpha * term.float()

    def combine(self, sums_a: torch.Tensor, sums_b: torch.Tensor, counts: torch.Tensor,
                consistency: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(sums, counts) of the micro-batch: the mean of the two passes' term sums, then the consistency
        term; the counts with the consistency term's appended."""
        sums = torch.cat([(sums_a + sums_b) / 2, consistency.view(1)])
        return sums, self.counted(counts)


# --- what a run can apply, and what it applies ----------------------------------------------------------

def check_recipes(config: TrainingConfig, task: Any, eval_fn: Any, best: BestCheckpoint | None) -> None:
    """The recipes' needs that the config alone cannot check, before anything else happens."""
    if config.patience > 0 and (eval_fn is None or best is None):
        raise ConfigError(f"training.patience={config.patience} needs evaluations to count: give a dev set "
                          "(fine-tuning: data.dev, not --no-dev; the loop: eval_fn and best) or set "
                          "training.patience 0")
    if config.patience > 0 and not config.eval_every:
        log.warning("training.patience=%d counts evaluations, but training.eval_every is 0: the only one is the "
                    "last, so the run cannot stop early; set eval_every", config.patience)
    if config.rdrop_alpha > 0 and not callable(getattr(task, "consistency", None)):
        name = getattr(task, "name", None) or type(task).__name__
        raise ConfigError(f"training.rdrop_alpha={config.rdrop_alpha:g}: the {name} objective defines no "
                          "consistency term (R-Drop applies to objectives with consistency(output_a, output_b, "
                          "batch): classification and tagging); set training.rdrop_alpha 0")


def describe_recipes(config: TrainingConfig, model: nn.Module) -> list[str]:
    """One phrase per recipe the run has on, for the log line `recipes: ...`."""
    recipes = []
    if config.patience:
        recipes.append(f"early stopping after {config.patience} evaluations without an improvement > "
                       f"{config.min_delta:g}")
    if config.layer_lr_decay < 1.0:
        deepest = max(encoder_depths(model).values(), default=0)
        recipes.append(f"layer-wise lr decay {config.layer_lr_decay:g} (head at lr, embeddings at lr x "
                       f"{config.layer_lr_decay ** deepest:.3g})")
    if config.fgm_epsilon:
        recipes.append(f"FGM adversarial training, epsilon {config.fgm_epsilon:g}")
    if config.rdrop_alpha:
        recipes.append(f"R-Drop, alpha {config.rdrop_alpha:g}")
    if config.ema_decay:
        recipes.append(f"EMA of the weights, decay {config.ema_decay:g} (evaluated and saved: the average)")
    return recipes
