"""The one training loop, for pretraining and every fine-tuning task.

A task plugs in through three methods (no callbacks, no framework):

    task.counts(batch)              -> {term: count}          denominators, from the batch alone
    task.loss_terms(output, batch)  -> {term: (sum, count)}   loss sums of one micro-batch
    task.metrics(output, batch)     -> {name: (sum, count)}   e.g. correct predictions / labelled tokens

(`counts` may be left out by a task with a single loss term: see `WindowStep`.) R-Drop also asks
`task.consistency(output_a, output_b, batch)` -> a tensor: the disagreement of two dropout passes summed
over the items the task's first loss term counts. The model is called as `model(**batch.model_inputs())`;
the task computes its losses from the output and the batch.

The loss of an optimizer step is  sum over terms of  (sum of the term over all micro-batches and ranks) /
(its count over all micro-batches and ranks), i.e. the mean over every labelled item the step saw, however
the batch was split. The counts of the whole accumulation window are known before any forward pass (the
window is fetched first), all-reduced once, and each micro-batch backpropagates `sum / global_count`
(times world_size, because DDP averages gradients over ranks). So 1 process with batch 2B, 2 processes
with batch B, and batch B with 2 accumulation steps take the same step.

The batch source is an object with `__iter__` (one epoch of batches; a new `iter()` starts the next one),
optionally `__len__` (batches per epoch on this rank; needed for `epochs`), and `state_dict()` /
`load_state_dict()` describing the position of the next batch it will yield — it must count batches it
has *yielded*, not produced ahead. Batches have `.to(device)`, `.model_inputs()` (keyword arguments of the
model's forward) and `num_tokens`.

Around the model the loop applies: device placement, DDP, torch.compile, autocast (bf16/fp16) and fp16
loss scaling, gradient clipping, a finite check before every optimizer step, the warmup/decay schedule,
logging (metrics.jsonl, TensorBoard, progress bar), evaluation, checkpoints and exact resume.

With `best=BestCheckpoint(metric, lower_is_better, directory)` the loop also keeps the model of the best
evaluation: after each evaluation it compares `values[metric]` with the best so far and, when it is better,
saves the model (with the tokenizer and the extra files) to `directory`, replacing it atomically. The best
step and value are part of every training checkpoint, so a resumed run never replaces a better best with a
worse one.

Two more hooks serve fine-tuning: `save_also(step)` adds checkpoint steps besides `save_every` and the last
(fine-tuning checkpoints every epoch end), and `extra_state` — an object with `state_dict()` /
`load_state_dict(state)` — travels in every checkpoint and is restored on resume (fine-tuning keeps its
evaluation history and warnings there, so a resumed run reports every evaluation of the run).

Recipes (each a `TrainingConfig` field, off by default, combinable). They live in the loop, not in a task
or a callback, because each changes what a step, an evaluation or a checkpoint *is*, and only the loop sees
all three (accumulation, DDP sync, autocast and the loss scaler, exact resume):

- early stopping (`patience`, `min_delta`): after `patience` evaluations in a row that did not beat the
  best by more than `min_delta`, write a checkpoint and return (`TrainResult.stopped_early`). The count is
  checkpointed with the best so far; resuming a stopped run trains nothing.
- layer-wise learning-rate decay (`layer_lr_decay`): the optimizer's groups by encoder depth
  (`optim.parameter_groups`); the schedule scales each group's own base lr.
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

The extra passes run under the same autocast and loss scaler; under DDP only the last forward and
backward of the window's last micro-batch synchronise (the others run under `no_sync`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from bertforge import checkpoint_format
from bertforge.constants import TRAINING_STATE_NAME
from bertforge.errors import BertforgeError, CheckpointError, ConfigError, DataError
from bertforge.model.fast_paths import fast_paths_enabled, is_encoder, set_activation_checkpointing
from bertforge.runtime import (
    autocast,
    capture_rng_state,
    resolve_precision,
    restore_rng_state,
    set_seed,
)
from bertforge.training import distributed
from bertforge.training.checkpoint import (
    find_latest,
    load_training_state,
    plain,
    resolve_resume,
    save_checkpoint,
)
from bertforge.training.config import TrainingConfig
from bertforge.training.logging import MetricsLogger, Progress
from bertforge.training.optim import build_optimizer, build_scheduler, encoder_depths

log = logging.getLogger("bertforge.training")

# fp16 starts its loss scale at 2**16 and halves it on every overflow: up to 16 skipped steps in a row are
# the scaler calibrating itself, not divergence.
FP16_CALIBRATION_STEPS = 16


class NonFiniteLossError(BertforgeError, FloatingPointError):
    """Training diverged: the loss or gradients stayed NaN/inf for several consecutive steps."""


class Batch(Protocol):
    num_tokens: Any

    def to(self, device: torch.device) -> Batch: ...

    def model_inputs(self) -> dict[str, Any]: ...


class Task(Protocol):
    def counts(self, batch: Any) -> dict[str, Any]: ...

    def loss_terms(self, output: Any, batch: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor]]: ...

    def metrics(self, output: Any, batch: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor]]: ...


class MetricsSink(Protocol):
    def log(self, step: int, split: str, values: dict[str, float]) -> None: ...


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
class TrainResult:
    """What a finished `train` call reports.

    Attributes:
        step: optimizer steps completed (total_steps, unless the run stopped early).
        total_steps: the run's length in optimizer steps.
        train: the last logged training values (loss, loss_<term>, metrics, lr, grad_norm, tokens_per_s).
        eval: the last evaluation's values ({} without eval_fn).
        checkpoint: the final checkpoint directory (a loadable model directory).
        best_step: with `best`, the step of the best evaluation so far (None before any evaluation),
            counting evaluations before a resume.
        best_eval: that evaluation's values ({} without one).
        best_dir: with `best`, the directory holding the best evaluation's model.
        history: every event logged by this call: {"step", "split", "values"}.
        skipped_steps: optimizer steps skipped for non-finite loss/gradients.
        tokens: tokens seen by this call, summed over ranks.
        seconds: wall time of this call's training steps.
        resumed_from: the checkpoint this call continued from (None: a fresh run).
        start_step: the step this call started at (the checkpoint's step; 0 for a fresh run).
        stopped_early: early stopping ended the run at `step` (in this call, or in the run it resumed).
    """

    step: int
    total_steps: int
    train: dict[str, float] = field(default_factory=dict)
    eval: dict[str, float] = field(default_factory=dict)
    checkpoint: Path | None = None
    best_step: int | None = None
    best_eval: dict[str, float] = field(default_factory=dict)
    best_dir: Path | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    skipped_steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    resumed_from: Path | None = None
    start_step: int = 0
    stopped_early: bool = False

    def summary(self) -> str:
        """One readable line: steps, final training loss, the last evaluation, the final checkpoint."""
        nothing_trained = self.resumed_from is not None and self.step == self.start_step
        if nothing_trained and self.stopped_early:
            head = f"already stopped early at step {self.step} of {self.total_steps} (nothing trained)"
        elif nothing_trained and self.start_step >= self.total_steps:
            head = f"already complete at step {self.step} of {self.total_steps} (nothing trained)"
        else:
            start = f" (resumed at step {self.start_step})" if self.resumed_from is not None else ""
            verb = "stopped early at step" if self.stopped_early else "trained to step"
            head = f"{verb} {self.step} of {self.total_steps}{start} in {self.seconds:.1f} s"
            if self.stopped_early:
                head += " (the evaluations stopped improving: training.patience)"
        parts = [head]
        if "loss" in self.train:
            terms = ", ".join(f"{k[5:]} {v:.4g}" for k, v in self.train.items() if k.startswith("loss_"))
            parts.append(f"final loss {self.train['loss']:.4f}" + (f" ({terms})" if terms else ""))
        if self.eval:
            parts.append("eval " + ", ".join(f"{k} {v:.4g}" for k, v in self.eval.items()))
        if self.skipped_steps:
            parts.append(f"{self.skipped_steps} steps skipped (non-finite)")
        parts.append(f"checkpoint {self.checkpoint}" if self.checkpoint is not None else "no checkpoint")
        return "; ".join(parts)


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

    def add(self, terms: list[float], term_counts: list[float], metrics: list[float], metric_counts: list[float],
            tokens: float, grad_norm: float, skipped: bool) -> None:
        if not self.steps:
            self.term_sums, self.term_counts = [0.0] * len(terms), [0.0] * len(terms)
            self.metric_sums, self.metric_counts = [0.0] * len(metrics), [0.0] * len(metrics)
        for totals, new in ((self.term_sums, terms), (self.term_counts, term_counts),
                            (self.metric_sums, metrics), (self.metric_counts, metric_counts)):
            for i, value in enumerate(new):
                totals[i] += value
        self.tokens += tokens
        self.steps += 1
        self.skipped += int(skipped)
        if math.isfinite(grad_norm):
            self.grad_norm += grad_norm

    def values(self, term_names: list[str], metric_names: list[str]) -> dict[str, float]:
        losses = {f"loss_{n}": s / max(c, 1.0) for n, s, c in zip(term_names, self.term_sums, self.term_counts)}
        values = {"loss": sum(losses.values()), **losses}
        for name, s, c in zip(metric_names, self.metric_sums, self.metric_counts):
            values[name] = s / max(c, 1.0)
        values["grad_norm"] = self.grad_norm / max(self.steps - self.skipped, 1)
        if self.skipped:
            values["skipped_steps"] = self.skipped
        return values


def batches_per_epoch(batches: Any) -> int | None:
    """Batches per epoch on this rank: `len(batches)`, or `batches.steps_per_epoch` for an endless stream."""
    try:
        return len(batches)
    except TypeError:
        steps = getattr(batches, "steps_per_epoch", None)
        return int(steps) if steps is not None else None


def endless(batches: Iterable) -> Iterator:
    """Batches of epoch after epoch; a resumed source may first finish an epoch with zero batches."""
    empty_passes = 0
    while True:
        yielded = False
        for batch in batches:
            yielded = True
            yield batch
        empty_passes = 0 if yielded else empty_passes + 1
        if empty_passes >= 2:
            raise DataError("the batch source yielded no batches; check the data directory and the batch size "
                            "(a final partial batch may be dropped)")


def as_tensor(value: Any, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(value, dtype=torch.float32, device=device).detach().float()


@contextlib.contextmanager
def rng_preserved():
    """Run a block (evaluation) without consuming the training run's random streams."""
    state = capture_rng_state()
    try:
        yield
    finally:
        restore_rng_state(state)


def train(model: nn.Module, batches: Any, task: Task, config: TrainingConfig, *,
          eval_fn: Callable[[nn.Module, int], dict[str, float]] | None = None, tokenizer=None,
          best: BestCheckpoint | None = None, logger: MetricsSink | None = None,
          context: distributed.DistributedContext | None = None,
          save_also: Callable[[int], bool] | None = None, extra_state: Any = None) -> TrainResult:
    """Train `model` on `batches` with `task`'s losses; see the module docstring for the contracts.

    Args:
        model: a single-device bertforge model (BertPretrainedModel); moved to the run's device. With
            `ema_decay` it holds the averaged (EMA) weights when `train` returns.
        batches: the batch source (this rank's shard under DDP).
        task: counts / loss_terms / metrics for this model's outputs.
        config: the `[training]` settings.
        eval_fn: called as eval_fn(model, step) in eval mode under no_grad and autocast every `eval_every` steps
            and at the end, on every rank (it must all-reduce itself if its data is sharded); its dict is
            logged with split "eval". It never perturbs the training run's random streams.
        tokenizer: saved into every checkpoint, so each is a self-contained model directory.
        best: keep the best evaluation's model (see `BestCheckpoint`); None (pretraining) keeps none.
        logger: receives log events on the main process (default: MetricsLogger on config.out_dir).
        context: the distributed context when the caller has already joined the process group (a run
            that needed its rank before building the data); default: joined here.
        save_also: save_also(step) -> True writes a checkpoint after that step too (besides every
            `save_every` steps and the last); fine-tuning passes its epoch ends.
        extra_state: an object with `state_dict()` (plain values) and `load_state_dict(state)`, saved in every
            checkpoint and restored on resume (fine-tuning: its evaluation history).

    Returns:
        TrainResult with the final step, last logged values, final checkpoint and history.

    Raises:
        NonFiniteLossError: loss/gradients non-finite for `max_nonfinite_steps` consecutive steps.
        CheckpointError: a checkpoint (or the best model) could not be written or the resume checkpoint is
            unusable.
        ConfigError: `best.metric` is not among the evaluation's values; a recipe the run cannot apply
            (patience without evaluations, R-Drop without `task.consistency`, FGM without word embeddings,
            layer-wise decay without an encoder), before any step.
    """
    check_recipes(config, task, eval_fn, best)
    context = context or distributed.setup(config.device)
    device, rank, world = context.device, context.rank, context.world_size
    precision = resolve_precision(config.precision, device)
    out_dir = Path(config.out_dir)
    # Rank 0 looks at the directory; every rank then acts on the same answer (or raises the same error).
    found = (resolve_resume(config.resume, out_dir), find_latest(out_dir)) if context.is_main else None
    resume_from, existing = distributed.broadcast_object(found)
    if resume_from is None and existing is not None and config.resume == "never":
        raise ConfigError(f"{out_dir} already holds checkpoints of an earlier run (latest: {existing.name}); "
                          "continue it with --training.resume=auto, or choose another training.out_dir "
                          "(two runs' checkpoints in one directory would make resuming ambiguous)")
    if resume_from is None and config.resume == "auto" and context.is_main:
        log.info("resume auto: no checkpoint (checkpoint-<step>/ with %s) in %s; starting a fresh run",
                 TRAINING_STATE_NAME, out_dir)

    set_seed(config.seed + rank, config.deterministic)
    model.to(device)
    model.train()
    total_steps = config.total_steps(batches_per_epoch(batches))
    warmup_steps = config.resolved_warmup(total_steps)
    optimizer = build_optimizer(model, config, device)
    scheduler = build_scheduler(optimizer, warmup_steps, total_steps, config.schedule)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    fgm_weight = word_embedding_weight(model) if config.fgm_epsilon > 0 else None
    ema = WeightAverage(model, config.ema_decay) if config.ema_decay > 0 else None

    restored = Restored()
    if resume_from is not None:
        restored = restore_run(resume_from, model, batches, optimizer, scheduler, scaler, rank, world, extra_state,
                               ema)
        if context.is_main:
            log.info("resuming from %s at step %d of %d", resume_from, restored.step, total_steps)
    step, skipped_total, window, kept = restored.step, restored.skipped, restored.window, restored.kept

    if logger is None and context.is_main:
        logger = MetricsLogger(out_dir, tensorboard=config.tensorboard)
    if context.is_main and logger is not None and hasattr(logger, "start"):
        logger.start(step if resume_from is not None else None)
    describe_run(model, batches, config, total_steps, warmup_steps, precision, device, world, context.is_main)

    if config.activation_checkpointing:
        if not fast_paths_enabled(set_activation_checkpointing(model))["activation_checkpointing"]:
            raise ConfigError("training.activation_checkpointing needs a bertforge encoder in the model")
    runner = distributed.wrap_model(model, context)
    if ema is not None and resume_from is None:
        ema.reset()  # from the weights DDP just broadcast from rank 0, so every rank averages the same model
    if config.compile:
        runner = torch.compile(runner)
    ddp = runner if isinstance(runner, nn.parallel.DistributedDataParallel) else None
    if ddp is None and hasattr(runner, "_orig_mod") and isinstance(runner._orig_mod, nn.parallel.DistributedDataParallel):
        ddp = runner._orig_mod
    params = [p for p in model.parameters() if p.requires_grad]
    clip_norm = config.max_grad_norm if config.max_grad_norm > 0 else float("inf")
    nonfinite_limit = config.max_nonfinite_steps + (FP16_CALIBRATION_STEPS if precision == "fp16" else 0)

    result = TrainResult(step=step, total_steps=total_steps, checkpoint=resume_from, skipped_steps=skipped_total,
                         resumed_from=resume_from, start_step=step, stopped_early=restored.stopped_early)
    if best is not None:
        result.best_step, result.best_eval, result.best_dir = kept.step, dict(kept.values), Path(best.directory)
    if step >= total_steps or restored.stopped_early:
        if restored.stopped_early:
            log.info("the run in %s stopped early at step %d of %d (training.patience); nothing to train",
                     out_dir, step, total_steps)
        else:
            log.info("the run in %s is already complete (step %d of %d)", out_dir, step, total_steps)
        if ema is not None:
            ema.finish()
        close_logger(logger)
        return result

    def emit(split: str, values: dict[str, float]) -> None:
        result.history.append({"step": step, "split": split, "values": dict(values)})
        if split == "eval":
            result.eval = dict(values)
        else:
            result.train = dict(values)
        if context.is_main and logger is not None:
            logger.log(step, split, values)

    def evaluate() -> bool:
        """Evaluate (on the EMA weights when kept); True when early stopping says this was the last one."""
        with ema.applied() if ema is not None else contextlib.nullcontext():
            model.eval()
            with rng_preserved(), torch.no_grad(), autocast(device, precision):
                values = eval_fn(model, step)
            model.train()
            values = {k: float(v) for k, v in values.items()}
            emit("eval", values)
            return keep_if_best(values) if best is not None else False

    def keep_if_best(values: dict[str, float]) -> bool:
        value = best.value_of(values)
        # Rank 0 decides, so every rank takes the same branch (and joins the same broadcasts).
        improved, significant, value, values = distributed.broadcast_object(
            (best.improves(value, kept.value), best.improves(value, kept.value, config.min_delta), value, values))
        kept.stale = 0 if significant else kept.stale + 1
        stop = config.patience > 0 and kept.stale >= config.patience
        if not improved:
            return stop
        error = None
        if context.is_main:
            try:
                checkpoint_format.save_model(model, best.directory, tokenizer=tokenizer,
                                             extra_files=dict(best.extra_files))
            except (CheckpointError, OSError) as exc:
                error = f"{best.directory}: the best model (step {step}) could not be saved ({exc})"
        error = distributed.broadcast_object(error)
        if error is not None:
            raise CheckpointError(error)
        kept.step, kept.value, kept.values = step, value, dict(values)
        result.best_step, result.best_eval = step, dict(values)
        if context.is_main:
            log.info("step %d: best %s so far (%.6g); saved to %s", step, best.metric, value, best.directory)
        if best.on_best is not None:
            best.on_best(step, dict(values))
        return stop

    def log_window() -> None:
        nonlocal window, window_started
        now = time.perf_counter()
        values = window.values(window_step.term_names, window_step.metric_names)
        values["lr"] = lr
        values["tokens_per_s"] = window.tokens / max(now - window_started, 1e-9)
        per_epoch = batches_per_epoch(batches)
        if per_epoch:
            values["epoch"] = step * config.grad_accumulation / per_epoch
        emit("train", values)
        window, window_started = LogWindow(), now

    window_step = WindowStep(runner, ddp, task, scaler, device, precision, world, params,
                             rdrop_alpha=config.rdrop_alpha, fgm_epsilon=config.fgm_epsilon, fgm_weight=fgm_weight)
    consecutive_nonfinite = 0
    stream = endless(batches)
    progress = Progress(total_steps, step, enabled=config.progress and context.is_main)
    if restored.rng is not None:
        # Last, after everything that may draw random numbers (model and optimizer construction).
        restore_rng_state(restored.rng)
    started = time.perf_counter()
    window_started = started
    try:
        while step < total_steps:
            micro_batches = [next(stream).to(device) for _ in range(config.grad_accumulation)]

            stats = window_step(micro_batches)
            if precision == "fp16":
                scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, clip_norm)
            # One device->host transfer per step: the logged numbers and the finite check.
            host = torch.cat([stats, grad_norm.detach().float().view(1)]).tolist()
            step_sums, step_counts, step_metric_sums, step_metric_counts, step_tokens = window_step.split(host[:-1])
            step_grad_norm = host[-1]
            step_loss = sum(s / max(c, 1.0) for s, c in zip(step_sums, step_counts))
            finite = math.isfinite(step_loss) and math.isfinite(step_grad_norm)

            lr = optimizer.param_groups[0]["lr"]
            if finite:
                consecutive_nonfinite = 0
                if precision == "fp16":
                    scaler.step(optimizer)
                else:
                    optimizer.step()
                if ema is not None:
                    ema.update()
            else:
                consecutive_nonfinite += 1
                skipped_total += 1
                scale = f" (loss scale {scaler.get_scale():g})" if precision == "fp16" else ""
                log.warning("step %d: non-finite loss %s / gradient norm %s%s; skipping this update",
                            step + 1, step_loss, step_grad_norm, scale)
                if consecutive_nonfinite >= nonfinite_limit:
                    raise NonFiniteLossError(
                        f"step {step + 1}: loss or gradients were NaN/inf for {consecutive_nonfinite} consecutive "
                        f"steps ({precision}, lr {lr:.3g}); lower training.lr (e.g. --training.lr={lr / 4:.2g}), "
                        "lengthen warmup, keep max_grad_norm > 0, use bf16 instead of fp16, and check the data "
                        "for empty or corrupt batches; earlier checkpoints are intact")
            if precision == "fp16":
                scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            step += 1

            window.add(step_sums, step_counts, step_metric_sums, step_metric_counts, step_tokens,
                       step_grad_norm, skipped=not finite)
            result.tokens += int(step_tokens)
            result.skipped_steps = skipped_total
            progress.update(1, loss=step_loss, tok_s=f"{result.tokens / (time.perf_counter() - started):.0f}")

            if step % config.log_every == 0 or step == total_steps:
                log_window()
            stop = False
            if eval_fn is not None and ((config.eval_every and step % config.eval_every == 0)
                                        or step == total_steps):
                stop = evaluate() and step < total_steps
            if stop:
                result.stopped_early = True
                if window.steps:
                    log_window()  # the steps since the last log line, which no later line will carry
                if context.is_main:
                    log.info("step %d: %d evaluations in a row without improving %s by more than %g; stopping "
                             "early (training.patience=%d)", step, kept.stale, best.metric, config.min_delta,
                             config.patience)
            if ((config.save_every and step % config.save_every == 0) or step == total_steps or stop
                    or (save_also is not None and save_also(step))):
                result.checkpoint = write_checkpoint(
                    context, out_dir, step, model, batches, optimizer, scheduler, scaler, window,
                    skipped_total, config, tokenizer, kept, extra_state, ema=ema, stopped_early=stop)
            if stop:
                break
    finally:
        progress.close()
        close_logger(logger)
    if ema is not None:
        ema.finish()
    result.step = step
    result.seconds = time.perf_counter() - started
    if context.is_main:
        log.info("finished %d steps in %.1f s; final checkpoint %s", step, result.seconds, result.checkpoint)
    return result


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
    def update(self) -> None:
        weights = [p.detach().float() for p in self.params]
        torch._foreach_mul_(self.shadow, self.decay)
        torch._foreach_add_(self.shadow, weights, alpha=1.0 - self.decay)

    @contextlib.contextmanager
    def applied(self):
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
        return {"decay": self.decay, "shadow": dict(zip(self.names, self.shadow)), "raw": dict(zip(self.names, raw))}

    def load_shadow(self, shadow: Mapping[str, torch.Tensor], path: Path) -> None:
        missing = [n for n in self.names if n not in shadow]
        if missing:
            raise CheckpointError(f"{path}: its EMA state lacks {missing[:3]}; resume with the same model "
                                  "settings the run started with")
        for index, name in enumerate(self.names):
            self.shadow[index] = shadow[name].to(self.params[index].device, torch.float32).clone()


class WindowStep:
    """Forward and backward of one accumulation window, with each loss term divided by its global count.

    With `task.counts`, the counts of the window are all-reduced before the first forward and every
    micro-batch backpropagates `sum / global_count * world_size`. A task without `counts` may have a single
    loss term: its micro-batches backpropagate `sum * world_size` and the accumulated gradients are divided
    by the global count afterwards — the same gradients, as the count is one number. Several terms need
    `counts` (each has its own denominator).

    Per micro-batch, R-Drop (`rdrop_alpha`) runs the forward twice and adds the term `rdrop`, counted like
    the task's first term; FGM (`fgm_epsilon`) then backpropagates the task's loss (one pass) once more with
    the word embeddings perturbed, logged as the metrics `adv_<term>`. Under DDP only the micro-batch's last
    forward of the window's last micro-batch synchronises: DDP prepares its reducer once per backward, and
    FGM's direction is this rank's own gradient.
    """

    def __init__(self, runner: nn.Module, ddp: nn.Module | None, task: Task, scaler, device: torch.device,
                 precision: str, world: int, params: list[nn.Parameter], *, rdrop_alpha: float = 0.0,
                 fgm_epsilon: float = 0.0, fgm_weight: nn.Parameter | None = None):
        self.runner, self.ddp, self.task, self.scaler = runner, ddp, task, scaler
        self.device, self.precision, self.world, self.params = device, precision, world, params
        self.rdrop_alpha, self.fgm_epsilon, self.fgm_weight = rdrop_alpha, fgm_epsilon, fgm_weight
        if fgm_epsilon > 0 and fgm_weight is None:
            raise ValueError("WindowStep: FGM needs the word-embedding weight")
        self.counts_first = hasattr(task, "counts")
        self.task_terms: list[str] = []
        self.task_metrics: list[str] = []

    @property
    def term_names(self) -> list[str]:
        return self.task_terms + (["rdrop"] if self.rdrop_alpha > 0 else [])

    @property
    def metric_names(self) -> list[str]:
        return self.task_metrics + ([f"adv_{n}" for n in self.task_terms] if self.fgm_epsilon > 0 else [])

    def synced(self, sync: bool):
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

    def __call__(self, micro_batches: list[Any]) -> torch.Tensor:
        """Run the window; return the global statistics vector (see `split`); gradients are left in .grad."""
        device = self.device
        task_denominators = denominators = counts = None
        if self.counts_first:
            window_counts: dict[str, torch.Tensor] = {}
            for batch in micro_batches:
                for name, count in self.task.counts(batch).items():
                    window_counts[name] = window_counts.get(name, 0) + as_tensor(count, device)
            if not self.task_terms:
                self.task_terms = list(window_counts)
            counts = distributed.all_reduce_sum(torch.stack([window_counts[n] for n in self.task_terms]))
            task_denominators = counts.clamp(min=1.0)
            if self.rdrop_alpha > 0:  # the consistency term is counted like the task's first term
                counts = torch.cat([counts, counts[:1]])
            denominators = counts.clamp(min=1.0)

        term_stats = metric_stats = None
        tokens = torch.zeros(1, device=device)
        for index, batch in enumerate(micro_batches):
            last = index == len(micro_batches) - 1
            clean_sync = last and self.fgm_epsilon == 0
            before = None
            if self.fgm_epsilon > 0 and self.fgm_weight.grad is not None:
                before = self.fgm_weight.grad.detach().clone()  # what earlier micro-batches accumulated
            if self.rdrop_alpha > 0:
                output = self.forward(batch, sync=False)
                second = self.forward(batch, sync=clean_sync)
                sums_a, term_counts = self.task_sums(output, batch)
                sums_b, _ = self.task_sums(second, batch)
                consistency = self.task.consistency(output, second, batch)
                if isinstance(consistency, tuple):  # (sum, count): the count is the first term's, by contract
                    consistency = consistency[0]
                sums = torch.cat([(sums_a + sums_b) / 2, (self.rdrop_alpha * consistency.float()).view(1)])
                term_counts = torch.cat([term_counts, term_counts[:1]])
            else:
                output = self.forward(batch, sync=clean_sync)
                sums, term_counts = self.task_sums(output, batch)
            self.backward(sums, denominators, clean_sync)
            stats = torch.cat([sums.detach(), term_counts])
            term_stats = stats if term_stats is None else term_stats + stats

            measured = self.task.metrics(output, batch)
            if not self.task_metrics:
                self.task_metrics = list(measured)
            metric_sums = [as_tensor(measured[n][0], device).view(1) for n in self.task_metrics]
            metric_counts = [as_tensor(measured[n][1], device).view(1) for n in self.task_metrics]
            if self.fgm_epsilon > 0:
                adv_sums, adv_counts = self.adversarial(batch, before, task_denominators, sync=last)
                metric_sums.append(adv_sums)
                metric_counts.append(adv_counts)
            stats = torch.cat(metric_sums + metric_counts) if metric_sums else torch.zeros(0, device=device)
            metric_stats = stats if metric_stats is None else metric_stats + stats
            tokens += as_tensor(batch.num_tokens, device)

        n = len(self.term_names)
        if denominators is not None:
            # The loss is normalised by counts(); report those counts, not loss_terms' own.
            term_stats = torch.cat([term_stats[:n], denominators.new_zeros(n)])
        stats = distributed.all_reduce_sum(torch.cat([term_stats, metric_stats, tokens]))
        if denominators is not None:
            stats[n:2 * n] = counts
        else:
            scale = 1.0 / stats[n].clamp(min=1.0)  # the single term's global count
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(scale.to(p.grad.dtype))
        return stats

    def adversarial(self, batch: Any, before: torch.Tensor | None, denominators: torch.Tensor | None,
                    sync: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """FGM: backpropagate the task's loss with the word embeddings moved by eps * g / ||g||, g being this
        micro-batch's gradient on them; restore them from a copy. Returns the adversarial (sums, counts)."""
        weight = self.fgm_weight
        grad = weight.grad
        if grad is None:
            grad = torch.zeros_like(weight)
        elif before is not None:
            grad = grad - before
        grad = grad.detach().float()
        # The loss scale and the denominators only scale g: its direction is the same.
        delta = grad * (self.fgm_epsilon / grad.norm().clamp(min=1e-30))
        saved = weight.detach().clone()
        with torch.no_grad():
            weight.add_(delta.to(weight.dtype))
        try:
            output = self.forward(batch, sync)
            sums, counts = self.task_sums(output, batch)
            self.backward(sums, denominators, sync)
        finally:
            with torch.no_grad():
                weight.copy_(saved)  # a copy, not weight - delta: rounding would drift the embeddings
        return sums.detach(), counts

    def split(self, values: list[float]) -> tuple[list[float], list[float], list[float], list[float], float]:
        """(term sums, term counts, metric sums, metric counts, tokens) of a statistics vector."""
        n, m = len(self.term_names), len(self.metric_names)
        return (values[:n], values[n:2 * n], values[2 * n:2 * n + m], values[2 * n + m:2 * n + 2 * m],
                values[2 * n + 2 * m])


def close_logger(logger: Any) -> None:
    if logger is not None and hasattr(logger, "close"):
        logger.close()


def describe_run(model: nn.Module, batches: Any, config: TrainingConfig, total_steps: int, warmup_steps: int,
                 precision: str, device: torch.device, world: int, is_main: bool) -> None:
    """Log the arithmetic people ask about: examples per step, steps per epoch, epochs, parameters, and the
    recipes that are on."""
    if not is_main:
        return
    per_step = config.batch_size * config.grad_accumulation * world
    per_epoch = batches_per_epoch(batches)
    epochs = ""
    if per_epoch:
        steps_per_epoch = per_epoch / config.grad_accumulation
        epochs = f"; {steps_per_epoch:g} steps per epoch, {total_steps / steps_per_epoch:.3g} epochs"
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.info("training %d steps (warmup %d) of %d examples (batch %d x accumulation %d x %d processes)%s; "
             "%s, %s, %s on %s; %.1fM trainable parameters", total_steps, warmup_steps, per_step,
             config.batch_size, config.grad_accumulation, world, epochs, config.optimizer, config.schedule,
             precision, device, trainable / 1e6)
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
    if recipes:
        log.info("recipes: %s", "; ".join(recipes))


@dataclass
class BestSoFar:
    """The best evaluation of a run so far (saved in every checkpoint as `best`, restored on resume), and
    `stale`: the evaluations since the last one that beat the best by more than `min_delta` (patience)."""

    step: int | None = None
    value: float | None = None
    values: dict[str, float] = field(default_factory=dict)
    stale: int = 0


@dataclass
class Restored:
    """Where a run continues: what `restore_run` read from a checkpoint (a fresh run: the defaults)."""

    step: int = 0
    skipped: int = 0
    window: LogWindow = field(default_factory=LogWindow)
    rng: dict | None = None
    kept: BestSoFar = field(default_factory=BestSoFar)
    stopped_early: bool = False


def restore_run(path: Path, model: nn.Module, batches: Any, optimizer, scheduler, scaler, rank: int,
                world: int, extra_state: Any = None, ema: WeightAverage | None = None) -> Restored:
    """Load checkpoint `path` into the run's objects (and the caller's `extra_state`, when the checkpoint has
    one, and the EMA shadow); return where the run continues.

    The RNG state is returned, not applied: the caller restores it last, after everything that draws.
    """
    state = load_training_state(path)
    restore_model_weights(model, path)
    saved_ema = state.get("ema")
    if saved_ema is not None:
        # The model directory holds the averaged weights; training continues from the raw ones.
        load_parameters(model, saved_ema["raw"], path)
        if ema is not None:
            ema.load_shadow(saved_ema["shadow"], path)
        else:
            log.warning("%s was written with training.ema_decay=%g; continuing without EMA from the raw "
                        "weights", path, saved_ema["decay"])
    elif ema is not None:
        log.warning("%s was written without EMA: the average starts at its weights", path)
        ema.reset()
    restore_optimizer(optimizer, scheduler, scaler, state, path)
    data_states, saved_world = state.get("data"), int(state.get("world_size", 1))
    rng_state = None
    if saved_world == world:
        rng_state = state["rng"][rank]
        data_state = None if data_states is None else data_states[rank]
    elif data_states is not None and any(d != data_states[0] for d in data_states):
        raise CheckpointError(f"{path}: written by {saved_world} processes, now {world}, and the batch source "
                              "keeps a separate position per rank; resume with the same number of processes, "
                              "or start a new run from this model directory")
    else:
        # A global data position (the same on every rank) carries over; the random streams cannot.
        log.warning("resuming a %d-process run with %d processes: same data position, but dropout draws differ "
                    "from the uninterrupted run", saved_world, world)
        data_state = None if data_states is None else data_states[0]
    if data_state is not None and hasattr(batches, "load_state_dict"):
        batches.load_state_dict(data_state)
    kept = BestSoFar(**state["best"]) if state.get("best") else BestSoFar()
    if extra_state is not None and state.get("extra") is not None:
        extra_state.load_state_dict(state["extra"])
    return Restored(int(state["step"]), int(state.get("skipped_steps", 0)), LogWindow(**state.get("log_window", {})),
                    rng_state, kept, bool(state.get("stopped_early", False)))


def restore_model_weights(model: nn.Module, path: Path) -> None:
    """Copy the checkpoint's weights into `model` in place (the optimizer keeps referring to them)."""
    loaded, _ = checkpoint_format.load_model(path, type(model))
    try:
        model.load_state_dict(loaded.state_dict())
    except RuntimeError as exc:
        raise CheckpointError(f"{path}: its weights do not fit this model ({exc}); resume with the same "
                              "model settings the run started with") from None


@torch.no_grad()
def load_parameters(model: nn.Module, tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    """Copy {parameter name: tensor} into the model's trainable parameters, in place."""
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if name not in tensors or tensors[name].shape != param.shape:
            raise CheckpointError(f"{path}: its raw training weights do not fit this model ({name}); resume "
                                  "with the same model settings the run started with")
        param.copy_(tensors[name])


def restore_optimizer(optimizer, scheduler, scaler, state: dict[str, Any], path: Path) -> None:
    try:
        optimizer.load_state_dict(state["optimizer"])
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"{path}: optimizer state does not match this run ({exc}); resume with the same "
                              "training.optimizer, training.layer_lr_decay and frozen/trainable parameters, or "
                              "start a new run from this model directory (--training.resume=never with it as "
                              "the model)") from None
    # The schedule follows the current config (so a run can be extended); its position comes from the step.
    # Each group keeps its own base lr (layer-wise decay), from the current config too.
    saved = {k: v for k, v in state["scheduler"].items() if k != "base_lrs"}
    scheduler.load_state_dict({**saved, "lr_lambdas": [None] * len(scheduler.lr_lambdas)})
    for group, base in zip(optimizer.param_groups, scheduler.base_lrs):
        group["lr"] = base * scheduler.lr_lambdas[0](scheduler.last_epoch)
    if scaler.is_enabled() and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])


def write_checkpoint(context, out_dir: Path, step: int, model: nn.Module, batches: Any, optimizer, scheduler,
                     scaler, window: LogWindow, skipped: int, config: TrainingConfig, tokenizer,
                     kept: BestSoFar | None = None, extra_state: Any = None, *, ema: WeightAverage | None = None,
                     stopped_early: bool = False) -> Path:
    """Gather every rank's RNG state and data position; the main process writes; all ranks agree on errors.

    With `ema` the directory's model weights are the average; the raw weights and the shadow go into the
    training state."""
    rng = distributed.all_gather_object(capture_rng_state())
    data = distributed.all_gather_object(plain(batches.state_dict()) if hasattr(batches, "state_dict") else None)
    path, error = None, None
    if context.is_main:
        state = {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(),
            "rng": rng,
            "data": data,
            "world_size": context.world_size,
            "log_window": window.__dict__,
            "skipped_steps": skipped,
            "best": dataclasses.asdict(kept) if kept is not None else None,
            "config": plain(dataclasses.asdict(config)),
            "extra": plain(extra_state.state_dict()) if extra_state is not None else None,
            "stopped_early": stopped_early,
        }
        try:
            with ema.applied() if ema is not None else contextlib.nullcontext() as raw:
                if ema is not None:
                    state["ema"] = ema.state_dict(raw)
                path = save_checkpoint(out_dir, step, model, state, tokenizer=tokenizer, keep_last=config.keep_last)
        except CheckpointError as exc:
            error = str(exc)
    error = distributed.broadcast_object(error)
    if error is not None:
        raise CheckpointError(error)
    return distributed.broadcast_object(path)
