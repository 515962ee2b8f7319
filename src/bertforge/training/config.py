"""`TrainingConfig`: how long, how fast and how carefully the one training loop trains (the `[training]` table).

Batch sizes are per device: one optimizer step sees `batch_size * grad_accumulation * world_size`
examples. Length is `steps` optimizer steps or, when `steps` is 0, `epochs` passes over the batch source;
warmup is `warmup_steps` or, when that is 0, `warmup_ratio` of the steps (the same precedence as the
Hugging Face Trainer, so a quick `--training.steps=20` override works on any run file).

The recipes of the loop (early stopping, layer-wise learning-rate decay, FGM, R-Drop, EMA of the weights)
are off by default; each is one field here, described in `bertforge.training.loop`.
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass
from typing import Literal

import torch

from bertforge.configuration import setting
from bertforge.errors import ConfigError
from bertforge.runtime import DEFAULT_TRAINING_PRECISION, TRAINING_PRECISIONS

OPTIMIZERS = ("adamw", "lamb")
SCHEDULES = ("linear", "constant", "wsd", "one-cycle")  # shapes: `training.schedules`
BUDGET_CLOCKS = ("wall", "cpu")  # what a time budget (`minutes`) counts: `training.schedules.budget_clock`
DECAY_SHAPES = ("1-sqrt", "linear")
# With a time budget and no `steps`, the run has no step limit; this stands for "unlimited".
UNLIMITED_STEPS = 10**12


@dataclass
class TrainingConfig:
    """Settings of `bertforge.training.loop.train`. Each field carries its help text (`setting`), which the
    command line's `--help` shows; the recipes (patience, layer_lr_decay, fgm_epsilon, rdrop_alpha, ema_decay)
    are off at their defaults."""

    steps: int = setting(0, "optimizer steps to train for; 0 = use `epochs`")
    epochs: float = setting(1.0, "passes over the batch source (fractions allowed) when `steps` is 0")
    # (used by whoever builds the batch source: the loop takes batches as they come)
    batch_size: int = setting(32, "examples per micro-batch per device")
    grad_accumulation: int = setting(1, "micro-batches per optimizer step")
    lr: float = setting(1e-4, "peak learning rate (reached at the end of warmup)")
    warmup_steps: int = setting(0, "linear warmup length in optimizer steps; wins over warmup_ratio when set")
    warmup_ratio: float = setting(0.0, "linear warmup length as a fraction of the steps, when warmup_steps is 0")
    schedule: str = setting("linear", "linear: after warmup, linear decay to 0 at the end (BERT's); constant; "
                                      "wsd: warmup, stable, then decay over the last `decay_ratio` of the run "
                                      "(shape `decay_shape`); one-cycle: up to the peak at mid-run, down to 0 at "
                                      "the end (its own warmup: the warmup settings do not apply)",
                            choices=SCHEDULES)
    decay_ratio: float = setting(0.2, "wsd: the share of the run (steps or time budget) at its end over which the "
                                      "rate decays to 0")
    decay_shape: str = setting("1-sqrt", "wsd: the decay's shape, 1-sqrt (factor 1 - sqrt(q) at fraction q of the "
                                         "decay) or linear", choices=DECAY_SHAPES)
    minutes: float = setting(0.0, "a time budget in minutes: the schedule's position is the time elapsed over the "
                                  "budget instead of steps, warmup is `warmup_ratio` of the budget, and the run "
                                  "ends with a final checkpoint when the budget is spent (or at `steps` if set "
                                  "and reached first; `epochs` does not apply); 0 = no budget")
    budget_clock: str = setting("wall", "what `minutes` counts: wall (time elapsed) or cpu (the CPU seconds this "
                                        "process uses, all its threads and its ended child processes: a budget "
                                        "that a busy shared machine does not shrink, for fair comparisons)",
                                choices=BUDGET_CLOCKS)
    weight_decay: float = setting(0.01, "decoupled weight decay, not applied to biases and LayerNorm weights")
    optimizer: str = setting("adamw", "adamw (fine-tuning, pretraining up to ~1k batch) or lamb (large-batch "
                                      "pretraining)", choices=OPTIMIZERS)
    betas: list[float] = setting(help="Adam's moment decay rates", factory=lambda: [0.9, 0.999])
    eps: float = setting(1e-6, "Adam's epsilon (BERT used 1e-6; PyTorch's default is 1e-8)")
    max_grad_norm: float = setting(1.0, "global gradient-norm clipping; 0 disables clipping (the norm is still "
                                        "logged)")
    precision: str = setting(DEFAULT_TRAINING_PRECISION, "auto = bf16 on a CUDA GPU with bf16 support, else fp32; "
                                                         "or fp32, bf16, fp16 (with dynamic loss scaling)",
                             choices=TRAINING_PRECISIONS)
    device: str = setting("auto", "auto (cuda if available), cpu, cuda or cuda:N; under torchrun each rank uses "
                                  "cuda:LOCAL_RANK")
    distributed_timeout_s: float = setting(600.0, "under torchrun: how long a collective waits for a rank that "
                                                  "stopped answering before every rank stops with an error naming "
                                                  "it (a rank that dies is noticed at once)")
    log_every: int = setting(50, "optimizer steps between training log lines (loss terms, metrics, lr, "
                                 "tokens/s)")
    eval_every: int = setting(0, "steps between evaluations; 0 = only at the end")
    save_every: int = setting(0, "steps between checkpoints; 0 = only the final one")
    keep_last: int = setting(3, "checkpoints kept (older ones are deleted); 0 keeps all")
    seed: int = setting(42, "seeds Python, NumPy and torch (each rank adds its rank)")
    deterministic: bool = setting(False, "deterministic GPU kernels (slower)")
    out_dir: str = setting("runs/train", "checkpoints, metrics.jsonl and TensorBoard logs go here")
    resume: str = setting("never", "auto (the latest checkpoint in out_dir, if any), never (a fresh run; refused "
                                   "when out_dir already holds checkpoints), or a checkpoint directory")
    data_workers: int = setting(-1, "processes that read, mask and collate pretraining batches ahead of the step "
                                    "(the batches are the same for any number); -1 = auto: 2 on a CUDA GPU, 0 on "
                                    "a CPU, whose cores the step itself uses")
    compile: bool = setting(False, "wrap the model in torch.compile (pretraining batches then take a few fixed "
                                   "shapes, each compiled once)")
    activation_checkpointing: bool = setting(False, "recompute each encoder layer in the backward pass instead of "
                                                    "storing its activations (much less memory for about a third "
                                                    "more compute; same gradients)")
    fused_adamw: bool | Literal["auto"] = setting(
        "auto", "PyTorch's fused AdamW kernel (ignored for LAMB; the same update, tested): auto = on a CUDA GPU, "
                "where it also takes the step without a host round trip, and off on a CPU; true or false to choose")
    max_nonfinite_steps: int = setting(5, "consecutive steps with non-finite loss/gradients tolerated (each "
                                          "skipped) before training stops with an error; fp16 tolerates 16 more "
                                          "while its loss scale adapts")
    progress: bool = setting(True, "show a progress bar on the main process")
    tensorboard: bool = setting(False, "also write TensorBoard events under out_dir/tensorboard (needs the "
                                       "`tensorboard` package: pip install 'bertforge[tensorboard]')")
    patience: int = setting(0, "early stopping: stop after this many evaluations in a row (one every "
                               "`eval_every` steps; needs a dev set) that did not beat the best metric by more "
                               "than `min_delta`, with a resumable checkpoint at that step; 0 = off")
    min_delta: float = setting(0.0, "how much an evaluation must beat the best so far by to reset the patience "
                                    "count, in the metric's units (0 = any improvement; the best model still "
                                    "follows every improvement)")
    layer_lr_decay: float = setting(1.0, "layer-wise learning-rate decay in (0, 1]: the head and the pooler train "
                                         "at `lr`, encoder layer i of L (0-based) at lr * decay**(L - i), the "
                                         "embeddings at lr * decay**(L + 1); 1 = one learning rate for all (e.g. "
                                         "0.9 for base models, 0.95 for large ones)")
    fgm_epsilon: float = setting(0.0, "adversarial training by FGM (Miyato et al., 2017): every micro-batch also "
                                      "backpropagates its loss with the word embeddings moved by epsilon along "
                                      "the normalised gradient (one more forward and backward per micro-batch); "
                                      "0 = off, 1.0 is the usual value")
    rdrop_alpha: float = setting(0.0, "R-Drop (Liang et al., 2021): every micro-batch runs twice with independent "
                                      "dropout and adds alpha times the task's consistency term between the two "
                                      "passes (logged as loss_rdrop); 0 = off; 1-5 are usual for classification. "
                                      "Needs a task objective with a consistency term")
    ema_decay: float = setting(0.0, "keep an exponential moving average of the weights, shadow = d * shadow + "
                                    "(1 - d) * weights after every optimizer step; evaluation, the best model, "
                                    "the checkpoints' model weights and the model `train` returns are the "
                                    "averaged weights; 0 = off, e.g. 0.999")

    def __post_init__(self) -> None:
        def need(cond: bool, name: str, fix: str) -> None:
            if not cond:
                raise ConfigError(f"training.{name}={getattr(self, name)!r} is invalid: {fix}")

        def whole(name: str, minimum: int) -> None:
            value = getattr(self, name)
            need(isinstance(value, int) and not isinstance(value, bool) and value >= minimum, name,
                 f"use an integer >= {minimum}")

        whole("steps", 0)
        need(isinstance(self.epochs, int | float) and self.epochs >= 0 and math.isfinite(self.epochs), "epochs",
             "use a number >= 0")
        need(self.steps > 0 or self.epochs > 0, "steps", "set steps > 0 or epochs > 0 to say how long to train")
        for name in ("batch_size", "grad_accumulation", "log_every"):
            whole(name, 1)
        for name in ("warmup_steps", "eval_every", "save_every", "keep_last", "max_nonfinite_steps", "seed"):
            whole(name, 0)
        need(self.lr > 0 and math.isfinite(self.lr), "lr", "use a positive learning rate such as 1e-4")
        need(0.0 <= self.warmup_ratio < 1.0, "warmup_ratio", "use a fraction in [0, 1), e.g. 0.1")
        need(self.schedule in SCHEDULES, "schedule", f"use one of {SCHEDULES}")
        self.check_schedule()
        need(self.weight_decay >= 0, "weight_decay", "use a value >= 0 (BERT used 0.01)")
        need(self.optimizer in OPTIMIZERS, "optimizer", f"use one of {OPTIMIZERS}")
        need(len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas), "betas",
             "give two numbers in [0, 1), e.g. [0.9, 0.999]")
        self.betas = [float(b) for b in self.betas]
        need(self.eps > 0, "eps", "use a small positive number such as 1e-6")
        need(isinstance(self.distributed_timeout_s, int | float) and not isinstance(self.distributed_timeout_s, bool)
             and 0 < self.distributed_timeout_s < math.inf, "distributed_timeout_s",
             "use a positive number of seconds, e.g. 600")
        need(self.max_grad_norm >= 0, "max_grad_norm", "use a positive norm such as 1.0, or 0 to disable clipping")
        need(self.precision in TRAINING_PRECISIONS, "precision", f"use one of {TRAINING_PRECISIONS}")
        need(bool(self.out_dir), "out_dir", "name a directory for checkpoints and logs")
        need(bool(self.resume), "resume", "use auto, never or a checkpoint directory")

        def number(name: str) -> float:
            value = getattr(self, name)
            ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            return float(value) if ok else math.nan  # NaN fails every range check below

        need(isinstance(self.data_workers, int) and not isinstance(self.data_workers, bool)
             and self.data_workers >= -1, "data_workers", "use -1 (auto), 0 (in the training process) or a count")
        need(self.fused_adamw in (True, False, "auto"), "fused_adamw", "use auto, true or false")
        whole("patience", 0)
        need(number("min_delta") >= 0, "min_delta", "use a number >= 0 in the metric's units (0 = any improvement)")
        need(0.0 < number("layer_lr_decay") <= 1.0, "layer_lr_decay",
             "use a factor in (0, 1], e.g. 0.9 (1 = the same learning rate for every layer)")
        need(number("fgm_epsilon") >= 0, "fgm_epsilon", "use a number >= 0, e.g. 1.0 (0 = no adversarial training)")
        need(number("rdrop_alpha") >= 0, "rdrop_alpha", "use a number >= 0, e.g. 1.0 (0 = no R-Drop)")
        need(0.0 <= number("ema_decay") < 1.0, "ema_decay", "use a decay in [0, 1), e.g. 0.999 (0 = no EMA)")
        for name in ("min_delta", "layer_lr_decay", "fgm_epsilon", "rdrop_alpha", "ema_decay"):
            setattr(self, name, float(getattr(self, name)))

    def check_schedule(self) -> None:
        """The schedule's settings agree with each other, and `tensorboard` can be honoured."""
        def need(cond: bool, name: str, fix: str) -> None:
            if not cond:
                raise ConfigError(f"training.{name}={getattr(self, name)!r} is invalid: {fix}")

        ok = isinstance(self.minutes, int | float) and not isinstance(self.minutes, bool)
        need(ok and 0 <= self.minutes < math.inf, "minutes", "use a number of minutes > 0, or 0 for no time budget")
        need(self.budget_clock in BUDGET_CLOCKS, "budget_clock", f"use one of {BUDGET_CLOCKS}")
        need(0.0 < self.decay_ratio <= 1.0, "decay_ratio", "use a fraction in (0, 1], e.g. 0.2 (the last 20%)")
        need(self.decay_shape in DECAY_SHAPES, "decay_shape", f"use one of {DECAY_SHAPES}")
        need(not (self.minutes and self.warmup_steps), "warmup_steps",
             "with a time budget (minutes) give the warmup as a share of the budget, warmup_ratio, e.g. 0.06")
        need(not (self.schedule == "one-cycle" and self.warmup_steps), "warmup_steps",
             "one-cycle rises over the first half of the run by itself; leave warmup_steps at 0")
        if self.tensorboard and importlib.util.find_spec("tensorboard") is None:
            raise ConfigError("training.tensorboard is on but the `tensorboard` package is not installed: "
                              "pip install 'bertforge[tensorboard]' (or pip install tensorboard), or leave "
                              "--tensorboard off (metrics.jsonl in out_dir has every logged value)")

    def total_steps(self, batches_per_epoch: int | None) -> int:
        """Optimizer steps of the run: `steps`, or `epochs` worth of micro-batches (needs their number); with a
        time budget, `steps` or no limit (`UNLIMITED_STEPS`)."""
        if self.steps > 0:
            return self.steps
        if self.minutes > 0:
            return UNLIMITED_STEPS
        if batches_per_epoch is None:
            raise ConfigError("training.epochs needs a batch source with a length (len(batches)); set "
                              "training.steps instead for a stream without one")
        return max(1, math.ceil(self.epochs * batches_per_epoch / self.grad_accumulation))

    def resolved_data_workers(self, device: torch.device) -> int:
        """The input pipeline's worker processes on `device` (`data_workers`, with -1 resolved)."""
        if self.data_workers >= 0:
            return self.data_workers
        return min(2, max(0, (os.cpu_count() or 1) - 1)) if device.type == "cuda" else 0

    def resolved_warmup(self, total_steps: int) -> int:
        """Warmup steps of a run of `total_steps` (with a time budget: 0, the warmup is `warmup_ratio` of the
        time; one-cycle: half the run)."""
        if self.minutes > 0:
            return 0
        if self.schedule == "one-cycle":
            return total_steps // 2
        if self.warmup_steps > 0:
            return min(self.warmup_steps, total_steps)
        return int(self.warmup_ratio * total_steps)
