"""The one training loop, for pretraining and every fine-tuning task: `train`, and the small objects its
steps are made of (`Updater`: the optimizer step; `RunReport`: what the run logs and returns).

A task plugs in through three methods (no callbacks, no framework):

    task.counts(batch)              -> {term: count}          denominators, from the batch alone
    task.loss_terms(output, batch)  -> {term: (sum, count)}   loss sums of one micro-batch
    task.metrics(output, batch)     -> {name: (sum, count)}   e.g. correct predictions / labelled tokens

(`counts` may be left out by a task with a single loss term: see `accumulation.WindowStep`.) R-Drop also
asks `task.consistency(output_a, output_b, batch)` -> a tensor: the disagreement of two dropout passes
summed over the items the task's first loss term counts; a task with `at_step(step, total_steps)` is told
the optimizer step (0-based) before its window runs (sparse training's regulariser warm-up). The model is called as
`model(**batch.model_inputs())`; the task computes its losses from the output and the batch.

The loss of an optimizer step is  sum over terms of  (sum of the term over all micro-batches and ranks) /
(its count over all micro-batches and ranks), i.e. the mean over every labelled item the step saw, however
the batch was split. The counts of the whole accumulation window are known before any forward pass (the
window is fetched first), all-reduced once, and each micro-batch backpropagates `sum / global_count`
(times world_size, because DDP averages gradients over ranks). So 1 process with batch 2B, 2 processes
with batch B, and batch B with 2 accumulation steps take the same step.

The batch source is an object with `__iter__` (one epoch of batches; a new `iter()` starts the next one),
optionally `__len__` (batches per epoch on this rank; needed for `epochs`), and `state_dict()` /
`load_state_dict()` describing the position of the next batch it will yield — it must count batches it
has *yielded*, not produced ahead; a position of the global stream (the same on every rank) lets a run
resume on another number of processes, where the accumulation adapts to keep the global batch
(`resume.keep_global_batch`). A source with a `grad_accumulation` attribute gets the run's, so that its
epochs end on an optimizer step. Batches have `.to(device)`, `.model_inputs()` (keyword arguments of the
model's forward) and `num_tokens`.

Around the model the loop applies: device placement, DDP, torch.compile, autocast (bf16/fp16) and fp16
loss scaling, gradient clipping, a finite check before every optimizer step, the warmup/decay schedule,
logging (metrics.jsonl, TensorBoard, progress bar), evaluation, checkpoints and exact resume
(`training.resume`).

The recipes are pieces the loop calls, each in `training.recipes` (described there): the best model
(`best=BestCheckpoint(metric, lower_is_better, directory)`), early stopping (`patience`, `min_delta`),
layer-wise lr decay (the optimizer's groups), FGM (`fgm_epsilon`), R-Drop (`rdrop_alpha`) and the EMA of the
weights (`ema_decay`). Their extra passes run under the same autocast and loss scaler; under DDP only the
last forward and backward of the window's last micro-batch synchronise (the others run under `no_sync`).

Two more hooks serve fine-tuning: `save_also(step)` adds checkpoint steps besides `save_every` and the last
(fine-tuning checkpoints every epoch end), and `extra_state` — an object with `state_dict()` /
`load_state_dict(state)` — travels in every checkpoint and is restored on resume (fine-tuning keeps its
evaluation history and warnings there, so a resumed run reports every evaluation of the run).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from bertforge.errors import ConfigError, DataError
from bertforge.model.fast_paths import fast_paths_enabled, set_activation_checkpointing, set_value_checks
from bertforge.runtime import autocast, capture_rng_state, resolve_precision, restore_rng_state, set_seed
from bertforge.training import distributed
from bertforge.training.accumulation import LogWindow, WindowStep
from bertforge.training.config import TrainingConfig
from bertforge.training.interrupt import StepInterrupt
from bertforge.training.logging import MetricsLogger, Progress
from bertforge.training.optim import build_optimizer
from bertforge.training.recipes import (
    BestCheckpoint,
    BestKeeper,
    Cadence,
    EarlyStopping,
    Fgm,
    RDrop,
    WeightAverage,
    averaged,
    check_recipes,
    describe_recipes,
    word_embedding_weight,
)
from bertforge.training.resume import Restored, RunState, keep_global_batch, resume_point, saved_layout
from bertforge.training.schedules import schedule_for
from bertforge.training.updates import DeviceOutcome, NonFiniteLossError, StepOutcome, Updater

__all__ = ["NonFiniteLossError", "TrainResult", "train"]

log = logging.getLogger("bertforge.training")

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


def train(model: nn.Module, batches: Any, task: Task, config: TrainingConfig, *,
          eval_fn: Callable[[nn.Module, int], dict[str, float]] | None = None, tokenizer=None,
          best: BestCheckpoint | None = None, logger: MetricsSink | None = None,
          context: distributed.DistributedContext | None = None, save_also: Callable[[int], bool] | None = None,
          extra_state: Any = None, clock: Callable[[], float] | None = None) -> TrainResult:
    """Train `model` on `batches` with `task`'s losses; see the module docstring for the contracts.

    Args:
        model: a single-device bertforge model; moved to the run's device. With `ema_decay` it holds the
            averaged (EMA) weights when `train` returns.
        batches: the batch source (this rank's shard under DDP).
        task: counts / loss_terms / metrics for this model's outputs.
        config: the `[training]` settings.
        eval_fn: called as eval_fn(model, step) in eval mode under no_grad and autocast every `eval_every` steps
            and at the end, on every rank (it must all-reduce itself if its data is sharded); its dict is
            logged with split "eval". It never perturbs the training run's random streams.
        tokenizer: saved into every checkpoint, so each is a self-contained model directory.
        best: keep the best evaluation's model (see `recipes.BestCheckpoint`); None (pretraining) keeps none.
        logger: receives log events on the main process (default: MetricsLogger on config.out_dir).
        context: the distributed context when the caller has joined the process group (default: joined here).
        save_also: save_also(step) -> True writes a checkpoint after that step too (fine-tuning: epoch ends).
        extra_state: an object with `state_dict()` (plain values) and `load_state_dict(state)`, saved in every
            checkpoint and restored on resume (fine-tuning: its evaluation history).
        clock: with a time budget (`minutes`), the seconds the schedule reads (default `schedules.budget_clock`).

    Raises:
        NonFiniteLossError: loss/gradients non-finite for `max_nonfinite_steps` consecutive steps.
        CheckpointError: a checkpoint (or the best model) could not be written or the resume checkpoint is
            unusable.
        ConfigError: `best.metric` is not among the evaluation's values; a recipe the run cannot apply
            (patience without evaluations, R-Drop without `task.consistency`, FGM without word embeddings,
            layer-wise decay without an encoder), before any step.
    """
    check_recipes(config, task, eval_fn, best)
    context = context or distributed.setup(config.device, config.distributed_timeout_s)
    precision = resolve_precision(config.precision, context.device)
    resume_from = resume_point(config, context)
    if resume_from is not None:  # another world size: the accumulation adapts to keep the global batch
        config = keep_global_batch(config, saved_layout(resume_from), context.world_size, str(resume_from),
                                   announce=context.is_main)
    if hasattr(batches, "grad_accumulation"):
        batches.grad_accumulation = config.grad_accumulation  # so that the source's epochs end on a step

    set_seed(config.seed + context.rank, config.deterministic)
    model.to(context.device)
    model.train()
    total_steps = config.total_steps(batches_per_epoch(batches))
    warmup_steps = config.resolved_warmup(total_steps)
    optimizer = build_optimizer(model, config, context.device)
    scheduler = schedule_for(optimizer, config, total_steps, warmup_steps, world_size=context.world_size,
                             clock=clock)
    scaler = torch.amp.GradScaler(context.device.type, enabled=precision == "fp16")
    fgm = Fgm(word_embedding_weight(model), config.fgm_epsilon) if config.fgm_epsilon > 0 else None
    ema = WeightAverage(model, config.ema_decay) if config.ema_decay > 0 else None
    state = RunState(model, batches, optimizer, scheduler, scaler, config, context, tokenizer, extra_state, ema)
    restored = Restored() if resume_from is None else state.restore(resume_from)
    if resume_from is not None and context.is_main:
        log.info("resuming from %s at step %d of %d", resume_from, restored.step, total_steps)

    logger = open_logger(logger, config, context, restored.step if resume_from is not None else None)
    describe_run(model, batches, config, total_steps, warmup_steps, precision, context)
    runner, ddp = prepare_runner(model, config, context)
    if ema is not None and resume_from is None:
        ema.reset()  # from the weights DDP just broadcast from rank 0, so every rank averages the same model
    stopping = EarlyStopping(config.patience, config.min_delta)
    keeper = None if best is None else BestKeeper(best, restored.kept, stopping, tokenizer, context.is_main)
    result = TrainResult(restored.step, total_steps, checkpoint=resume_from, skipped_steps=restored.skipped,
                         resumed_from=resume_from, start_step=restored.step, stopped_early=restored.stopped_early)
    report = RunReport(result, logger, context.is_main, keeper)
    if restored.step >= total_steps or restored.stopped_early or getattr(scheduler, "spent", False):
        return report.nothing_to_train(config.out_dir, ema)

    params = [p for p in model.parameters() if p.requires_grad]
    window_step = WindowStep(runner, ddp, task, scaler, context.device, precision, context.world_size, params,
                             rdrop=RDrop(config.rdrop_alpha) if config.rdrop_alpha > 0 else None, fgm=fgm)
    updater = Updater(optimizer, scheduler, scaler, params, config, precision, ema, skipped=restored.skipped)
    evaluation = None if eval_fn is None else Evaluation(eval_fn, model, ema, context.device, precision, keeper,
                                                         report)
    return run_steps(state, restored, endless(batches), window_step, updater, evaluation,
                     Cadence.of(config, total_steps, eval_fn is not None, save_also), report)


def run_steps(state: RunState, restored: Restored, stream: Iterator, window_step: WindowStep, updater: Updater,
              evaluation: Evaluation | None, cadence: Cadence, report: RunReport) -> TrainResult:
    """The steps from `restored.step` to the end of the run (or early stopping): per step, fetch the window,
    forward and backward, the optimizer step, then log, evaluate and save as `cadence` says."""
    config, step = state.config, restored.step
    report.start(restored.window, state.batches, config.grad_accumulation,
                 progress=config.progress and state.context.is_main)
    if restored.rng is not None:
        # Last, after everything that may draw random numbers (model and optimizer construction).
        restore_rng_state(restored.rng)
    report.start_clock()
    if hasattr(state.scheduler, "start"):
        state.scheduler.start()  # a time budget's clock
    interrupt = StepInterrupt(state.context.world_size)  # Ctrl-C: save this step, then stop
    try:
        while step < cadence.total_steps:
            micro_batches = [next(stream).to(window_step.device) for _ in range(config.grad_accumulation)]
            window_step.at_step(step, cadence.total_steps)
            done = updater(window_step(micro_batches), window_step, step)
            step += 1
            report.add(step, done, updater.skipped)
            if getattr(state.scheduler, "spent", False) and step < cadence.total_steps:  # the time budget ends
                cadence = cadence.ending_at(step)
                report.result.total_steps = step
                log.info("time budget of %g %smin spent at step %d", config.minutes,
                         "CPU " if config.budget_clock == "cpu" else "", step)
            if cadence.logs(step):
                report.settle(step, updater, window_step)
                report.log_train(step, done.lr, window_step)
            report.show_progress()
            stop = cadence.evaluates(step) and evaluation(step) and step < cadence.total_steps
            if stop:
                report.settle(step, updater, window_step)
                report.stop_early(step, done.lr, window_step)
            if cadence.saves(step, stop) or interrupt.requested:
                report.settle(step, updater, window_step)  # a checkpoint holds the counts as numbers
                report.result.checkpoint = state.save(step, report.window, updater.skipped, restored.kept, stop)
            interrupt.check(step, report.result.checkpoint, config.out_dir)
            distributed.inject_fault(step, state.context)  # a test hook: BERTFORGE_FAULT
            if stop:
                break
    except Exception as exc:
        distributed.raise_if_rank_lost(exc, state.context, config.distributed_timeout_s)
        raise
    finally:
        interrupt.release()
        report.close()
        if hasattr(state.batches, "close"):
            state.batches.close()  # the input pipeline's worker processes
    if state.ema is not None:
        state.ema.finish()
    return report.finish(step)


class RunReport:
    """What the run logs and returns: the `TrainResult`, the log events (metrics sink and history), the
    training log window and the progress; with a `BestKeeper`, the best evaluation so far."""

    def __init__(self, result: TrainResult, logger: MetricsSink | None, is_main: bool,
                 keeper: BestKeeper | None = None):
        self.result, self.logger, self.is_main, self.keeper = result, logger, is_main, keeper
        if keeper is not None:
            self.note_best()
            result.best_dir = Path(keeper.best.directory)
        self.window = LogWindow()
        self.progress: Progress | None = None
        self.batches: Any = None
        self.grad_accumulation = 1
        self.started = self.window_started = 0.0
        # The progress line's figures. `loss` is the event line's: the mean training loss over the steps since
        # the last training log line (as far as read on the host), so both show one number at a log step;
        # `step_loss` is the last step's own loss (host-read steps only).
        self.last_loss = self.step_loss = math.nan

    def start(self, window: LogWindow, batches: Any, grad_accumulation: int, progress: bool) -> None:
        """Continue from the restored log `window` (epochs are counted in `batches`); show progress if asked."""
        self.window, self.batches, self.grad_accumulation = window, batches, grad_accumulation
        self.progress = Progress(self.result.total_steps, self.result.step, enabled=progress)

    def start_clock(self) -> None:
        self.started = self.window_started = time.perf_counter()

    def emit(self, step: int, split: str, values: dict[str, float]) -> None:
        self.result.history.append({"step": step, "split": split, "values": dict(values)})
        if split == "eval":
            self.result.eval = dict(values)
        else:
            self.result.train = dict(values)
        if self.is_main and self.logger is not None:
            self.logger.log(step, split, values)

    def note_best(self) -> None:
        """The keeper's best evaluation so far into the result."""
        record = self.keeper.record
        self.result.best_step, self.result.best_eval = record.step, dict(record.values)

    def add(self, step: int, done: StepOutcome | DeviceOutcome, skipped: int) -> None:
        """Count optimizer step `step` into the log window and the result. A step left on the device is only
        added there (no read back): its numbers reach the host at `settle`."""
        if isinstance(done, DeviceOutcome):
            self.window.accumulate(done.vector)
            return
        self.window.add(done.stats, done.grad_norm, skipped=not done.finite)
        self.result.tokens += int(done.stats.tokens)
        self.result.skipped_steps = skipped
        self.last_loss, self.step_loss = self.window.loss, done.loss

    def show_progress(self) -> None:
        """One step more on the progress bar (or line), after the step's log line, with the same loss."""
        if self.progress is None:
            return
        figures = {"loss": self.last_loss}
        if math.isfinite(self.step_loss):
            figures["step_loss"] = self.step_loss
        self.progress.update(1, **figures, tok_s=f"{self.tokens_per_s():.0f}")

    def tokens_per_s(self) -> float:
        return self.result.tokens / max(time.perf_counter() - self.started, 1e-9)

    def settle(self, step: int, updater: Updater, layout: WindowStep) -> None:
        """Bring the numbers of steps left on the device to the host: the log window's sums (and the run's
        tokens), and the skipped-step counts (which may stop a diverged run)."""
        tokens, loss = self.window.fold(len(layout.term_names), len(layout.metric_names))
        self.result.tokens += int(tokens)
        self.last_loss = self.window.loss if loss is not None else self.last_loss
        updater.settle(step)
        self.result.skipped_steps = updater.skipped

    def log_train(self, step: int, lr: float, layout: WindowStep) -> None:
        """Log the training values of the steps since the last log line, and start a new window."""
        now = time.perf_counter()
        values = self.window.values(layout.term_names, layout.metric_names)
        values["lr"] = lr
        values["tokens_per_s"] = self.window.tokens / max(now - self.window_started, 1e-9)
        per_epoch = batches_per_epoch(self.batches)
        if per_epoch:
            values["epoch"] = step * self.grad_accumulation / per_epoch
        self.emit(step, "train", values)
        self.window, self.window_started = LogWindow(), now

    def stop_early(self, step: int, lr: float, layout: WindowStep) -> None:
        """Early stopping ends the run after `step`: log what no later line would carry, and say why."""
        self.result.stopped_early = True
        if self.window.steps:
            self.log_train(step, lr, layout)
        if self.is_main:
            keeper = self.keeper
            log.info("step %d: %d evaluations in a row without improving %s by more than %g; stopping early "
                     "(training.patience=%d)", step, keeper.record.stale, keeper.best.metric,
                     keeper.stopping.min_delta, keeper.stopping.patience)

    def nothing_to_train(self, out_dir: str, ema: WeightAverage | None) -> TrainResult:
        """The resumed run was complete (or stopped early) already: say so and return its result."""
        result = self.result
        if result.stopped_early:
            log.info("the run in %s stopped early at step %d of %d (training.patience); nothing to train",
                     Path(out_dir), result.step, result.total_steps)
        else:
            log.info("the run in %s is already complete (step %d of %d)", Path(out_dir), result.step,
                     result.total_steps)
        if ema is not None:
            ema.finish()
        self.close()
        return result

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()
        if self.logger is not None and hasattr(self.logger, "close"):
            self.logger.close()

    def finish(self, step: int) -> TrainResult:
        result = self.result
        result.step = step
        result.seconds = time.perf_counter() - self.started
        if self.is_main:
            log.info("finished %d steps in %.1f s; final checkpoint %s", step, result.seconds,
                     result.checkpoint)
        return result


@dataclass
class Evaluation:
    """An evaluation after a step: on the EMA weights when kept, in eval mode, under no_grad and autocast,
    without touching the training run's random streams; logged, then judged by the best keeper."""

    eval_fn: Callable[[nn.Module, int], dict[str, float]]
    model: nn.Module
    ema: WeightAverage | None
    device: torch.device
    precision: str
    keeper: BestKeeper | None
    report: RunReport

    def __call__(self, step: int) -> bool:
        """Evaluate after `step`; True when early stopping says this was the last one."""
        model = self.model
        # The keeper saves the model it judges: the average, so it runs inside `averaged` too.
        with averaged(self.ema):
            model.eval()
            with rng_preserved(), torch.no_grad(), autocast(self.device, self.precision):
                values = self.eval_fn(model, step)
            model.train()
            values = {k: float(v) for k, v in values.items()}
            self.report.emit(step, "eval", values)
            if self.keeper is None:
                return False
            stop = self.keeper.observe(model, step, values)
            self.report.note_best()
            return stop


def open_logger(logger: MetricsSink | None, config: TrainingConfig, context: distributed.DistributedContext,
                resume_step: int | None) -> MetricsSink | None:
    """The main process's metrics sink (default: `metrics.jsonl` in out_dir), started at the resumed step."""
    if logger is None and context.is_main:
        logger = MetricsLogger(Path(config.out_dir), tensorboard=config.tensorboard)
    if context.is_main and logger is not None and hasattr(logger, "start"):
        logger.start(resume_step)
    return logger


def prepare_runner(model: nn.Module, config: TrainingConfig,
                   context: distributed.DistributedContext) -> tuple[nn.Module, nn.Module | None]:
    """What the steps call: the model with activation checkpointing, under DDP, compiled, as the config says;
    and the DDP wrapper (None without one), whose `no_sync` the accumulation needs."""
    if config.activation_checkpointing:
        if not fast_paths_enabled(set_activation_checkpointing(model))["activation_checkpointing"]:
            raise ConfigError("training.activation_checkpointing needs a bertforge encoder in the model")
    # Reading the ids' values would synchronise an accelerator on every step, and break a compiled graph.
    set_value_checks(model, context.device.type == "cpu" and not config.compile)
    runner = distributed.wrap_model(model, context)
    ddp = runner if isinstance(runner, nn.parallel.DistributedDataParallel) else None
    if config.compile:
        runner = compiled(runner)
    return runner, ddp


def compiled(runner: nn.Module) -> Callable[..., Any]:
    """`runner` under torch.compile, traced with data-dependent shapes kept in the graph: the unpadded layout's
    token count (`model.layouts.Unpadded`) and the pooled [CLS] rows of packed sequences are sizes known only
    from the batch. Without this every such operation would break the graph, and the pieces after it would be
    compiled anew for every new size (a recompile nearly every step). With it one graph holds the step, and
    each dimension that varies (rows, prediction slots) is compiled once more, as dynamic."""
    runner = torch.compile(runner)

    def run(**inputs: Any) -> Any:
        with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
            return runner(**inputs)

    return run


def describe_run(model: nn.Module, batches: Any, config: TrainingConfig, total_steps: int, warmup_steps: int,
                 precision: str, context: distributed.DistributedContext) -> None:
    """Log the arithmetic people ask about: examples per step, steps per epoch, epochs, parameters, and the
    recipes that are on."""
    if not context.is_main:
        return
    per_step = config.batch_size * config.grad_accumulation * context.world_size
    per_epoch = batches_per_epoch(batches)
    epochs = ""
    if per_epoch:
        steps_per_epoch = per_epoch / config.grad_accumulation
        epochs = f"; {steps_per_epoch:g} steps per epoch"
        if not config.minutes or config.steps:  # (a time budget alone has no step count to divide)
            epochs += f", {total_steps / steps_per_epoch:.3g} epochs"
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    length = f"{total_steps} steps (warmup {warmup_steps})"
    if config.minutes:
        cpu = " of CPU time" if config.budget_clock == "cpu" else ""
        length = (f"{config.minutes:g} minutes{cpu}{f' or {config.steps} steps' if config.steps else ''} (warmup "
                  f"{config.warmup_ratio:.0%} of the time)")
    log.info("training %s of %d examples (batch %d x accumulation %d x %d processes)%s; "
             "%s, %s, %s on %s; %.1fM trainable parameters", length, per_step,
             config.batch_size, config.grad_accumulation, context.world_size, epochs, config.optimizer,
             config.schedule, precision, context.device, trainable / 1e6)
    recipes = describe_recipes(config, model)
    if recipes:
        log.info("recipes: %s", "; ".join(recipes))


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


@contextlib.contextmanager
def rng_preserved() -> Iterator[None]:
    """Run a block (evaluation) without consuming the training run's random streams."""
    state = capture_rng_state()
    try:
        yield
    finally:
        restore_rng_state(state)
