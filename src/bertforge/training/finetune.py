"""A fine-tuning run: `run_finetuning(config)` and `run_seeds` (row 4).

The run, in order:
1. `describe(config)`: the task description (what to read, how to build inputs, labels, metrics);
   everything that can be refused is refused here, before any model loads (`check_before_training`).
2. `prepare_data`: read train and dev through the family, fix the label names, build windowed features
   (nothing is cut silently: the data report counts windowed inputs, repaired answers, skipped rows).
3. `load_task_model`: the model directory with the family's head (fresh where the checkpoint has none).
4. `training.loop.train` with the family's objective, evaluating on dev every epoch (`Evaluation.for_task`,
   the path `evaluate`, predict and the server share); the best evaluation's model is kept in
   `training.out_dir/best` with its `finetuning.json` (`TaskDescription.to_json`).
5. `finish`: the best model's records, the test split where the task has one, eval_results.json.

The BERT paper's two ways are both here: full fine-tuning (default) and feature-based
(`head.freeze_encoder`, with `head.feature_layers`). `run_seeds` repeats a run over several seeds and reports
mean ± std, because fine-tuning BERT on small data varies a lot between seeds.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.checkpoint_format import ModelDirectory, read_directory, save_model
from bertforge.constants import FINETUNING_NAME
from bertforge.data.finetuning import DataReport, Feature, FeatureBatches
from bertforge.data.vocabulary_coverage import warn_if_uncovered
from bertforge.errors import ConfigError, DataError
from bertforge.evaluation import Evaluation
from bertforge.families import registry
from bertforge.families.task import DataSource, TaskDescription
from bertforge.metrics import LOWER_IS_BETTER
from bertforge.processes import Ranks
from bertforge.runtime import check_user_precision, resolve_device, set_seed
from bertforge.storage import write_json, write_jsonl
from bertforge.tokenization import Tokenizer
from bertforge.training import distributed
from bertforge.training.finetune_config import FinetuneConfig, check_family_settings, describe
from bertforge.training.finetune_results import (
    EvaluationLog,
    FinetuneResult,
    SeedsResult,
    finished_run,
    resume_note,
    summarize,
)
from bertforge.training.loop import train
from bertforge.training.recipes import BestCheckpoint
from bertforge.training.resume import resumed_config

log = logging.getLogger("bertforge.finetuning")


@dataclass
class PreparedData:
    """Everything a run needs besides the model: the settled task (labels, window, options), examples,
    features and the data report."""

    task: TaskDescription
    tokenizer: Tokenizer
    train_examples: list
    train_features: list[Feature]
    dev_examples: list
    dev_features: list[Feature]
    report: DataReport


def _limited(examples: list, limit: int | None, report: DataReport) -> list:
    if limit is not None and len(examples) > limit:
        report.note("limited_from", amount=len(examples))
        return examples[:limit]
    return examples


def prepare_data(config: FinetuneConfig, task: TaskDescription, directory: ModelDirectory) -> PreparedData:
    """Read the task's train and dev files, settle the labels and window, build features; every count goes to
    the report.

    A default max_seq_length (128; QA 384) is lowered to the model's max_position_embeddings when that is
    smaller; an explicit `features.max_seq_length` is kept as given (and refused later if too long).

    Raises:
        DataError: unreadable or malformed files, a dev label unseen in training.
        ConfigError: an unusable combination of options.
    """
    check_model_fits(config, task, directory)
    report, train_report, dev_report = DataReport(), DataReport(), DataReport()
    train_examples = _limited(task.read(task.train, train_report), config.data.train_limit, train_report)
    dev_examples = _limited(task.read(task.dev, dev_report), config.data.dev_limit, dev_report)
    if task.train and not train_examples:
        raise DataError("no usable training examples", task.train[0].path)
    family = task.family
    given = {name: value for name, value in task.options.items() if getattr(config.features, name, None) is not None}
    task = task.replace(options={**task.options, **family.directory_options(directory.sentence), **given})
    if config.features.max_seq_length is None:
        limit = directory.config.max_position_embeddings
        if directory.sentence is not None and directory.sentence.max_seq_length:
            limit = min(limit, directory.sentence.max_seq_length)  # the window it was trained and is used with
        task = task.replace(inputs=dataclasses.replace(task.inputs, max_seq_length=min(task.inputs.max_seq_length,
                                                                                         limit)))
    origin = "given" if config.data.labels else "task" if task.labels else "training"
    labels = family.training.label_names(train_examples, task.labels, task.inputs, task.kind)
    task = task.replace(labels=None if labels is None else tuple(labels),
                        options=family.options_for_data(task.options, [*train_examples, *dev_examples]))
    if labels is not None:
        family.check_labels(train_examples, labels, task.inputs, origin)
        family.check_labels(dev_examples, labels, task.inputs, origin)
    head = directory.config.replace(**family.training.head_config(labels, task.kind))
    tokenizer = directory.require_tokenizer()
    train_features = family.features(train_examples, tokenizer, task.inputs, config=head, report=train_report,
                                     training=True)
    warn_if_uncovered(train_features, tokenizer, f"{task.name} train")  # before the model loads and trains
    dev_features = family.features(dev_examples, tokenizer, task.inputs, config=head, report=dev_report)
    train_report.log_warnings(f"{task.name} train")
    dev_report.log_warnings(f"{task.name} dev")
    report.merge(train_report, "train.").merge(dev_report, "dev.")
    return PreparedData(task, tokenizer, train_examples, train_features, dev_examples, dev_features, report)


def check_model_fits(config: FinetuneConfig, task: TaskDescription, directory: ModelDirectory) -> None:
    """Refuse, from the directory's config alone (before the data is read or the model loaded), a family its
    model has no class for (a ModernBERT directory and a family without a ModernBERT head) and a given window
    longer than its positions."""
    registry.counterpart(task.family.training.trained_class, directory.config)
    window = config.features.max_seq_length
    if window is not None:
        refuse_window(window, directory.config.max_position_embeddings)


def refuse_window(window: int, positions: int) -> None:
    if window > positions:
        raise ConfigError(f"max_seq_length={window} exceeds the model's max_position_embeddings={positions}; lower "
                          "it (long inputs are windowed anyway)")


def load_task_model(config: FinetuneConfig, task: TaskDescription, directory: ModelDirectory | str):
    """The model directory loaded into the family's class, its head fresh where the checkpoint has none."""
    head = config.head
    overrides: dict[str, Any] = {"freeze_encoder": head.freeze_encoder, "feature_layers": head.feature_layers}
    if head.classifier_hidden_sizes is not None:
        overrides["classifier_hidden_sizes"] = list(head.classifier_hidden_sizes)
    if head.classifier_dropout is not None:
        overrides["classifier_dropout"] = head.classifier_dropout
    overrides.update(task.family.training.head_config(None if task.labels is None else list(task.labels), task.kind))
    if head.crf:
        overrides["use_crf"] = True
    model, _ = registry.load_model(directory, task.family.training.trained_class, config_overrides=overrides,
                                   fresh_head=head.fresh_head, fast_path=config.fast_path)
    refuse_window(task.inputs.max_seq_length, model.config.max_position_embeddings)
    return model


def check_metric(task: TaskDescription, dev_examples: Sequence | None) -> None:
    """Refuse, before any training, a chosen metric the run's evaluations will not report (on these dev
    examples; None: on any dev set of this task)."""
    metric = task.chosen_metric
    valid = task.family.metric_names(task, dev_examples)
    if metric not in valid:
        close = difflib.get_close_matches(metric, valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"finetune.metric={metric!r} is invalid{hint}: {task.name} ({task.family.name}"
                          f"{', regression' if task.regression else ''}) evaluations report {list(valid)}; "
                          "choose one of those (--metric NAME)")


def check_before_training(config: FinetuneConfig) -> TaskDescription:
    """The run's task, with everything that can be refused before the model loads refused: no model, no dev
    set (unless `--no-dev`), early stopping without evaluations, a metric the task cannot report, missing
    test files."""
    task = describe(config)
    check_family_settings(config, task)
    check_user_precision(config.training.precision, resolve_device(config.training.device),
                         "finetune.training.precision (--precision)")
    if not config.model:
        raise ConfigError("finetune.model is empty: pass --model DIR, a BERT model directory (config.json, "
                          "weights, vocab.txt)")
    if config.data.dev == "":
        log.info("%s: data.dev is empty (--no-dev): training without evaluation; best/ will hold the final model",
                 task.name)
        task = task.replace(dev=())
    elif not task.dev:
        raise ConfigError(f"{task.name}: no dev file to evaluate on, so no best model could be chosen; pass --dev "
                          "FILE (data.dev), or --no-dev (data.dev = \"\") to train without evaluation and keep the "
                          "final model")
    if not task.dev and config.training.patience:
        raise ConfigError(f"finetune.training.patience={config.training.patience} needs evaluations, and this run "
                          "has no dev set (--no-dev): give --dev FILE, or set --patience 0")
    if task.dev:
        check_metric(task, None)  # against the names any dev set of this task could give
    if config.evaluate_test:
        missing = [s.path for s in task.test if not Path(s.path).is_file()]
        if missing:
            raise DataError("test file not found; check the data root, or pass --evaluate-test false", missing[0])
    return task


def run_finetuning(config: FinetuneConfig) -> FinetuneResult | SeedsResult:
    """Fine-tune `config.model` on the task and keep the best checkpoint (see the module docstring).

    With `config.seeds`, runs once per seed (`run_seeds`) and returns the `SeedsResult`.

    Raises:
        ConfigError: bad options. DataError: bad data. CheckpointError: unusable model directory.
    """
    if config.seeds:
        return run_seeds(config)
    started = time.perf_counter()
    task = check_before_training(config)
    directory = read_directory(config.model)
    prepared = prepare_data(config, task, directory)
    task = prepared.task
    if task.dev and not prepared.dev_examples:
        raise DataError("no usable dev examples: the best model could not be chosen; fix the file, or pass "
                        "--no-dev (data.dev = \"\") to train without evaluation", task.dev[0].path)
    if task.dev:
        check_metric(task, prepared.dev_examples)
    log.info("%s: %d train examples -> %d features, %d dev examples -> %d features; %s", task.name,
             len(prepared.train_examples), len(prepared.train_features), len(prepared.dev_examples),
             len(prepared.dev_features), "; ".join(prepared.report.lines()))
    ranks = Ranks.from_env()
    # Resumed on another number of processes: the accumulation adapts to keep the global batch.
    settings = resumed_config(config.training, ranks.world_size, announce=ranks.rank == 0)
    batches = FeatureBatches(prepared.train_features, settings.batch_size, prepared.tokenizer.pad_token_id,
                             shuffle=True, seed=settings.seed, rank=ranks.rank,
                             world_size=ranks.world_size, grad_accumulation=settings.grad_accumulation)
    steps_per_epoch = max(1, math.ceil(len(batches) / settings.grad_accumulation))
    # Fine-tuning evaluates and checkpoints every epoch unless told otherwise; epoch ends are always saved.
    training = dataclasses.replace(settings, eval_every=settings.eval_every or steps_per_epoch,
                                   save_every=settings.save_every or steps_per_epoch)
    total_steps = training.total_steps(len(batches))
    finished = finished_run(config.training, total_steps)
    if finished is not None:
        return finished
    set_seed(settings.seed)  # the fresh head's initialisation depends on the seed, as the paper's restarts do
    model = load_task_model(config, task, directory)
    run = DevEvaluations(config, prepared, model, steps_per_epoch)
    loss = config.head.loss_settings(task, prepared.train_examples)
    try:
        objective = task.family.training.objective_for(model.config, loss)
        task.family.training.prepare_model(model, task, loss)
    except ConfigError as exc:
        raise ConfigError(f"finetune: {exc}") from None
    outcome = train(model, batches, objective, training, eval_fn=run if run.evaluator else None,
                    tokenizer=prepared.tokenizer, best=run.keeper if run.evaluator else None,
                    save_also=lambda step: step % steps_per_epoch == 0, extra_state=run.log)
    return finish(config, prepared, run, model, outcome, total_steps, time.perf_counter() - started)


class DevEvaluations:
    """The run's dev evaluations, which the loop calls (`eval_fn`): each one's metrics, warnings and
    prediction records, the calibration it tuned (multi-label thresholds) put into the model's config, and
    the keeper of the best model (`best/`, saved with the task description)."""

    def __init__(self, config: FinetuneConfig, prepared: PreparedData, model, steps_per_epoch: int):
        task = prepared.task
        self.task, self.steps_per_epoch = task, steps_per_epoch
        self.best_dir = Path(config.training.out_dir) / "best"
        record = task.to_json()
        if config.head.matryoshka_dims:  # the widths its vectors were trained to be cut to (served `dimensions`)
            record["matryoshka_dims"] = list(config.head.matryoshka_dims)
        self.extra = {FINETUNING_NAME: json.dumps(record, indent=2, ensure_ascii=False) + "\n"}
        self.log = EvaluationLog()
        # Prediction records of the latest evaluation and of the best one (the loop says which is best).
        self.records: dict[int, list[dict[str, Any]]] = {}
        self.evaluator = None
        if prepared.dev_examples:
            self.evaluator = Evaluation.for_task(
                task, prepared.dev_examples, prepared.dev_features, config=model.config,
                tokenizer=prepared.tokenizer, batch_size=config.eval_batch_size, chosen=task.chosen_metric,
                calibrate=None if config.head.thresholds == "none" else config.head.thresholds)
        metric = task.chosen_metric
        self.keeper = BestCheckpoint(metric, metric in LOWER_IS_BETTER, self.best_dir, self.extra, self.forget_others)

    def __call__(self, current, step: int) -> dict[str, float]:
        result = self.evaluator(current)
        if result.calibration:
            # Tuned on this evaluation (multi-label thresholds): the model saved as best, if it is, keeps them.
            current.config = current.config.replace(**result.calibration)
            log.info("%s eval at step %d: tuned %s", self.task.name, step,
                     ", ".join(f"{k} {v}" for k, v in result.calibration.items()))
        self.log.history.append({"step": step, "epoch": round(step / self.steps_per_epoch, 4),
                                 "metrics": result.metrics})
        for warning in result.warnings:
            log.warning("%s eval at step %d: %s", self.task.name, step, warning)
            self.log.warnings.append(f"step {step}: {warning}")
        self.records[step] = result.predictions
        return result.metrics

    def forget_others(self, step: int, values: dict[str, float]) -> None:
        for earlier in [s for s in self.records if s != step]:
            del self.records[earlier]


def finish(config: FinetuneConfig, prepared: PreparedData, run: DevEvaluations, model, outcome,
           total_steps: int, seconds: float) -> FinetuneResult:
    """After training: the final model as best/ when there was no dev set, the best evaluation's records
    (scored again when it happened before a resume), the test split, and eval_results.json."""
    task, settings = prepared.task, config.training
    out_dir = Path(settings.out_dir)
    if run.evaluator is None and distributed.is_main():
        save_model(model, run.best_dir, tokenizer=prepared.tokenizer, extra_files=run.extra)
    best_metrics, best_step = dict(outcome.best_eval), outcome.best_step
    predictions = run.records.get(best_step) if best_step is not None else None
    if run.evaluator is not None and best_step is not None and predictions is None and run.best_dir.is_dir():
        best_model, _ = registry.load_model(run.best_dir, task.family.model_class,
                                            device=resolve_device(settings.device), fast_path=config.fast_path)
        predictions = run.evaluator(best_model).predictions
    test_metrics: dict[str, float] = {}
    if task.test and config.evaluate_test and run.evaluator is not None:
        test_metrics = evaluate_split(config, prepared, task.test, run.best_dir)
    result = FinetuneResult(task.name, task.chosen_metric, best_metrics, best_step or outcome.step, run.log.history,
                            run.best_dir, out_dir, prepared.report.to_dict(), run.log.warnings, seconds,
                            settings.seed, len(prepared.train_examples), len(prepared.dev_examples), test_metrics,
                            total_steps, resume_note(settings.resume, out_dir, outcome), bool(outcome.stopped_early))
    if distributed.is_main():
        write_json(out_dir / "eval_results.json", {**result.summary(), "config": dataclasses.asdict(config)})
        if predictions is not None:
            write_jsonl(out_dir / "dev_predictions.jsonl", predictions)
    if task.chosen_metric in result.best_metrics:
        log.info("%s: best %s %.4f at step %d of %d (%s)", task.name, task.chosen_metric,
                 result.best_metrics[task.chosen_metric], result.best_step, total_steps, run.best_dir)
    else:
        log.info("%s: trained %d steps without evaluation; final model saved to %s", task.name, total_steps,
                 run.best_dir)
    return result


def evaluate_split(config: FinetuneConfig, prepared: PreparedData, sources: Sequence[DataSource],
                   model_dir: Path) -> dict[str, float]:
    """Metrics of the saved best model on another labelled split of the task (e.g. MSRA's test file)."""
    task = prepared.task
    report = DataReport()
    examples = task.read(sources, report)
    limit = config.data.dev_limit
    files = ", ".join(source.path for source in sources)
    log.info("%s: scoring the best model on the test split (%s): %s examples%s; --evaluate-test false skips this",
             task.name, files, min(len(examples), limit) if limit else len(examples),
             f" of {len(examples)} (--dev-limit {limit})" if limit and limit < len(examples) else "")
    examples = _limited(examples, limit, report)
    device = resolve_device(config.training.device)
    model, _ = registry.load_model(model_dir, task.family.model_class, device=device, fast_path=config.fast_path)
    if task.labels is not None:
        task.family.check_labels(examples, list(task.labels), task.inputs)
    features = task.family.features(examples, prepared.tokenizer, task.inputs, config=model.config, report=report)
    evaluator = Evaluation.for_task(task, examples, features, config=model.config, tokenizer=prepared.tokenizer,
                                    batch_size=config.eval_batch_size, device=device)
    metrics = evaluator(model).metrics
    log.info("%s test (%d examples): %s", task.name, len(examples),
             ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    return metrics


def run_seeds(config: FinetuneConfig) -> SeedsResult:
    """Run `config` once per seed in `config.seeds` (each in out_dir/seed-<s>) and summarise the best metrics."""
    seeds = list(config.seeds or [config.training.seed])
    out_dir = Path(config.training.out_dir)
    runs: list[FinetuneResult] = []
    for seed in seeds:
        log.info("seed %d (%d of %d)", seed, len(runs) + 1, len(seeds))
        training = dataclasses.replace(config.training, seed=seed, out_dir=os.fspath(out_dir / f"seed-{seed}"))
        runs.append(run_finetuning(dataclasses.replace(config, seeds=None, training=training)))
    names = sorted({name for run in runs for name in run.best_metrics})
    summary = {name: summarize([run.best_metrics[name] for run in runs if name in run.best_metrics]) for name in names}
    result = SeedsResult(runs[0].task, runs[0].metric, seeds, runs, summary, out_dir)
    collapsed = [run.seed for run in runs if any("collapsed" in w for w in run.warnings)]
    if distributed.is_main():
        write_json(out_dir / "seeds.json", {
            "task": result.task, "metric": result.metric, "seeds": seeds, "summary": summary,
            "per_seed": {str(run.seed): run.best_metrics for run in runs}, "collapsed_seeds": collapsed})
    log.info("%s", result.line())
    if collapsed:
        log.warning("seeds %s had evaluations whose predictions collapsed (or nearly) to one class", collapsed)
    return result

