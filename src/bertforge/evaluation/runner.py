"""The one path from features to answers: run a model over features in length-sorted batches, then decode.

Training-time evaluation, `bertforge evaluate`, `bertforge predict`, the Python pipelines and the server
all call `run_features` (one batched runner) and the family's `decode` (one decoder per family), so the
model you evaluated is the model you serve: same windows, same aggregation, same n-best selection.

- `run_features(model, features, forward, ...)`: every feature once, through the model's engine
  (`engine.build.as_engine`: an engine, or the model as it is at the chosen precision) inside `engine.running()`
  (eval mode, no gradients, autocast where the precision says), in batches of similar length (less padding);
  outputs come back in feature order.
- `Evaluation`: examples + features of one split; calling it with a model runs, decodes and scores, and
  returns an `EvalResult` (metrics named as `bertforge.metrics` names them, one JSON-ready record per
  example — what `evaluate` writes — and warnings such as predictions collapsed to one class).

Every record starts with the example's `id` (`example_id`): the id the file gives the row (a table's id
column, SQuAD's question id), else where the row is ("file:line"), so the predictions for a test file whose
labels are withheld can be matched to its rows and submitted.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from bertforge.data.finetuning import Feature, FeatureBatches, FinetuneBatch, collate_features
from bertforge.engine.build import as_engine
from bertforge.evaluation.streaming import padding_batches
from bertforge.families.base import Family
from bertforge.families.task import TaskDescription
from bertforge.model.config import BertConfig
from bertforge.runtime import DEFAULT_PRECISION
from bertforge.tokenization.tokenizer import Tokenizer


@dataclass
class EvalResult:
    """metrics: {name: value}; predictions: one JSON-ready record per example; warnings: plain sentences;
    details: extra structured results (per-type entity scores...); calibration: the config changes the
    family tuned on this split (multi-label thresholds), which the metrics and predictions already use;
    results: the decoded result per example the records were made from (what `Evaluation.score` takes)."""

    metrics: dict[str, float]
    predictions: list[dict]
    warnings: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)
    calibration: dict = field(default_factory=dict)
    results: list[dict] = field(default_factory=list, repr=False)


def run_features(model: torch.nn.Module, features: Sequence[Feature],
                 forward: Callable[[torch.nn.Module, FinetuneBatch], list[Any]], *, batch_size: int,
                 pad_token_id: int, device: torch.device | str | None = None,
                 precision: str = DEFAULT_PRECISION, split_padding: bool = False) -> list[Any]:
    """`forward(engine, batch)` over every feature once, batched by length; one output per feature, in order.

    `model` is an engine (`engine.build.build_engine`), or a model run as it is (its training mode is restored
    afterwards); an int8 precision needs an engine built for it. `split_padding`: also start a new batch where
    the next feature would pad it by more than it holds (`streaming.padding_batches`: the server's calls mix
    short requests with a large one's long windows).
    """
    if not features:
        return []
    engine = as_engine(model, device=device, precision=precision)
    outputs: list[Any] = [None] * len(features)
    if split_padding:
        batches: Iterable[FinetuneBatch] = (
            collate_features([features[i] for i in rows], rows, pad_token_id)
            for rows in padding_batches([len(feature) for feature in features], batch_size))
    else:
        batches = FeatureBatches(features, batch_size, pad_token_id, shuffle=False)
    with engine.running():
        for batch in batches:
            rows = batch.feature_index.tolist()
            results = forward(engine, batch.to(engine.device))
            for index, result in zip(rows, results):
                outputs[index] = result
    return outputs


def example_id(example: Any) -> str:
    """The id of an example's prediction record: its own id (a table's id column, a SWAG row id), SQuAD's
    question id, else its source ("file:line")."""
    for name in ("id", "qid", "source"):
        value = getattr(example, name, None)
        if value not in (None, ""):
            return str(value)
    raise TypeError(f"{type(example).__name__} has no id, qid or source to name its prediction by")


class Evaluation:
    """One split's examples and features, evaluated through the one path.

    Args:
        family: the task family.
        examples, features: the data (features built from these examples by `family.features`).
        config: the model's config (label names, problem type).
        batch_size: features per forward pass.
        pad_token_id: the tokenizer's [PAD] id.
        options: decoding options (`family.options`; defaults filled in).
        scoring: the run's scoring choices (`metric_names`, `language`; see `Family.score`).
        device, precision: where and how to run (default: the model's device, fp32).
        calibrate: tune the family's decision settings on this (dev) split before scoring (`family.calibrate`;
            multi-label thresholds: "global" or "per_label"); None scores with the config as it is.
    """

    def __init__(self, family: Family, examples: Sequence[Any], features: Sequence[Feature], *, config: BertConfig,
                 batch_size: int, pad_token_id: int, options: Mapping[str, Any] | None = None,
                 scoring: Mapping[str, Any] | None = None, tokenizer: Tokenizer | None = None,
                 device: torch.device | str | None = None, precision: str = DEFAULT_PRECISION,
                 calibrate: str | None = None):
        self.family = family
        self.examples = list(examples)
        self.features = list(features)
        self.config = config
        self.batch_size = batch_size
        self.pad_token_id = pad_token_id
        self.options = family.check_options(dict(options or {}))
        self.scoring = dict(scoring or {})
        self.tokenizer = tokenizer
        self.device = device
        self.precision = precision
        self.labelled = family.labelled(self.examples)
        self.calibrate = calibrate

    @classmethod
    def for_task(cls, task: TaskDescription, examples: Sequence[Any], features: Sequence[Feature], *,
                 config: BertConfig, tokenizer: Tokenizer, batch_size: int, chosen: str | None = None,
                 calibrate: str | None = None, device: torch.device | str | None = None,
                 precision: str = DEFAULT_PRECISION) -> Evaluation:
        """The evaluation of `task` on these examples: its decoding options and language, and the metric
        names the family is asked for so that `chosen` (the metric picking the best model) is computed too.
        `calibrate` tunes the family's decision settings on these examples (a run's dev set)."""
        scoring = {"metric_names": task.family.requested_metrics(task, chosen, config), "language": task.language}
        return cls(task.family, examples, features, config=config, batch_size=batch_size,
                   pad_token_id=tokenizer.pad_token_id, options=task.options, scoring=scoring, tokenizer=tokenizer,
                   device=device, precision=precision, calibrate=calibrate)

    def outputs(self, model: torch.nn.Module) -> list[Any]:
        return run_features(model, self.features, partial(self.family.forward, options=self.options),
                            batch_size=self.batch_size,
                            pad_token_id=self.pad_token_id, device=self.device, precision=self.precision)

    def decode(self, outputs: Sequence[Any], config: BertConfig | None = None) -> list[dict[str, Any]]:
        return self.family.decode(self.examples, self.features, outputs, self.options, config or self.config,
                                  self.tokenizer)

    def results(self, model: torch.nn.Module) -> list[dict[str, Any]]:
        """One decoded result per example (what predict returns for the same inputs)."""
        return self.decode(self.outputs(model))

    def at_precision(self, precision: str) -> Evaluation:
        """The same examples and features, run at another precision (no second read of the data)."""
        other = copy.copy(self)
        other.precision = precision
        return other

    def score(self, results: Sequence[dict[str, Any]], config: BertConfig | None = None,
              rows: Sequence[int] | None = None) -> tuple[dict[str, float], dict, list[str]]:
        """The family's (metrics, details, warnings) of `results` (one per example) against the gold labels;
        `rows` scores those examples only (indices; repeats allowed, as in a bootstrap resample)."""
        examples = self.examples
        if rows is not None:
            examples, results = [examples[i] for i in rows], [results[i] for i in rows]
        return self.family.score(examples, results, self.config if config is None else config, options=self.options,
                                 **self.scoring)

    def __call__(self, model: torch.nn.Module) -> EvalResult:
        outputs = self.outputs(model)
        config = self.config
        results = self.decode(outputs, config)
        calibration: dict[str, Any] = {}
        before: dict[str, float] = {}
        if self.labelled and self.calibrate is not None:
            calibration = self.family.calibrate(self.examples, results, config, self.calibrate)
            if calibration:
                # Scores with the settings as they were, then decode again with the tuned ones.
                before = self.score(results, config)[0]
                config = config.replace(**calibration)
                results = self.decode(outputs, config)
        records = [{"id": example_id(e), **self.family.record(e, r)} for e, r in zip(self.examples, results)]
        if not self.labelled:
            return EvalResult({}, records, results=results)
        metrics, details, warnings = self.score(results, config)
        if calibration:
            details = {**details, "calibration": calibration, "before_calibration": before}
        return EvalResult(metrics, records, warnings, details, calibration, results)
