"""Scoring a saved model directory on a data file (`bertforge evaluate`): predictions (JSONL) and metrics
(JSON), built exactly as the fine-tuning run built its dev set.

The directory is read once (`checkpoint_format.read_directory`: config.json, tokenizer, finetuning.json);
its task description (`families.task.task_of`) says how to read the file and build inputs; the model is
loaded from the directory already read; the evaluation is the run's (`Evaluation.for_task`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.checkpoint_format import ModelDirectory, read_directory
from bertforge.data.finetuning import DataReport
from bertforge.data.vocabulary_coverage import warn_if_uncovered
from bertforge.engine.build import DEFAULT_KIND, build_engine, plan_engine
from bertforge.engine.plan import EnginePlan
from bertforge.errors import ConfigError, DataError
from bertforge.evaluation.intervals import RESAMPLES, paired_changes
from bertforge.evaluation.runner import EvalResult, Evaluation
from bertforge.families import registry
from bertforge.families.base import Family
from bertforge.families.task import DataSource, TaskDescription, task_of
from bertforge.runtime import DEFAULT_PRECISION
from bertforge.storage import write_json, write_jsonl

log = logging.getLogger("bertforge.evaluate")


@dataclass(frozen=True)
class PreparedEvaluation:
    """A data file read, featurized and ready to score against any model of the directory: `evaluation(model)`
    scores a model (a bertforge task model, or anything whose forward returns the same outputs)."""

    directory: ModelDirectory
    family: Family
    evaluation: Evaluation
    report: DataReport


def prepare_evaluation(model_dir: str | os.PathLike, data_file: str | os.PathLike, *, labelled: bool = True,
                       batch_size: int = 64, device: str = "cpu", precision: str = DEFAULT_PRECISION,
                       overrides: Mapping[str, Mapping[str, Any]] | None = None,
                       limit: int | None = None) -> PreparedEvaluation:
    """`evaluate`'s steps up to the model: the directory's task description with `data_file` as its dev file,
    its reader, the family's features and the run's `Evaluation`, for a concrete device and precision (a plan's,
    `engine.build.plan_engine`). Arguments as for `evaluate`. A benchmark that scores another runtime on the
    same path (benchmarks/ort_int8_accuracy.py) starts here."""
    model_dir = Path(model_dir)
    directory = read_directory(model_dir)
    family = registry.for_directory(directory)
    if family not in registry.FINETUNING_FAMILIES:
        raise ConfigError(f"{model_dir}: config.json names {directory.architecture or 'BertModel'}, which has no "
                          "fine-tuned head to evaluate; pass a directory saved by `bertforge finetune`")
    task = task_of(directory, family)
    task = task.overridden(without_saved_choices(overrides or {}, task, model_dir), where=f"evaluate {model_dir}")
    task = task.replace(dev=(DataSource(os.fspath(data_file)),))
    tokenizer = directory.require_tokenizer()
    report = DataReport()
    examples = task.read(task.dev, report, labelled=labelled)
    if limit is not None:
        examples = examples[:limit]
    if not examples:
        raise DataError("no examples to evaluate", data_file)
    if labelled and not task.regression and directory.config.id2label:
        family.check_labels(examples, directory.config.label_names, task.inputs, "model")
    task = task.replace(options=family.options_for_data(task.options, examples))
    features = family.features(examples, tokenizer, task.inputs, config=directory.config, report=report)
    warn_if_uncovered(features, tokenizer, os.fspath(data_file))  # before the model loads
    # The metric that picked this model is reported too, where this file's evaluation can report it.
    chosen = task.metric if task.metric in family.metric_names(task, examples) else None
    evaluation = Evaluation.for_task(task, examples, features, config=directory.config, tokenizer=tokenizer,
                                     batch_size=batch_size, chosen=chosen, device=device, precision=precision)
    return PreparedEvaluation(directory, family, evaluation, report)


def without_saved_choices(overrides: Mapping[str, Any], task: TaskDescription, model_dir: Path) -> dict[str, Any]:
    """`overrides` without the fine-tuning flags that name what the model already is (`--format`, `--task`, as
    typed again from the fine-tuning command): accepted when they equal the saved description, else one error
    saying which the model has."""
    formats = registry.formats()
    saved = task.name if task.name in formats else None
    rest = dict(overrides)
    for key in ("format", "task"):
        if key not in rest:
            continue
        given = rest.pop(key)
        if key == "task":
            agrees = given == task.name
        else:  # a named task (sst2 ...) records no format: any format of its family and kind reads as it does
            agrees = given == saved if saved is not None else formats.get(given) == (task.family, task.kind)
        if not agrees:
            has = (f"format {saved}" if saved is not None else f"task {task.name}") + f" ({task.family.name}" + \
                (f", {task.kind})" if task.kind else ")")
            raise ConfigError(f"evaluate {model_dir}: --{key} {given}: the model already knows its format from its "
                              f"finetuning.json: {has}; drop --{key} (and give --text-a/--text-b/--label or "
                              "--reader.KEY=value to read other columns)")
    return rest


def check_against(precision: str, against: str, labelled: bool, resamples: int) -> None:
    """Refuse a comparison that cannot be made, before any model runs."""
    if against == precision:
        raise ConfigError(f"--against {against} names the precision being scored; compare with another one "
                          "(e.g. --precision int8 --against fp32)")
    if not labelled:
        raise ConfigError("--against compares metrics, which need labels: drop --unlabelled or --against")
    if resamples < 1:
        raise ConfigError(f"--resamples must be at least 1, got {resamples}")


def compare_precisions(prepared: PreparedEvaluation, result: EvalResult, precision: str, against: EnginePlan, *,
                       resamples: int, seed: int) -> dict[str, Any]:
    """The model scored at `against`'s precision on the examples `result` was scored on, and per metric
    `precision`'s score minus that one, with its 95% paired-bootstrap interval."""
    evaluation = prepared.evaluation.at_precision(against.precision)
    engine = load_engine(prepared, against)
    results = evaluation.results(engine)
    del engine
    against = against.precision
    report = paired_changes(evaluation, {precision: result.results, against: results},
                            [(precision, against)], resamples=resamples, seed=seed)
    changes = {metric: figures[f"{precision} - {against}"] for metric, figures in report["changes"].items()}
    return {"precision": against, "metrics": report["scores"][against], "changes": changes,
            "resamples": resamples, "seed": seed}


def load_engine(prepared: PreparedEvaluation, plan: EnginePlan):
    """The directory's model, loaded and built into the engine `plan` says."""
    model, _ = registry.load_model(prepared.directory, prepared.family.model_class, device=plan.device)
    engine = build_engine(model, plan, prepared.directory.path)
    engine.prepare(prepared.family)
    return engine


def evaluate(model_dir: str | os.PathLike, data_file: str | os.PathLike, *, out_dir: str | os.PathLike | None = None,
             labelled: bool = True, batch_size: int = 64, device: str = "auto", precision: str = DEFAULT_PRECISION,
             overrides: Mapping[str, Mapping[str, Any]] | None = None, limit: int | None = None,
             against: str | None = None, resamples: int = RESAMPLES, seed: int = 0, engine: str = DEFAULT_KIND,
             threads: int | None = None) -> EvalResult:
    """Score a fine-tuned model directory on a data file; write `predictions.jsonl` and `metrics.json`.

    How inputs are built (columns, max_seq_length, doc stride, tag scheme, decoding options) comes from the
    directory's `finetuning.json` (earlier releases' flat records too); `overrides` change parts of it:
    {"reader": {"text_a_column": "review"}, "inputs": {"max_seq_length": 64}, "options": {"n_best_size": 5}}.
    The task kind and label names come from its config.json (`architectures`, `problem_type`, `id2label`).

    Args:
        model_dir: a directory saved by `run_finetuning` (or any task-model directory, with `overrides`
            naming the columns).
        data_file: the file to score.
        out_dir: where to write (default: model_dir/eval-<file stem>).
        labelled: False for a file without labels/answers: predictions only, no metrics.
        batch_size, device, precision, engine, threads: how to run the model (`engine.build.plan_engine`: the
            engine kind, "torch" or "onnxruntime", and the CPU's intra-op threads).
        overrides: reader / inputs / options settings that replace the stored ones.
        limit: score only the first N examples.
        against: also score the model at this precision and report, per metric, `precision`'s score minus
            its with a 95% paired-bootstrap interval (`evaluation.intervals`; `resamples`, `seed`): in
            `details["against"]` and metrics.json. E.g. precision="int8", against="fp32": what int8 costs.

    Raises:
        DataError: unreadable data, or a label the model does not know. ConfigError: an unknown override;
            `against` without labels, or naming the precision being scored.
        CheckpointError: not a model directory.
    """
    if limit is not None and limit < 1:
        raise ConfigError(f"limit={limit} is invalid: give the number of examples to score (at least 1), or none "
                          "for the whole file")
    plan = plan_engine(device, precision, engine, threads)  # before any work: a refused plan is refused first
    precision = plan.precision
    against_plan = None
    if against is not None:
        against_plan = plan_engine(plan.device, against, engine, threads, where="against")
        check_against(precision, against_plan.precision, labelled, resamples)
    prepared = prepare_evaluation(model_dir, data_file, labelled=labelled, batch_size=batch_size, device=plan.device,
                                  precision=precision, overrides=overrides, limit=limit)
    prepared.report.log_warnings(os.fspath(data_file))
    model = load_engine(prepared, plan)  # the engine the model will be served with (int8: quantized)
    log.info("evaluate %s: %s", os.fspath(model_dir), model.describe())
    result = prepared.evaluation(model)
    for warning in result.warnings:
        log.warning("%s: %s", os.fspath(data_file), warning)
    if against_plan is not None:
        del model  # one model in memory at a time
        result.details["against"] = compare_precisions(prepared, result, precision, against_plan,
                                                       resamples=resamples, seed=seed)
    target = Path(out_dir) if out_dir is not None else Path(model_dir) / f"eval-{Path(data_file).stem}"
    write_jsonl(target / "predictions.jsonl", result.predictions)
    write_json(target / "metrics.json", {"model": os.fspath(model_dir), "data": os.fspath(data_file),
                                         "metrics": result.metrics, "precision": precision, "engine": plan.kind,
                                         "threads": plan.threads, "warnings": result.warnings,
                                         "details": result.details, "examples": len(prepared.evaluation.examples),
                                         "data_report": prepared.report.to_dict()})
    return result
