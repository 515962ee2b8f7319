"""Fine-tuning and evaluation runs: `FinetuneConfig`, the registry of named tasks, `run_finetuning`,
`run_seeds` and `evaluate` (row 4).

A run reads a task's files (a named task such as `sst2` knows its files under the data root, its columns,
labels and metrics; `format=classification|pair|regression|ner|qa|choice` reads any file with the given
columns), builds windowed features (nothing is cut silently: the data report counts windowed inputs,
repaired answers and skipped rows), loads any BERT model directory with a fresh task head (its label names
and problem type go into the model config), and trains it with the one training loop
(`bertforge.training.loop.train`), evaluating on the dev set every epoch. The best evaluation's model is
saved to `out_dir/best` as a self-contained artifact — config.json with `id2label`, `problem_type` and
`architectures`, the weights, the tokenizer, and `finetuning.json` (how inputs were built) — which
`evaluate(model_dir, data_file)` uses to score any file and write predictions (JSONL) and metrics (JSON).

The BERT paper's two ways are both here: full fine-tuning (default) and feature-based
(`freeze_encoder=True`, with `feature_layers` such as [-1, -2, -3, -4] concatenated); the head is one linear
layer unless `classifier_hidden_sizes` asks for more. `run_seeds` repeats a run over several seeds and
reports mean ± std, because fine-tuning BERT on small data varies a lot between seeds.

Every `FinetuneConfig` field is one command-line option (`--lr 2e-5` -> `lr`), so the CLI maps argparse
arguments onto it one to one; defaults are the paper's (3 epochs, batch 32, lr 5e-5, 10% warmup, linear
decay, max_seq_length 128; 384 with doc stride 128 for QA).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bertforge.checkpoint_format import read_directory, save_model
from bertforge.configuration import shared_data_root
from bertforge.constants import FINETUNING_NAME
from bertforge.data.classification import ON_INVALID
from bertforge.data.conll import BIO_ERROR_POLICIES, LABEL_POLICIES, TAG_SCHEMES
from bertforge.data.finetuning import DataReport, Feature, FeatureBatches
from bertforge.errors import ConfigError, DataError
from bertforge.evaluation import EvalResult, Evaluation
from bertforge.families import registry
from bertforge.families.base import InputSettings
from bertforge.model.config import BertConfig
from bertforge.runtime import resolve_device, resolve_precision, set_seed
from bertforge.storage import write_json, write_jsonl
from bertforge.tokenization import Tokenizer
from bertforge.training import distributed
from bertforge.training.config import TrainingConfig
from bertforge.training.loop import train

log = logging.getLogger("bertforge.finetuning")

# --format value -> (task family, regression); "pair" is classification with a text_b column.
FORMATS = {"classification": ("classification", False), "pair": ("classification", False),
           "regression": ("classification", True), "ner": ("tagging", False), "qa": ("question_answering", False),
           "choice": ("multiple_choice", False)}
REGRESSION_METRICS = ("pearson", "spearman")
# Metrics where a smaller value is better (the best checkpoint minimises them).
LOWER_IS_BETTER = frozenset({"mse"})


# --- the registry -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DataSource:
    """A file of a named task (relative to the data root) and which deterministic part of it to use:
    None = all of it; "train"/"eval" = the article split (QA) or the carved dev split (tagging)."""

    path: str
    part: str | None = None


@dataclass(frozen=True)
class TaskSpec:
    """A named task: files, columns, labels and metrics (the first metric picks the best checkpoint)."""

    name: str
    family: str  # a registry name (families.registry)
    train: tuple[DataSource, ...]
    dev: tuple[DataSource, ...]
    test: tuple[DataSource, ...] = ()
    text_a: int | str | None = None
    text_b: int | str | None = None
    label: int | str | None = None
    header: bool | None = None
    labels: tuple[str, ...] | None = None
    metrics: tuple[str, ...] = ("accuracy",)
    separator: str = " "
    language: str = "en"
    max_seq_length: int = 128
    note: str = ""
    regression: bool = False


def _glue(name: str, folder: str, **kwargs) -> TaskSpec:
    return TaskSpec(name, kwargs.pop("family", "classification"), (DataSource(f"glue/{folder}/train.tsv"),),
                    (DataSource(f"glue/{folder}/dev.tsv"),), **kwargs)


def _qa_split(name: str, path: str, extra_train: tuple[DataSource, ...] = (), **kwargs) -> TaskSpec:
    return TaskSpec(name, "question_answering", (DataSource(path, "train"), *extra_train), (DataSource(path, "eval"),),
                    metrics=("f1", "exact_match"), max_seq_length=384, **kwargs)


TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (
    _glue("sst2", "SST-2", text_a="sentence", label="label", labels=("0", "1"), metrics=("accuracy",)),
    _glue("cola", "CoLA", text_a=3, label=1, header=False, labels=("0", "1"), metrics=("mcc", "accuracy")),
    _glue("stsb", "STS-B", regression=True, text_a="sentence1", text_b="sentence2", label=-1, header=True,
          metrics=REGRESSION_METRICS),
    _glue("rte", "RTE", text_a="sentence1", text_b="sentence2", label="label",
          labels=("entailment", "not_entailment"), metrics=("accuracy",)),
    _glue("wnli", "WNLI", text_a="sentence1", text_b="sentence2", label="label", labels=("0", "1"),
          metrics=("accuracy",)),
    TaskSpec("conll2003", "tagging", (DataSource("conll2003/train.txt"),), (DataSource("conll2003/valid.txt"),),
             metrics=("f1", "precision", "recall")),
    TaskSpec("msra_ner", "tagging", (DataSource("msra_ner/train.tsv", "train"),), (DataSource("msra_ner/train.tsv", "eval"),),
             (DataSource("msra_ner/test.tsv"),), separator="", language="zh", metrics=("f1", "precision", "recall"),
             note="no official dev split: every 20th training sentence is held out as dev"),
    _qa_split("squad", "squad_v1.1/dev-v1.1.json",
              note="only the v1.1 dev file is available: articles 3, 7, 11, ... (12 of 48) are eval, 36 train"),
    _qa_split("cmrc2018", "cmrc2018/cmrc2018_dev.json", (DataSource("cmrc2018/cmrc2018_trial.json"),),
              language="zh", note="no train file: trial + 3/4 of the dev articles train, the other 1/4 is eval"),
    _qa_split("drcd", "drcd/DRCD_dev.json", language="zh",
              note="no train file: 3/4 of the dev articles train, every 4th article is eval"),
    TaskSpec("chnsenticorp", "classification", (DataSource("chnsenticorp/train.tsv"),),
             (DataSource("chnsenticorp/dev.tsv"),), text_a="text_a", label="label", labels=("0", "1"), language="zh"),
    TaskSpec("afqmc", "classification", (DataSource("afqmc/train.txt"),), (DataSource("afqmc/dev.txt"),),
             text_a=0, text_b=1, label=2, header=False, labels=("0", "1"), language="zh"),
    TaskSpec("lcqmc", "classification", (DataSource("lcqmc/dev.txt"),), (DataSource("lcqmc/test.txt"),),
             text_a=0, text_b=1, label=2, header=False, labels=("0", "1"), language="zh",
             note="the LCQMC train file is not available: trains on dev.txt, evaluates on test.txt"),
)}


# --- the configuration ------------------------------------------------------------------------------------

@dataclass
class FinetuneConfig:
    """One fine-tuning run; each field is one command-line option of `bertforge finetune`.

    Data: `task` (a name in TASKS) or `format` with `train`/`dev` files; `data_root` overrides where named
    tasks' files live ($BERTFORGE_DATA, else ../shared/data). Columns (generic formats): `text_a_column`,
    `text_b_column`, `label_column` (header name or 0-based index), `header`, `file_format`; tagging:
    `token_column`, `tag_column`, `separator` (" " between words, "" for one character per line; "space" and
    "none" also accepted); choice: `context_column`, `start_column`, `ending_columns`. `labels` fixes the
    label order (default: the named task's, else the sorted training labels).

    Features: `max_seq_length` (default 128; QA 384), `doc_stride` (QA: step between context windows,
    default 128; others: default half a window), `max_query_length`, `max_answer_length`, `n_best_size`,
    `version_2_with_negative` (None: on when the data has unanswerable questions),
    `null_score_diff_threshold`, `label_policy` ("first"/"all" sub-tokens labelled), `tag_scheme` ("BIO" or
    "IOBES" labels for the model), `bio_errors` ("warn"/"error"), `on_invalid` ("error"/"skip" malformed
    rows), `train_limit`/`dev_limit` (first N examples).

    Model: `model` (a model directory), `freeze_encoder` + `feature_layers` (feature-based),
    `classifier_hidden_sizes`, `classifier_dropout`, `fresh_head` (discard a stored head).

    Training: `epochs`, `steps` (overrides epochs when > 0), `batch_size`, `eval_batch_size`,
    `grad_accumulation`, `lr`, `warmup_ratio`, `weight_decay`, `max_grad_norm`, `precision`, `device`, `seed`,
    `seeds` (several runs, mean ± std), `eval_every` (steps; 0 = every epoch), `metric` (picks the best
    checkpoint; default the task's first metric), `evaluate_test` (score the best model on a named task's
    test split too), `log_every`, `progress`, `resume`, `out_dir`, `activation_checkpointing` (recompute
    layers in the backward pass: far less activation memory, e.g. BERT-large on a small GPU), `fast_path`
    (skip padding tokens and fuse the QKV projection, in training and evaluation; tested equal to the plain
    path).
    """

    model: str = ""
    task: str | None = None
    format: str | None = None
    train: str | None = None
    dev: str | None = None
    data_root: str | None = None
    out_dir: str = "runs/finetune"
    text_a_column: str | None = None
    text_b_column: str | None = None
    label_column: str | None = None
    header: bool | None = None
    file_format: str | None = None
    token_column: int = 0
    tag_column: int = -1
    separator: str | None = None
    context_column: str = "sent1"
    start_column: str | None = "sent2"
    ending_columns: list[str] | None = None
    labels: list[str] | None = None
    on_invalid: str = "error"
    bio_errors: str = "warn"
    max_seq_length: int | None = None
    doc_stride: int | None = None
    max_query_length: int = 64
    max_answer_length: int = 30
    n_best_size: int = 20
    version_2_with_negative: bool | None = None
    null_score_diff_threshold: float = 0.0
    label_policy: str = "first"
    tag_scheme: str = "BIO"
    language: str | None = None
    train_limit: int | None = None
    dev_limit: int | None = None
    freeze_encoder: bool = False
    feature_layers: list[int] | None = None
    classifier_hidden_sizes: list[int] | None = None
    classifier_dropout: float | None = None
    fresh_head: bool = False
    epochs: float = 3.0
    steps: int = 0
    batch_size: int = 32
    eval_batch_size: int = 64
    grad_accumulation: int = 1
    lr: float = 5e-5
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    precision: str = "auto"
    device: str = "auto"
    seed: int = 42
    seeds: list[int] | None = None
    eval_every: int = 0
    metric: str | None = None
    evaluate_test: bool = True
    log_every: int = 50
    progress: bool = True
    resume: str = "never"
    activation_checkpointing: bool = False
    fast_path: bool = True

    def __post_init__(self) -> None:
        def need(cond: bool, name: str, fix: str) -> None:
            if not cond:
                raise ConfigError(f"finetune.{name}={getattr(self, name)!r} is invalid: {fix}")

        need(self.task is None or self.task in TASKS, "task",
             f"unknown task; choose one of {sorted(TASKS)} or give --format with --train/--dev files")
        need(self.format is None or self.format in FORMATS, "format", f"use one of {sorted(FORMATS)}")
        need(self.on_invalid in ON_INVALID, "on_invalid", f"use one of {ON_INVALID}")
        need(self.bio_errors in BIO_ERROR_POLICIES, "bio_errors", f"use one of {BIO_ERROR_POLICIES}")
        need(self.label_policy in LABEL_POLICIES, "label_policy", f"use one of {LABEL_POLICIES}")
        need(self.tag_scheme in TAG_SCHEMES, "tag_scheme", f"use one of {TAG_SCHEMES}")
        need(self.max_seq_length is None or self.max_seq_length >= 8, "max_seq_length", "use at least 8 tokens")
        need(self.doc_stride is None or self.doc_stride > 0, "doc_stride", "use a positive number of tokens")
        for name in ("max_query_length", "max_answer_length", "n_best_size", "batch_size", "eval_batch_size",
                     "grad_accumulation", "log_every"):
            need(getattr(self, name) > 0, name, "use a positive integer")
        need(self.train_limit is None or self.train_limit > 0, "train_limit", "use a positive count or leave unset")
        need(self.dev_limit is None or self.dev_limit > 0, "dev_limit", "use a positive count or leave unset")
        need(self.seeds is None or len(self.seeds) > 0, "seeds", "give at least one seed, e.g. [1, 2, 3]")
        if self.separator in ("space", "none"):
            self.separator = " " if self.separator == "space" else ""

    def training_config(self, out_dir: str | os.PathLike, eval_every: int) -> TrainingConfig:
        """The loop's settings for this run (evaluation every `eval_every` steps, one final checkpoint)."""
        return TrainingConfig(steps=self.steps, epochs=self.epochs, batch_size=self.batch_size,
                              grad_accumulation=self.grad_accumulation, lr=self.lr, warmup_ratio=self.warmup_ratio,
                              weight_decay=self.weight_decay, max_grad_norm=self.max_grad_norm,
                              precision=self.precision, device=self.device, log_every=self.log_every,
                              eval_every=eval_every, save_every=0, keep_last=1, seed=self.seed,
                              out_dir=os.fspath(out_dir), resume=self.resume, progress=self.progress,
                              tensorboard=False, activation_checkpointing=self.activation_checkpointing)


# --- resolving a run's task -------------------------------------------------------------------------------

def data_root(config: FinetuneConfig) -> Path:
    return Path(config.data_root) if config.data_root else shared_data_root()


def resolve_task(config: FinetuneConfig) -> TaskSpec:
    """The task a run trains: the named task with the config's column overrides, or one built from `format`.

    Raises:
        ConfigError: neither (or both inconsistently) given, or a generic format without its files.
    """
    if config.task is not None:
        spec = TASKS[config.task]
        root = data_root(config)

        def rooted(sources: tuple[DataSource, ...]) -> tuple[DataSource, ...]:
            return tuple(DataSource(os.fspath(root / s.path), s.part) for s in sources)

        changes: dict[str, Any] = {"train": rooted(spec.train), "dev": rooted(spec.dev), "test": rooted(spec.test)}
        if config.train:
            changes["train"] = (DataSource(config.train),)
        if config.dev:
            changes["dev"] = (DataSource(config.dev),)
        return dataclasses.replace(spec, **changes)
    if config.format is None:
        raise ConfigError(f"say what to train: --task NAME (one of {sorted(TASKS)}) or --format "
                          f"{'|'.join(FORMATS)} with --train FILE [--dev FILE]")
    if not config.train and not config.dev:
        raise ConfigError(f"--format {config.format} needs --train FILE (and --dev FILE to evaluate)")
    family_name, regression = FORMATS[config.format]
    family = registry.family(family_name)
    pair = config.format == "pair" or config.text_b_column is not None
    return TaskSpec(
        name=config.format, family=family.name,
        train=(DataSource(config.train),) if config.train else (),
        dev=(DataSource(config.dev),) if config.dev else (),
        text_a="text_a", text_b="text_b" if pair else None, label="label",
        metrics=REGRESSION_METRICS if regression else family.default_metrics,
        max_seq_length=family.default_max_seq_length, language=family.default_language,
        regression=regression)


def _column(value: str | None, default):
    return default if value is None else value


def reader_options(spec: TaskSpec, config: FinetuneConfig) -> dict[str, Any]:
    """The settings every family's reader may need: the config's, falling back to the named task's."""
    return {"text_a": _column(config.text_a_column, spec.text_a), "text_b": _column(config.text_b_column, spec.text_b),
            "label": _column(config.label_column, spec.label),
            "header": config.header if config.header is not None else spec.header, "regression": spec.regression,
            "file_format": config.file_format, "on_invalid": config.on_invalid, "token_column": config.token_column,
            "tag_column": config.tag_column, "separator": config.separator if config.separator is not None
            else spec.separator, "bio_errors": config.bio_errors, "context_column": config.context_column,
            "start_column": config.start_column, "ending_columns": config.ending_columns}


def read_examples(spec: TaskSpec, sources: Sequence[DataSource], config: FinetuneConfig, report: DataReport,
                  labelled: bool = True) -> list:
    """Read and concatenate the examples of `sources` (with their deterministic parts) for `spec`'s family."""
    family = registry.family(spec.family)
    options = reader_options(spec, config)
    examples: list = []
    for source in sources:
        examples.extend(family.read(source.path, part=source.part, options=options, report=report, labelled=labelled))
    return examples


def input_settings(config: FinetuneConfig, max_seq_length: int) -> InputSettings:
    return InputSettings(max_seq_length=max_seq_length, doc_stride=config.doc_stride,
                         max_query_length=config.max_query_length, tag_scheme=config.tag_scheme,
                         label_policy=config.label_policy)


@dataclass
class PreparedData:
    """Everything a run needs besides the model: examples, features, label names, the data report."""

    spec: TaskSpec
    tokenizer: Tokenizer
    label_names: list[str] | None
    max_seq_length: int
    train_examples: list
    train_features: list[Feature]
    dev_examples: list
    dev_features: list[Feature]
    report: DataReport
    version_2_with_negative: bool = False
    settings: InputSettings | None = None

    @property
    def id2label(self) -> dict[int, str] | None:
        return None if self.label_names is None else dict(enumerate(self.label_names))


def prepare_data(config: FinetuneConfig, tokenizer: Tokenizer, spec: TaskSpec | None = None,
                 model_config: BertConfig | None = None) -> PreparedData:
    """Read the task's train and dev files, fix the labels, build features; every count goes to the report.

    The default max_seq_length (128; QA 384) is lowered to the model's max_position_embeddings when that is
    smaller; an explicit `config.max_seq_length` is kept as given. `model_config` is the model directory's
    config (default: read from `config.model`); the run's head (label names, problem type) is applied to it.

    Raises:
        DataError: unreadable or malformed files, a dev label unseen in training.
        ConfigError: an unusable combination of options.
    """
    spec = spec or resolve_task(config)
    report, train_report, dev_report = DataReport(), DataReport(), DataReport()
    train_examples = read_examples(spec, spec.train, config, train_report)
    dev_examples = read_examples(spec, spec.dev, config, dev_report)
    if config.train_limit is not None and len(train_examples) > config.train_limit:
        train_report.note("limited_from", amount=len(train_examples))
        train_examples = train_examples[:config.train_limit]
    if config.dev_limit is not None and len(dev_examples) > config.dev_limit:
        dev_report.note("limited_from", amount=len(dev_examples))
        dev_examples = dev_examples[:config.dev_limit]
    if spec.train and not train_examples:
        raise DataError("no usable training examples", spec.train[0].path)

    family = registry.family(spec.family)
    model_config = model_config or read_directory(config.model).config
    max_positions = model_config.max_position_embeddings
    max_seq_length = config.max_seq_length or min(spec.max_seq_length, max_positions)
    settings = input_settings(config, max_seq_length)
    label_names = family.label_names(train_examples, config.labels or spec.labels, settings, spec.regression)
    if label_names is not None:
        family.check_labels(train_examples, label_names, settings)
        family.check_labels(dev_examples, label_names, settings)
    head = model_config.replace(**family.head_config(label_names, spec.regression))
    train_features = family.features(train_examples, tokenizer, settings, config=head, report=train_report,
                                     training=True)
    dev_features = family.features(dev_examples, tokenizer, settings, config=head, report=dev_report)
    version_2 = config.version_2_with_negative
    if version_2 is None:
        version_2 = any(getattr(e, "is_impossible", False) for e in [*train_examples, *dev_examples])
    train_report.log_warnings(f"{spec.name} train")
    dev_report.log_warnings(f"{spec.name} dev")
    report.merge(train_report, "train.").merge(dev_report, "dev.")
    return PreparedData(spec, tokenizer, label_names, max_seq_length, train_examples, train_features, dev_examples,
                        dev_features, report, version_2, settings)


def make_evaluation(spec: TaskSpec, examples: Sequence, features: Sequence[Feature], config: FinetuneConfig,
                    model_config, tokenizer: Tokenizer, version_2_with_negative: bool) -> Evaluation:
    """The one evaluation path for these examples, with the run's decoding options and scoring choices."""
    family = registry.family(spec.family)
    options = family.run_options({**dataclasses.asdict(config), "version_2_with_negative": version_2_with_negative})
    scoring = {"metric_names": list(spec.metrics) if spec.regression or spec.metrics != ("accuracy",) else None,
               "language": config.language or spec.language, "version_2": bool(version_2_with_negative)}
    return Evaluation(family, examples, features, config=model_config, batch_size=config.eval_batch_size,
                      pad_token_id=tokenizer.pad_token_id, options=options, scoring=scoring, tokenizer=tokenizer)


def load_task_model(config: FinetuneConfig, spec: TaskSpec, label_names: list[str] | None, max_seq_length: int):
    """The model directory loaded into the family's class, its head fresh where the checkpoint has none."""
    if not config.model:
        raise ConfigError("finetune.model is empty: pass --model DIR, a BERT model directory (config.json, weights, "
                          "vocab.txt)")
    family = registry.family(spec.family)
    overrides: dict[str, Any] = {"freeze_encoder": config.freeze_encoder, "feature_layers": config.feature_layers}
    if config.classifier_hidden_sizes is not None:
        overrides["classifier_hidden_sizes"] = list(config.classifier_hidden_sizes)
    if config.classifier_dropout is not None:
        overrides["classifier_dropout"] = config.classifier_dropout
    overrides.update(family.head_config(label_names, spec.regression))
    model, _ = registry.load_model(config.model, family.model_class, config_overrides=overrides,
                                   fresh_head=config.fresh_head, fast_path=config.fast_path)
    if max_seq_length > model.config.max_position_embeddings:
        raise ConfigError(f"max_seq_length={max_seq_length} exceeds the model's max_position_embeddings="
                          f"{model.config.max_position_embeddings}; lower it (long inputs are windowed anyway)")
    return model


def finetuning_record(spec: TaskSpec, config: FinetuneConfig, prepared_max_len: int, label_names, version_2: bool,
                      metric: str) -> dict[str, Any]:
    """What `finetuning.json` stores: how inputs were built, so `evaluate`, `predict` and the server rebuild
    them the same way (`InputSettings.from_record` reads the input settings back)."""
    return {
        "task": config.task, "format": config.format, "family": spec.family, "regression": spec.regression,
        "text_a_column": _column(config.text_a_column, spec.text_a),
        "text_b_column": _column(config.text_b_column, spec.text_b),
        "label_column": _column(config.label_column, spec.label),
        "header": config.header if config.header is not None else spec.header,
        "file_format": config.file_format, "token_column": config.token_column, "tag_column": config.tag_column,
        "separator": config.separator if config.separator is not None else spec.separator,
        "context_column": config.context_column, "start_column": config.start_column,
        "ending_columns": config.ending_columns, "labels": label_names, "max_seq_length": prepared_max_len,
        "doc_stride": config.doc_stride, "max_query_length": config.max_query_length,
        "max_answer_length": config.max_answer_length, "n_best_size": config.n_best_size,
        "version_2_with_negative": version_2, "null_score_diff_threshold": config.null_score_diff_threshold,
        "label_policy": config.label_policy, "tag_scheme": config.tag_scheme,
        "language": config.language or spec.language, "metrics": list(spec.metrics), "metric": metric,
    }


# --- running ----------------------------------------------------------------------------------------------

@dataclass
class FinetuneResult:
    """What a run reports.

    Attributes:
        task: task (or format) name. metric: the metric that picked the best checkpoint.
        best_metrics: the dev metrics of the best evaluation ({} without a dev set).
        best_step: optimizer step of the best evaluation.
        history: every evaluation: {"step", "epoch", "metrics"}.
        model_dir: the saved best model (an artifact).
        out_dir: the run directory (metrics.jsonl, eval_results.json, dev_predictions.jsonl).
        data_report: counts of skipped/repaired/windowed inputs (see `DataReport`).
        warnings: e.g. prediction collapse, per evaluation.
        seconds: wall time of the run. seed: the seed.
        train_examples, dev_examples: how many were used.
        test_metrics: the best model's metrics on the task's test split, where it has one (MSRA NER).
    """

    task: str
    metric: str
    best_metrics: dict[str, float]
    best_step: int
    history: list[dict[str, Any]]
    model_dir: Path
    out_dir: Path
    data_report: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    seed: int = 0
    train_examples: int = 0
    dev_examples: int = 0
    test_metrics: dict[str, float] = field(default_factory=dict)


def better(metric: str, value: float, than: float | None) -> bool:
    """Whether `value` of `metric` beats `than` (None: anything does)."""
    if than is None:
        return True
    return value < than if metric in LOWER_IS_BETTER else value > than


def run_finetuning(config: FinetuneConfig) -> FinetuneResult | SeedsResult:
    """Fine-tune `config.model` on the task and keep the best checkpoint (see the module docstring).

    With `config.seeds`, runs once per seed (`run_seeds`) and returns the `SeedsResult`.

    Raises:
        ConfigError: bad options. DataError: bad data. CheckpointError: unusable model directory.
    """
    if config.seeds:
        return run_seeds(config)
    started = time.perf_counter()
    out_dir = Path(config.out_dir)
    spec = resolve_task(config)
    if not config.model:
        raise ConfigError("finetune.model is empty: pass --model DIR, a BERT model directory (config.json, "
                          "weights, vocab.txt)")
    directory = read_directory(config.model)
    tokenizer = directory.require_tokenizer()
    prepared = prepare_data(config, tokenizer, spec, directory.config)
    metric = config.metric or spec.metrics[0]
    log.info("%s: %d train examples -> %d features, %d dev examples -> %d features; %s", spec.name,
             len(prepared.train_examples), len(prepared.train_features), len(prepared.dev_examples),
             len(prepared.dev_features), "; ".join(prepared.report.lines()))
    set_seed(config.seed)  # the fresh head's initialisation depends on the seed, as the paper's restarts do
    model = load_task_model(config, spec, prepared.label_names, prepared.max_seq_length)
    batches = FeatureBatches(prepared.train_features, config.batch_size, tokenizer.pad_token_id, shuffle=True,
                             seed=config.seed, rank=distributed.env_int("RANK", 0),
                             world_size=distributed.env_int("WORLD_SIZE", 1))
    steps_per_epoch = max(1, math.ceil(len(batches) / config.grad_accumulation))
    eval_every = config.eval_every or steps_per_epoch
    training = config.training_config(out_dir, eval_every)
    total_steps = training.total_steps(len(batches))
    record = finetuning_record(spec, config, prepared.max_seq_length, prepared.label_names,
                               prepared.version_2_with_negative, metric)
    best_dir = out_dir / "best"
    extra = {FINETUNING_NAME: json.dumps(record, indent=2, ensure_ascii=False) + "\n"}
    history: list[dict[str, Any]] = []
    warnings: list[str] = []
    best: dict[str, Any] = {"step": None, "metrics": {}, "predictions": None}

    evaluator = None
    if prepared.dev_examples:
        evaluator = make_evaluation(spec, prepared.dev_examples, prepared.dev_features, config, model.config,
                                    tokenizer, prepared.version_2_with_negative)

    def eval_fn(current: torch.nn.Module, step: int) -> dict[str, float]:
        result = evaluator(current)
        if metric not in result.metrics:
            raise ConfigError(f"finetune.metric={metric!r} is not among this task's evaluation metrics "
                              f"{sorted(result.metrics)}")
        history.append({"step": step, "epoch": round(step / steps_per_epoch, 4), "metrics": result.metrics})
        for warning in result.warnings:
            log.warning("%s eval at step %d: %s", spec.name, step, warning)
            warnings.append(f"step {step}: {warning}")
        if better(metric, result.metrics[metric], best["metrics"].get(metric)):
            best.update(step=step, metrics=dict(result.metrics), predictions=result.predictions)
            if distributed.is_main():
                save_model(current, best_dir, tokenizer=tokenizer, extra_files=extra)
        return result.metrics

    objective = registry.family(spec.family).objective_for(model.config)
    outcome = train(model, batches, objective, training, eval_fn=eval_fn if evaluator else None,
                    tokenizer=tokenizer)
    if evaluator is None and distributed.is_main():
        save_model(model, best_dir, tokenizer=tokenizer, extra_files=extra)
    test_metrics: dict[str, float] = {}
    if spec.test and config.evaluate_test and evaluator is not None:
        test_metrics = evaluate_split(spec, spec.test, config, prepared, best_dir)
    result = FinetuneResult(spec.name, metric, best["metrics"], best["step"] or outcome.step, history, best_dir,
                            out_dir, prepared.report.to_dict(), warnings, time.perf_counter() - started, config.seed,
                            len(prepared.train_examples), len(prepared.dev_examples), test_metrics)
    if distributed.is_main():
        summary = {"task": spec.name, "metric": metric, "best_metrics": result.best_metrics,
                   "best_step": result.best_step, "total_steps": total_steps, "history": history,
                   "test_metrics": test_metrics, "data_report": result.data_report, "warnings": warnings,
                   "seed": config.seed, "seconds": result.seconds, "train_examples": result.train_examples,
                   "dev_examples": result.dev_examples, "config": dataclasses.asdict(config)}
        write_json(out_dir / "eval_results.json", summary)
        if best["predictions"] is not None:
            write_jsonl(out_dir / "dev_predictions.jsonl", best["predictions"])
    log.info("%s: best %s %.4f at step %d of %d (%s)", spec.name, metric,
             result.best_metrics.get(metric, float("nan")), result.best_step, total_steps, best_dir)
    return result


def evaluate_split(spec: TaskSpec, sources: Sequence[DataSource], config: FinetuneConfig, prepared: PreparedData,
                   model_dir: Path) -> dict[str, float]:
    """Metrics of the saved best model on another labelled split of the task (e.g. MSRA's test file)."""
    family = registry.family(spec.family)
    report = DataReport()
    examples = read_examples(spec, sources, config, report)
    device = resolve_device(config.device)
    model, _ = registry.load_model(model_dir, family.model_class, device=device, fast_path=config.fast_path)
    if prepared.label_names is not None:
        family.check_labels(examples, prepared.label_names, prepared.settings)
    features = family.features(examples, prepared.tokenizer, prepared.settings, config=model.config, report=report)
    evaluator = make_evaluation(spec, examples, features, config, model.config, prepared.tokenizer,
                                prepared.version_2_with_negative)
    evaluator.device = device
    metrics = evaluator(model).metrics
    log.info("%s test (%d examples): %s", spec.name, len(examples),
             ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    return metrics


@dataclass
class SeedsResult:
    """Several runs of one configuration: per-seed results and, per metric, mean, std (n-1), min, max."""

    task: str
    metric: str
    seeds: list[int]
    runs: list[FinetuneResult]
    summary: dict[str, dict[str, float]]
    out_dir: Path

    def line(self) -> str:
        """e.g. "sst2 accuracy: 0.9123 ± 0.0041 over 5 seeds (min 0.9060, max 0.9163)"."""
        stats = self.summary.get(self.metric, {})
        return (f"{self.task} {self.metric}: {stats.get('mean', float('nan')):.4f} ± {stats.get('std', 0.0):.4f} "
                f"over {len(self.seeds)} seeds (min {stats.get('min', float('nan')):.4f}, "
                f"max {stats.get('max', float('nan')):.4f})")


def summarize(values: Sequence[float]) -> dict[str, float]:
    """mean, sample std (n-1; 0 for one value), min, max, n."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": n}


def run_seeds(config: FinetuneConfig) -> SeedsResult:
    """Run `config` once per seed in `config.seeds` (each in out_dir/seed-<s>) and summarise the best metrics."""
    seeds = list(config.seeds or [config.seed])
    out_dir = Path(config.out_dir)
    runs: list[FinetuneResult] = []
    for seed in seeds:
        log.info("seed %d (%d of %d)", seed, len(runs) + 1, len(seeds))
        single = dataclasses.replace(config, seed=seed, seeds=None, out_dir=os.fspath(out_dir / f"seed-{seed}"))
        runs.append(run_finetuning(single))
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
        log.warning("seeds %s had evaluations whose predictions collapsed to one class", collapsed)
    return result


# --- evaluating a saved model -----------------------------------------------------------------------------

def evaluate(model_dir: str | os.PathLike, data_file: str | os.PathLike, *, out_dir: str | os.PathLike | None = None,
             labelled: bool = True, batch_size: int = 64, device: str = "auto", precision: str = "fp32",
             overrides: dict[str, Any] | None = None) -> EvalResult:
    """Score a fine-tuned model directory on a data file; write `predictions.jsonl` and `metrics.json`.

    How inputs are built (columns, max_seq_length, doc stride, tag scheme...) comes from the directory's
    `finetuning.json`; `overrides` (FinetuneConfig field names, e.g. {"text_a_column": "review"}) change it.
    The task kind and label names come from its config.json (`architectures`, `problem_type`, `id2label`).

    Args:
        model_dir: a directory saved by `run_finetuning` (or any task-model directory, with `overrides`
            naming the columns).
        data_file: the file to score.
        out_dir: where to write (default: model_dir/eval-<file stem>).
        labelled: False for a file without labels/answers: predictions only, no metrics.
        batch_size, device, precision: how to run the model.
        overrides: FinetuneConfig fields that replace the stored settings.

    Returns:
        The EvalResult (metrics, predictions, warnings, details).

    Raises:
        DataError: unreadable data, or a label the model does not know. ConfigError: an unknown override.
        CheckpointError: not a model directory.
    """
    model_dir = Path(model_dir)
    directory = read_directory(model_dir)
    stored = directory.finetuning or {}
    family = registry.for_model(registry.model_class(directory.architecture))
    if family not in registry.FINETUNING_FAMILIES:
        raise ConfigError(f"{model_dir}: config.json names {directory.architecture or 'BertModel'}, which has no "
                          "fine-tuned head to evaluate; pass a directory saved by `bertforge finetune`")
    known = {f.name for f in dataclasses.fields(FinetuneConfig)}
    unknown = sorted(set(overrides or {}) - known)
    if unknown:
        raise ConfigError(f"evaluate: unknown option(s) {unknown}; use FinetuneConfig field names")
    fields = {k: v for k, v in stored.items() if k in known and k not in ("task", "format", "labels", "metric")}
    fields.update(overrides or {})
    for name in ("text_a_column", "text_b_column", "label_column"):
        if isinstance(fields.get(name), int):
            fields[name] = str(fields[name])
    config = FinetuneConfig(**{**fields, "model": os.fspath(model_dir), "task": None, "format": None,
                               "eval_batch_size": batch_size, "device": device})
    regression = directory.config.problem_type == "regression"
    spec = TaskSpec(stored.get("task") or family.name, family.name, (), (DataSource(os.fspath(data_file)),),
                    text_a="text_a", label="label",
                    metrics=tuple(stored.get("metrics") or (REGRESSION_METRICS if regression else family.default_metrics)),
                    separator=" ", language="auto", max_seq_length=family.default_max_seq_length, regression=regression)
    tokenizer = directory.require_tokenizer()
    report = DataReport()
    examples = read_examples(spec, spec.dev, config, report, labelled=labelled)
    if config.dev_limit is not None:
        examples = examples[:config.dev_limit]
    if not examples:
        raise DataError("no examples to evaluate", data_file)
    settings = input_settings(config, config.max_seq_length or spec.max_seq_length)
    if labelled and not regression and directory.config.id2label:
        family.check_labels(examples, directory.config.label_names, settings)
    run_device = resolve_device(device)
    model, _ = registry.load_model(model_dir, family.model_class, device=run_device)
    features = family.features(examples, tokenizer, settings, config=model.config, report=report)
    report.log_warnings(os.fspath(data_file))
    version_2 = bool(config.version_2_with_negative) or any(getattr(e, "is_impossible", False) for e in examples)
    evaluator = make_evaluation(spec, examples, features, config, model.config, tokenizer, version_2)
    evaluator.device = run_device
    evaluator.precision = resolve_precision(precision, run_device)
    result = evaluator(model)
    for warning in result.warnings:
        log.warning("%s: %s", os.fspath(data_file), warning)
    target = Path(out_dir) if out_dir is not None else model_dir / f"eval-{Path(data_file).stem}"
    write_jsonl(target / "predictions.jsonl", result.predictions)
    write_json(target / "metrics.json", {"model": os.fspath(model_dir), "data": os.fspath(data_file),
                                                "metrics": result.metrics, "warnings": result.warnings,
                                                "details": result.details, "examples": len(examples),
                                                "data_report": report.to_dict()})
    return result
