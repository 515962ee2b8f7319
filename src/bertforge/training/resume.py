"""A run's state across checkpoints: which checkpoint a run continues from (`resume_point`), what a training
checkpoint holds of the run and how every rank writes it (`RunState.save`), and how a resume puts it back
(`RunState.restore`, returning where the run continues: `Restored`).

The file layout and the format of `training_state.pt` are `training.checkpoint`'s; this module fills it:
optimizer, scheduler and loss-scaler state, every rank's RNG state and data position, the log window, the
skipped steps, the best evaluation so far (`best`, with early stopping's `stale`), the config, the caller's
`extra` state, `stopped_early`, and with EMA the shadow and the raw weights (`ema`; the directory's model
weights are then the average). Keys added by later versions are optional, so older checkpoints resume.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge import checkpoint_format
from bertforge.constants import TRAINING_STATE_NAME
from bertforge.errors import CheckpointError, ConfigError
from bertforge.runtime import capture_rng_state
from bertforge.training import distributed
from bertforge.training.accumulation import LogWindow
from bertforge.training.checkpoint import (
    find_latest,
    load_training_state,
    plain,
    resolve_resume,
    save_checkpoint,
    tidy_run_directory,
)
from bertforge.training.config import TrainingConfig
from bertforge.training.recipes import BestSoFar, WeightAverage, averaged

log = logging.getLogger("bertforge.training")


def resume_point(config: TrainingConfig, context: distributed.DistributedContext) -> Path | None:
    """The checkpoint the run continues from (`config.resume`), or None for a fresh run. The main process
    first removes what crashed saves left in the run directory (`checkpoint.tidy_run_directory`).

    Raises:
        ConfigError: a fresh run (`resume` never) in a directory that holds an earlier run's checkpoints.
        CheckpointError: `resume` names a directory that is not a training checkpoint.
    """
    out_dir = Path(config.out_dir)
    if context.is_main:
        tidy_run_directory(out_dir)  # leftovers of a crashed save (and a best/ it caught mid-swap)
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
    return resume_from


def saved_layout(path: Path) -> tuple[int, int, int] | None:
    """(batch_size, grad_accumulation, world_size) a training checkpoint was written with, or None when its
    state does not say. Reads the state memory-mapped: the optimizer's tensors are not loaded."""
    try:
        state = torch.load(Path(path) / TRAINING_STATE_NAME, map_location="cpu", weights_only=True, mmap=True)
        saved = state.get("config") or {}
        return int(saved["batch_size"]), int(saved["grad_accumulation"]), int(state.get("world_size", 1))
    except (OSError, RuntimeError, KeyError, TypeError, ValueError, AttributeError):
        return None  # an unreadable state is refused, with its message, when the run restores it


def keep_global_batch(config: TrainingConfig, saved: tuple[int, int, int] | None, world_size: int,
                      where: str = "the checkpoint", announce: bool = True) -> TrainingConfig:
    """The config a resumed run trains with, so that the global batch stays what the checkpoint's run had.

    The global batch is `batch_size * grad_accumulation * world_size`. When the number of processes changed
    since the checkpoint (`saved` = its (batch_size, grad_accumulation, world_size)) and `batch_size` did not,
    the accumulation adapts: a 4-process run of batch 8 resumed on 2 processes accumulates 2 micro-batches,
    on 1 process 4, and takes exactly the uninterrupted run's steps (the data position is global). A changed
    `batch_size` (or, at the same world size, a changed `grad_accumulation`) is the user's choice of a new
    global batch: it is kept, and what changes is logged.

    Raises:
        ConfigError: no whole accumulation keeps the global batch with this many processes.
    """
    if saved is None:
        return config
    batch, accumulation, saved_world = saved
    before = batch * accumulation * saved_world
    now = config.batch_size * config.grad_accumulation * world_size
    if now == before:
        return config
    layout = (f"{before} examples per step (batch {batch} x accumulation {accumulation} x {saved_world} "
              f"processes)")
    if config.batch_size != batch or saved_world == world_size:
        if announce:
            log.warning("%s was trained with %s; this run takes %d (batch %d x accumulation %d x %d processes), as "
                        "its settings say: the data continues at the same example, the steps and the schedule "
                        "keep their count but each step now sees %d examples", where, layout, now,
                        config.batch_size, config.grad_accumulation, world_size, now)
        return config
    if before % (batch * world_size):
        raise ConfigError(f"{where} was trained with {layout}; with {world_size} processes and batch {batch} no "
                          "whole training.grad_accumulation keeps that: choose another --training.batch_size, "
                          f"with batch_size x grad_accumulation x {world_size} = {before} to keep it or any other "
                          "product to change the global batch (what changes is then logged)")
    adapted = before // (batch * world_size)
    if announce:
        log.info("%s was trained with %s; resuming on %d processes with accumulation %d keeps every step's %d "
                 "examples (the data position is global)", where, layout, world_size, adapted, before)
    return dataclasses.replace(config, grad_accumulation=adapted)


def resumed_config(config: TrainingConfig, world_size: int, announce: bool = True) -> TrainingConfig:
    """`config` with the accumulation adapted to the checkpoint the run will resume from (`config.resume`;
    `keep_global_batch`); unchanged for a fresh run. Every rank reads the checkpoint itself (no collective:
    callers use this before the process group exists)."""
    try:
        path = resolve_resume(config.resume, Path(config.out_dir))
    except CheckpointError:
        return config  # refused, with its message, when the loop resolves it
    if path is None:
        return config
    return keep_global_batch(config, saved_layout(path), world_size, str(path), announce)


@dataclass
class Restored:
    """Where a run continues: what `RunState.restore` read from a checkpoint (a fresh run: the defaults)."""

    step: int = 0
    skipped: int = 0
    window: LogWindow = field(default_factory=LogWindow)
    rng: dict | None = None
    kept: BestSoFar = field(default_factory=BestSoFar)
    stopped_early: bool = False


@dataclass
class RunState:
    """The objects of a run that a checkpoint saves and a resume restores.

    Attributes:
        model: the unwrapped model (its weights are the directory's model; with `ema`, the average's).
        batches: the batch source (its `state_dict()` is the data position).
        optimizer, scheduler, scaler: the optimizer step's state.
        config: the run's settings (saved as `config`; `out_dir` and `keep_last` say where and how many).
        context: the distributed context (rank, world size, main process).
        tokenizer: saved into every checkpoint, so each is a self-contained model directory.
        extra_state: the caller's object with `state_dict()` / `load_state_dict(state)`, or None.
        ema: the EMA of the weights, or None.
    """

    model: nn.Module
    batches: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    config: TrainingConfig
    context: distributed.DistributedContext
    tokenizer: Any = None
    extra_state: Any = None
    ema: WeightAverage | None = None

    def save(self, step: int, window: LogWindow, skipped: int, kept: BestSoFar | None,
             stopped_early: bool = False) -> Path:
        """Write the checkpoint of `step`: gather every rank's RNG state and data position; the main process
        writes; all ranks agree on errors. With EMA the directory's model weights are the average; the raw
        weights and the shadow go into the training state."""
        rng = distributed.all_gather_object(capture_rng_state())
        position = plain(self.batches.state_dict()) if hasattr(self.batches, "state_dict") else None
        data = distributed.all_gather_object(position)
        path, error = None, None
        if self.context.is_main:
            state = {
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(),
                "rng": rng,
                "data": data,
                "world_size": self.context.world_size,
                "log_window": window.__dict__,
                "skipped_steps": skipped,
                "best": dataclasses.asdict(kept) if kept is not None else None,
                "config": plain(dataclasses.asdict(self.config)),
                "extra": plain(self.extra_state.state_dict()) if self.extra_state is not None else None,
                "stopped_early": stopped_early,
            }
            try:
                with averaged(self.ema) as raw:
                    if self.ema is not None:
                        state["ema"] = self.ema.state_dict(raw)
                    path = save_checkpoint(self.config.out_dir, step, self.model, state,
                                           tokenizer=self.tokenizer, keep_last=self.config.keep_last)
            except CheckpointError as exc:
                error = str(exc)
        error = distributed.broadcast_object(error)
        if error is not None:
            raise CheckpointError(error)
        return distributed.broadcast_object(path)

    def restore(self, path: Path) -> Restored:
        """Load checkpoint `path` into the run's objects (and `extra_state`, when the checkpoint has one, and
        the EMA shadow); return where the run continues.

        The RNG state is returned, not applied: the caller restores it last, after everything that draws.
        """
        state = load_training_state(path)
        restore_model_weights(self.model, path)
        self.restore_ema(state.get("ema"), path)
        restore_optimizer(self.optimizer, self.scheduler, self.scaler, state, path)
        rng_state, data_state = self.rank_state(state, path)
        if data_state is not None and hasattr(self.batches, "load_state_dict"):
            self.batches.load_state_dict(data_state)
        kept = BestSoFar(**state["best"]) if state.get("best") else BestSoFar()
        if self.extra_state is not None and state.get("extra") is not None:
            self.extra_state.load_state_dict(state["extra"])
        return Restored(int(state["step"]), int(state.get("skipped_steps", 0)),
                        LogWindow(**state.get("log_window", {})), rng_state, kept,
                        bool(state.get("stopped_early", False)))

    def restore_ema(self, saved: Mapping[str, Any] | None, path: Path) -> None:
        """The raw training weights and the EMA shadow of a checkpoint written with EMA; a checkpoint without
        EMA starts the average at its weights."""
        if saved is not None:
            # The model directory holds the averaged weights; training continues from the raw ones.
            load_parameters(self.model, saved["raw"], path)
            if self.ema is not None:
                self.ema.load_shadow(saved["shadow"], path)
            else:
                log.warning("%s was written with training.ema_decay=%g; continuing without EMA from the raw "
                            "weights", path, saved["decay"])
        elif self.ema is not None:
            log.warning("%s was written without EMA: the average starts at its weights", path)
            self.ema.reset()

    def rank_state(self, state: Mapping[str, Any], path: Path) -> tuple[dict | None, Any]:
        """(RNG state, data position) of this rank; across a change of world size only a data position that
        is the same on every rank carries over, and no RNG state."""
        rank, world = self.context.rank, self.context.world_size
        data_states, saved_world = state.get("data"), int(state.get("world_size", 1))
        if saved_world == world:
            return state["rng"][rank], None if data_states is None else data_states[rank]
        if data_states is not None and any(d != data_states[0] for d in data_states):
            raise CheckpointError(f"{path}: written by {saved_world} processes, now {world}, and the batch "
                                  "source keeps a separate position per rank; resume with the same number of "
                                  "processes, or start a new run from this model directory")
        # A global data position (the same on every rank) carries over; the random streams cannot.
        if self.context.is_main:
            log.warning("resuming a %d-process run with %d processes: same data position, but dropout draws "
                        "differ from the uninterrupted run", saved_world, world)
        return None, None if data_states is None else data_states[0]


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


def restore_optimizer(optimizer: torch.optim.Optimizer, scheduler: Any, scaler: torch.amp.GradScaler,
                      state: Mapping[str, Any], path: Path) -> None:
    """The optimizer's and the loss scaler's state from the checkpoint; the schedule's position from its step
    (the schedule itself, and each group's base lr, follow the current config, so a run can be extended)."""
    try:
        optimizer.load_state_dict(state["optimizer"])
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"{path}: optimizer state does not match this run ({exc}); resume with the same "
                              "training.optimizer, training.layer_lr_decay and frozen/trainable parameters, or "
                              "start a new run from this model directory (--training.resume=never with it as "
                              "the model)") from None
    saved = {k: v for k, v in state["scheduler"].items() if k != "base_lrs"}
    scheduler.load_state_dict({**saved, "lr_lambdas": [None] * len(scheduler.lr_lambdas)})
    for group, base in zip(optimizer.param_groups, scheduler.base_lrs):
        group["lr"] = base * scheduler.lr_lambdas[0](scheduler.last_epoch)
    if scaler.is_enabled() and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
