"""Fine-tuning and evaluation runs: `FinetuneConfig`, the registry of named tasks, `run_finetuning`,
`run_seeds` and `evaluate` (row 4).

A run reads a task's files (a named task such as `sst2` knows its files under the data root, its columns,
labels and metrics; `format=classification|pair|regression|ner|qa|choice` reads any file with the given
columns), builds windowed features (nothing is cut silently: the data report counts windowed inputs,
repaired answers and skipped rows), loads any BERT model directory with a fresh task head (its label names
and problem type go into the model config), and trains it with the one training loop
(`bertforge.training.loop.train`), evaluating on the dev set every epoch. The loop saves the best
evaluation's model to `training.out_dir/best` as a self-contained artifact — config.json with `id2label`,
`problem_type` and `architectures`, the weights, the tokenizer, and `finetuning.json` (how inputs were
built) — which `evaluate(model_dir, data_file)` uses to score any file and write predictions (JSONL) and
metrics (JSON).

The BERT paper's two ways are both here: full fine-tuning (default) and feature-based
(`head.freeze_encoder`, with `head.feature_layers` such as [-1, -2, -3, -4] concatenated); the head is one
linear layer unless `head.classifier_hidden_sizes` asks for more. `run_seeds` repeats a run over several
seeds and reports mean ± std, because fine-tuning BERT on small data varies a lot between seeds.

`FinetuneConfig` nests its settings in tables as `PretrainConfig` does — `[data]`, `[features]`, `[head]` and
`[training]` (the loop's `TrainingConfig`) — so run files and `--training.lr=2e-5` overrides load through
`bertforge.configuration`; every setting also keeps its flat name (`--lr=2e-5`, `lr = 2e-5` in a run file),
placed by `finetune_key`. Defaults are the paper's (3 epochs, batch 32, lr 5e-5, 10% warmup, linear decay,
max_seq_length 128; 384 with doc stride 128 for QA). The training loop keeps the best evaluation's model
(`BestCheckpoint`), also across a resume.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bertforge.checkpoint_format import read_directory, save_model
from bertforge.configuration import build, merge, parse_override, read_toml, set_dotted, shared_data_root
from bertforge.constants import FINETUNING_NAME
from bertforge.data.classification import ON_INVALID
from bertforge.data.conll import BIO_ERROR_POLICIES, LABEL_POLICIES, TAG_SCHEMES
from bertforge.data.finetuning import DataReport, Feature, FeatureBatches
from bertforge.errors import ConfigError, DataError
from bertforge.evaluation import EvalResult, Evaluation
from bertforge.families import registry
from bertforge.families.base import InputSettings, LossSettings
from bertforge.metrics.classification import CLASSIFICATION_METRICS as CLASSIFICATION_METRIC_NAMES
from bertforge.metrics.classification import MULTI_LABEL_METRICS
from bertforge.metrics.classification import REGRESSION_METRICS as REGRESSION_METRIC_NAMES
from bertforge.model.config import BertConfig
from bertforge.runtime import resolve_device, resolve_precision, set_seed
from bertforge.storage import write_json, write_jsonl
from bertforge.tokenization import Tokenizer
from bertforge.training import distributed
from bertforge.training.checkpoint import checkpoint_step, resolve_resume, stopped_early
from bertforge.training.config import TrainingConfig
from bertforge.training.loop import BestCheckpoint, train

log = logging.getLogger("bertforge.finetuning")

# --format value -> (task family, regression); "pair" is classification with a text_b column.
FORMATS = {"classification": ("classification", False), "pair": ("classification", False),
           "multilabel": ("classification", False),
           "regression": ("classification", True), "ner": ("tagging", False), "qa": ("question_answering", False),
           "choice": ("multiple_choice", False)}
REGRESSION_METRICS = ("pearson", "spearman")
# Metrics where a smaller value is better (the best checkpoint minimises them).
LOWER_IS_BETTER = frozenset({"mse", "invalid_span_share"})


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
    multi_label: bool = False


def _glue(name: str, folder: str, dev: str = "dev.tsv", **kwargs) -> TaskSpec:
    return TaskSpec(name, kwargs.pop("family", "classification"), (DataSource(f"glue/{folder}/train.tsv"),),
                    (DataSource(f"glue/{folder}/{dev}"),), **kwargs)


# MNLI's columns by header name: train.tsv has 12 (... sentence1 sentence2 label1 gold_label), dev_matched.tsv
# and dev_mismatched.tsv 16 (... label1 ... label5 gold_label); `gold_label` is the label in both.
_MNLI = {"text_a": "sentence1", "text_b": "sentence2", "label": "gold_label",
         "labels": ("contradiction", "entailment", "neutral"), "metrics": ("accuracy",)}


def _qa_split(name: str, path: str, extra_train: tuple[DataSource, ...] = (), **kwargs) -> TaskSpec:
    return TaskSpec(name, "question_answering", (DataSource(path, "train"), *extra_train), (DataSource(path, "eval"),),
                    metrics=("f1", "exact_match"), max_seq_length=384, **kwargs)


def _entity_tags(*types: str) -> tuple[str, ...]:
    """A NER task's complete BIO tag set, so a run on a few sentences still has every tag."""
    return ("O", *(f"{prefix}-{kind}" for prefix in "BI" for kind in types))


TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (
    _glue("sst2", "SST-2", text_a="sentence", label="label", labels=("0", "1"), metrics=("accuracy",)),
    _glue("cola", "CoLA", text_a=3, label=1, header=False, labels=("0", "1"), metrics=("mcc", "accuracy")),
    _glue("stsb", "STS-B", regression=True, text_a="sentence1", text_b="sentence2", label=-1, header=True,
          metrics=REGRESSION_METRICS),
    _glue("rte", "RTE", text_a="sentence1", text_b="sentence2", label="label",
          labels=("entailment", "not_entailment"), metrics=("accuracy",)),
    _glue("wnli", "WNLI", text_a="sentence1", text_b="sentence2", label="label", labels=("0", "1"),
          metrics=("accuracy",)),
    _glue("mrpc", "MRPC", text_a="#1 String", text_b="#2 String", label="Quality", labels=("0", "1"),
          metrics=("f1", "accuracy"), note="header `Quality #1 ID #2 ID #1 String #2 String`, UTF-8 BOM, CRLF"),
    _glue("qqp", "QQP", text_a="question1", text_b="question2", label="is_duplicate", labels=("0", "1"),
          metrics=("f1", "accuracy"),
          note="header `id qid1 qid2 question1 question2 is_duplicate`; the official train.tsv has a few rows "
               "with missing columns: pass --on-invalid skip (`bertforge glue` does, counted)"),
    _glue("mnli", "MNLI", dev="dev_matched.tsv", **_MNLI,
          note="evaluates on dev_matched.tsv (`mnli-mm`: dev_mismatched.tsv)"),
    _glue("mnli-mm", "MNLI", dev="dev_mismatched.tsv", **_MNLI,
          note="MNLI's training set, evaluated (and the best checkpoint picked) on dev_mismatched.tsv"),
    _glue("qnli", "QNLI", text_a="question", text_b="sentence", label="label",
          labels=("entailment", "not_entailment"), metrics=("accuracy",)),
    TaskSpec("conll2003", "tagging", (DataSource("conll2003/train.txt"),), (DataSource("conll2003/valid.txt"),),
             labels=_entity_tags("LOC", "MISC", "ORG", "PER"), metrics=("f1", "precision", "recall")),
    TaskSpec("msra_ner", "tagging", (DataSource("msra_ner/train.tsv", "train"),), (DataSource("msra_ner/train.tsv", "eval"),),
             (DataSource("msra_ner/test.tsv"),), separator="", language="zh", labels=_entity_tags("LOC", "ORG", "PER"),
             metrics=("f1", "precision", "recall"),
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
#
# A run file nests its settings in tables, as pretraining's does; every setting also keeps the flat name it
# had before the tables (`lr`, `max_seq_length`, `text_a_column`), which `finetune_key` places:
#
#     model = "runs/pretrain/checkpoint-010000"
#     metric = "accuracy"
#     [data]
#     task = "sst2"
#     [features]
#     max_seq_length = 128
#     [head]
#     freeze_encoder = false
#     [training]                 # TrainingConfig, with fine-tuning's defaults
#     lr = 2e-5


def _checker(table: str, config: Any):
    def need(cond: bool, name: str, fix: str) -> None:
        if not cond:
            raise ConfigError(f"finetune.{table}.{name}={getattr(config, name)!r} is invalid: {fix}")
    return need


@dataclass
class DataConfig:
    """`[data]`: what to read and how.

    Attributes:
        task: a name in TASKS (knows its files under the data root, columns, labels, metrics), or None with
            `format`.
        format: classification, pair, regression, ner, qa or choice: read `train`/`dev` with these columns.
        train, dev: files (with `task`: replace the named task's). A run needs a dev set to pick its best
            model; `dev = ""` (`--no-dev`) trains without evaluation, and best/ is then the final model.
        data_root: where named tasks' files live (default $BERTFORGE_DATA, else ../shared/data).
        text_a_column, text_b_column, label_column: header name or 0-based index (generic formats).
        header: whether the table has a header row (None: detect). file_format: tsv, csv or jsonl (None:
            from the extension).
        token_column, tag_column: CoNLL files' word and tag columns (0-based; -1 = the last).
        separator: what joins a CoNLL sentence's words: " ", or "" for one character per line ("space" and
            "none" are accepted).
        context_column, start_column, ending_columns: SWAG-style choice files.
        labels: the label order (default: the named task's, else the sorted training labels).
        multi_label: each row has any number of labels (a JSON list in JSONL, else `label_separator`-separated;
            `--format multilabel` sets it); the head gets one sigmoid per label.
        label_separator: what separates the labels of a multi-label cell ("PER,LOC").
        id_column: the column holding each row's id, which evaluate's predictions carry (None: a header column
            named index, id, idx, qid or guid when there is one, else the row's file:line).
        on_invalid: "error" or "skip" malformed rows. bio_errors: "warn" or "error" on broken BIO tags.
        train_limit, dev_limit: use only the first N examples.
    """

    task: str | None = None
    format: str | None = None
    train: str | None = None
    dev: str | None = None
    data_root: str | None = None
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
    multi_label: bool = False
    label_separator: str = ","
    id_column: str | None = None
    on_invalid: str = "error"
    bio_errors: str = "warn"
    train_limit: int | None = None
    dev_limit: int | None = None

    def __post_init__(self) -> None:
        need = _checker("data", self)
        need(self.task is None or self.task in TASKS, "task",
             f"unknown task; choose one of {sorted(TASKS)} or give --format with --train/--dev files")
        need(self.format is None or self.format in FORMATS, "format", f"use one of {sorted(FORMATS)}")
        need(self.on_invalid in ON_INVALID, "on_invalid", f"use one of {ON_INVALID}")
        need(self.bio_errors in BIO_ERROR_POLICIES, "bio_errors", f"use one of {BIO_ERROR_POLICIES}")
        need(self.train_limit is None or self.train_limit > 0, "train_limit", "use a positive count or leave unset")
        need(self.dev_limit is None or self.dev_limit > 0, "dev_limit", "use a positive count or leave unset")
        need(bool(self.label_separator), "label_separator", 'give the character between labels, e.g. "," or "|"')
        if self.format == "multilabel":
            self.multi_label = True
        if self.separator in ("space", "none"):
            self.separator = " " if self.separator == "space" else ""


@dataclass
class FeatureConfig:
    """`[features]`: how examples become model inputs (what `finetuning.json` records for evaluate/predict).

    Attributes:
        max_seq_length: tokens per window (None: 128, QA 384, at most the model's positions).
        doc_stride: step between window starts of a long input (None: QA 128, others half a window).
        max_query_length: QA question tokens. max_answer_length: longest QA answer in tokens.
        n_best_size: QA candidate spans kept. version_2_with_negative: unanswerable questions (None: on
            when the data has them). null_score_diff_threshold: QA no-answer margin.
        label_policy: "first" or "all" sub-tokens of a word labelled. tag_scheme: "BIO" or "IOBES" labels
            for the model. language: "en", "zh" (scoring; None: the task's).
    """

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

    def __post_init__(self) -> None:
        need = _checker("features", self)
        need(self.max_seq_length is None or self.max_seq_length >= 8, "max_seq_length", "use at least 8 tokens")
        need(self.doc_stride is None or self.doc_stride > 0, "doc_stride", "use a positive number of tokens")
        for name in ("max_query_length", "max_answer_length", "n_best_size"):
            need(getattr(self, name) > 0, name, "use a positive integer")
        need(self.label_policy in LABEL_POLICIES, "label_policy", f"use one of {LABEL_POLICIES}")
        need(self.tag_scheme in TAG_SCHEMES, "tag_scheme", f"use one of {TAG_SCHEMES}")


@dataclass
class HeadConfig:
    """`[head]`: the task head and how much of the model trains.

    Attributes:
        freeze_encoder: feature-based (the paper's section 5.3): train the head only.
        feature_layers: layers concatenated as features, e.g. [-1, -2, -3, -4] (None: the last).
        classifier_hidden_sizes: hidden widths of the head (None: one linear layer).
        classifier_dropout: dropout before the head (None: the model's hidden dropout).
        fresh_head: discard a head stored in the model directory.
        class_weights: single-label classification and tagging: one loss weight per label, in label order
            (e.g. [1.0, 5.0] to count the rare second class five times).
        balanced_class_weights: compute the class weights from the training counts, N / (labels x count).
        focal_gamma: focal loss for single-label classification and tagging (2 is the paper's); 0 = plain
            cross-entropy.
        crf: tagging: a linear-chain CRF over the tag scores with BIO/IOBES transitions enforced (Viterbi
            decoding everywhere the model is used).
        thresholds: multi-label decision thresholds tuned on dev and stored with the model: "global" (one
            for all labels), "per_label", or "none" (0.5).
    """

    freeze_encoder: bool = False
    feature_layers: list[int] | None = None
    classifier_hidden_sizes: list[int] | None = None
    classifier_dropout: float | None = None
    fresh_head: bool = False
    class_weights: list[float] | None = None
    balanced_class_weights: bool = False
    focal_gamma: float = 0.0
    crf: bool = False
    thresholds: str = "global"

    def __post_init__(self) -> None:
        need = _checker("head", self)
        need(self.feature_layers is None or len(self.feature_layers) > 0, "feature_layers",
             "give at least one layer, e.g. [-1, -2, -3, -4], or leave unset")
        need(self.classifier_hidden_sizes is None or all(w > 0 for w in self.classifier_hidden_sizes),
             "classifier_hidden_sizes", "use positive widths, e.g. [128]")
        need(self.classifier_dropout is None or 0.0 <= self.classifier_dropout < 1.0, "classifier_dropout",
             "use a probability in [0, 1)")
        need(self.class_weights is None or (len(self.class_weights) > 0 and all(
            math.isfinite(w) and w >= 0 for w in self.class_weights)), "class_weights",
             "give one non-negative weight per label, in label order, e.g. [1.0, 5.0]")
        need(not (self.balanced_class_weights and self.class_weights is not None), "balanced_class_weights",
             "give class_weights or balanced_class_weights, not both")
        need(math.isfinite(self.focal_gamma) and self.focal_gamma >= 0, "focal_gamma", "use a number >= 0, e.g. 2")
        need(self.thresholds in THRESHOLD_MODES, "thresholds", f"use one of {THRESHOLD_MODES}")

    def loss_settings(self, family, examples: Sequence, label_names: Sequence[str] | None,
                      settings: InputSettings) -> LossSettings:
        """The training loss's class weights and focal factor; "balanced" weights from `examples`' counts."""
        weights = self.class_weights
        if self.balanced_class_weights:
            if label_names is None:
                raise ConfigError("finetune.head.balanced_class_weights needs named labels; this task has none "
                                  "(regression or question answering): remove it")
            counts = family.label_counts(examples, label_names, settings)
            missing = [name for name, n in zip(label_names, counts) if n == 0]
            if missing:
                raise ConfigError(f"finetune.head.balanced_class_weights: labels {missing} have no training "
                                  "examples, so their weight is undefined; give head.class_weights explicitly")
            total = sum(counts)
            weights = [total / (len(counts) * n) for n in counts]
            log.info("balanced class weights from %d training labels: %s", total,
                     ", ".join(f"{name} {w:.3g}" for name, w in zip(label_names, weights)))
        try:
            return LossSettings(tuple(weights) if weights is not None else None, self.focal_gamma)
        except ConfigError as exc:
            raise ConfigError(f"finetune.head.{exc}") from None


THRESHOLD_MODES = ("global", "per_label", "none")


@dataclass
class FinetuneTrainingConfig(TrainingConfig):
    """`[training]`: the loop's `TrainingConfig` with the BERT paper's fine-tuning defaults (3 epochs, batch 32,
    lr 5e-5, 10% warmup, linear decay, weight decay 0.01), checkpoints in runs/finetune and no TensorBoard.
    `eval_every` = 0 evaluates every epoch (the dev set picks the best model). Resumable checkpoints are
    written at every epoch end and every `save_every` steps (0: epoch ends only), the last `keep_last` (2)
    kept, so `--resume auto` continues a run that was killed.

    A subclass rather than a `TrainingConfig(...)` default, so that a run file's partial `[training]` table
    (e.g. only `lr`) keeps these defaults for the keys it does not set.

    Attributes:
        eval_every: steps between dev evaluations; 0 = every epoch (and at the end).
        save_every: steps between resumable checkpoints; 0 = every epoch (epoch ends are always saved).
        keep_last: resumable checkpoints kept (older ones are deleted; best/ is separate); 0 keeps all.
    """

    epochs: float = 3.0
    batch_size: int = 32
    lr: float = 5e-5
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    keep_last: int = 2
    out_dir: str = "runs/finetune"
    tensorboard: bool = False

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ConfigError as exc:
            raise ConfigError(f"finetune.{exc}") from None


@dataclass
class FinetuneConfig:
    """One fine-tuning run (`bertforge finetune`): top-level keys and the tables `[data]` (`DataConfig`),
    `[features]` (`FeatureConfig`), `[head]` (`HeadConfig`) and `[training]` (`FinetuneTrainingConfig`).

    Attributes:
        model: the model directory to start from (ours or a Hugging Face BERT).
        seeds: several runs, one per seed, reported as mean ± std (None: one run with training.seed).
        metric: picks the best checkpoint (default: the task's first metric).
        evaluate_test: score the best model on a named task's test split too.
        fast_path: skip padding tokens and fuse the QKV projection, in training and evaluation (tested equal
            to the plain path).
        eval_batch_size: examples per evaluation batch.
    """

    model: str = ""
    seeds: list[int] | None = None
    metric: str | None = None
    evaluate_test: bool = True
    fast_path: bool = True
    eval_batch_size: int = 64
    data: DataConfig = field(default_factory=DataConfig)
    features: FeatureConfig = field(default_factory=FeatureConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    training: FinetuneTrainingConfig = field(default_factory=FinetuneTrainingConfig)

    def __post_init__(self) -> None:
        def need(cond: bool, name: str, fix: str) -> None:
            if not cond:
                raise ConfigError(f"finetune.{name}={getattr(self, name)!r} is invalid: {fix}")

        need(self.seeds is None or len(self.seeds) > 0, "seeds", "give at least one seed, e.g. [1, 2, 3]")
        need(self.eval_batch_size > 0, "eval_batch_size", "use a positive integer")
        for name, cls in TABLES.items():
            expected = TrainingConfig if cls is FinetuneTrainingConfig else cls
            need(isinstance(getattr(self, name), expected), name, f"give a {cls.__name__} (the [{name}] table)")


TABLES: dict[str, type] = {"data": DataConfig, "features": FeatureConfig, "head": HeadConfig,
                           "training": FinetuneTrainingConfig}
TOP_LEVEL_KEYS = tuple(f.name for f in dataclasses.fields(FinetuneConfig) if f.name not in TABLES)
# Each table's key under its flat name, as FinetuneConfig had them before the tables ("lr" -> "training.lr").
FLAT_KEYS: dict[str, str] = {f.name: f"{table}.{f.name}" for table, cls in TABLES.items()
                             for f in dataclasses.fields(cls)}


def finetune_key(name: str) -> str:
    """Where a setting lives: a flat key (`lr`, `max_seq_length`, `text_a_column`: the names of the config
    before it had tables) -> its dotted place (`training.lr`, `features.max_seq_length`,
    `data.text_a_column`); a top-level key (`model`), a table name or a dotted key comes back unchanged.

    Raises:
        ConfigError: a flat key that is none of these, with the closest valid key and the valid ones.
    """
    if "." in name or name in TOP_LEVEL_KEYS or name in TABLES:
        return name
    if name in FLAT_KEYS:
        return FLAT_KEYS[name]
    close = difflib.get_close_matches(name, [*TOP_LEVEL_KEYS, *FLAT_KEYS], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    tables = "; ".join(f"[{table}] {', '.join(f.name for f in dataclasses.fields(cls))}"
                       for table, cls in TABLES.items())
    raise ConfigError(f"finetune: unknown key {name!r}{hint}; use a top-level key ({', '.join(TOP_LEVEL_KEYS)}), "
                      f"a table's key by its name (lr) or dotted (training.lr): {tables}")


def nest_flat_keys(values: Mapping[str, Any]) -> dict[str, Any]:
    """A settings tree with its flat keys moved into their tables (`finetune_key`):
    {"lr": 2e-5, "training": {"steps": 3}} -> {"training": {"steps": 3, "lr": 2e-5}}.

    Raises:
        ConfigError: an unknown key, or one setting given twice (flat and in its table).
    """
    tree: dict[str, Any] = {}
    placed: dict[str, str] = {}

    def place(dotted: str, spelled: str, value: Any) -> None:
        if dotted in placed:
            raise ConfigError(f"finetune: {dotted} is set twice (as {placed[dotted]!r} and {spelled!r}); keep one")
        placed[dotted] = spelled
        set_dotted(tree, dotted, value)

    for key, value in values.items():
        dotted = finetune_key(key)
        if dotted in TABLES and isinstance(value, Mapping):
            for inner, item in value.items():
                place(f"{dotted}.{inner}", f"{dotted}.{inner}", item)
        else:
            place(dotted, key, value)
    return tree


def load_finetune_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = (),
                         values: Mapping[str, Any] | None = None) -> FinetuneConfig:
    """`configuration.load_config(FinetuneConfig, ...)` that also takes the flat keys (`finetune_key`) in the
    run file, in `values` and in the `key=value` overrides (`--lr=2e-5` as well as `--training.lr=2e-5`).

    Raises:
        ConfigError: unreadable file, unknown key, value of the wrong kind, or a table's own validation.
    """
    source = os.fspath(path) if path is not None else "defaults"
    try:
        tree = nest_flat_keys(read_toml(path)) if path is not None else {}
        if values:
            merge(tree, nest_flat_keys(values))
        for text in overrides:
            dotted, value = parse_override(text)
            set_dotted(tree, finetune_key(dotted), value)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}" if path is not None and not str(exc).startswith(source)
                          else str(exc)) from None
    return build(FinetuneConfig, tree, source=source, prefix="")


# --- resolving a run's task -------------------------------------------------------------------------------

def data_root(config: FinetuneConfig) -> Path:
    return Path(config.data.data_root) if config.data.data_root else shared_data_root()


def resolve_task(config: FinetuneConfig) -> TaskSpec:
    """The task a run trains: the named task with the config's column overrides, or one built from `format`.

    Raises:
        ConfigError: neither (or both inconsistently) given, or a generic format without its files.
    """
    data = config.data
    if data.task is not None:
        spec = TASKS[data.task]
        root = data_root(config)

        def rooted(sources: tuple[DataSource, ...]) -> tuple[DataSource, ...]:
            return tuple(DataSource(os.fspath(root / s.path), s.part) for s in sources)

        changes: dict[str, Any] = {"train": rooted(spec.train), "dev": rooted(spec.dev), "test": rooted(spec.test)}
        if data.train:
            changes["train"] = (DataSource(data.train),)
        if data.dev:
            changes["dev"] = (DataSource(data.dev),)
        if data.multi_label:
            changes.update(multi_label=True, metrics=MULTI_LABEL_METRICS)
        return dataclasses.replace(spec, **changes)
    if data.format is None:
        raise ConfigError(f"say what to train: --task NAME (one of {sorted(TASKS)}) or --format "
                          f"{'|'.join(FORMATS)} with --train FILE [--dev FILE]")
    if not data.train and not data.dev:
        raise ConfigError(f"--format {data.format} needs --train FILE (and --dev FILE to evaluate)")
    family_name, regression = FORMATS[data.format]
    family = registry.family(family_name)
    pair = data.format == "pair" or data.text_b_column is not None
    return TaskSpec(
        name=data.format, family=family.name,
        train=(DataSource(data.train),) if data.train else (),
        dev=(DataSource(data.dev),) if data.dev else (),
        text_a="text_a", text_b="text_b" if pair else None, label="label",
        metrics=REGRESSION_METRICS if regression else MULTI_LABEL_METRICS if data.multi_label else family.default_metrics,
        max_seq_length=family.default_max_seq_length, language=family.default_language,
        regression=regression, multi_label=data.multi_label)


def _column(value: str | None, default):
    return default if value is None else value


def reader_options(spec: TaskSpec, config: FinetuneConfig) -> dict[str, Any]:
    """The settings every family's reader may need: the config's `[data]`, falling back to the named task's."""
    data = config.data
    return {"text_a": _column(data.text_a_column, spec.text_a), "text_b": _column(data.text_b_column, spec.text_b),
            "label": _column(data.label_column, spec.label),
            "header": data.header if data.header is not None else spec.header, "regression": spec.regression,
            "file_format": data.file_format, "on_invalid": data.on_invalid, "token_column": data.token_column,
            "tag_column": data.tag_column, "separator": data.separator if data.separator is not None
            else spec.separator, "bio_errors": data.bio_errors, "context_column": data.context_column,
            "start_column": data.start_column, "ending_columns": data.ending_columns,
            "multi_label": spec.multi_label, "label_separator": data.label_separator, "id_column": data.id_column}


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
    features = config.features
    return InputSettings(max_seq_length=max_seq_length, doc_stride=features.doc_stride,
                         max_query_length=features.max_query_length, tag_scheme=features.tag_scheme,
                         label_policy=features.label_policy)


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
    smaller; an explicit `config.features.max_seq_length` is kept as given. `model_config` is the model directory's
    config (default: read from `config.model`); the run's head (label names, problem type) is applied to it.

    Raises:
        DataError: unreadable or malformed files, a dev label unseen in training.
        ConfigError: an unusable combination of options.
    """
    spec = spec or resolve_task(config)
    report, train_report, dev_report = DataReport(), DataReport(), DataReport()
    train_examples = read_examples(spec, spec.train, config, train_report)
    dev_examples = read_examples(spec, spec.dev, config, dev_report)
    limits = config.data
    if limits.train_limit is not None and len(train_examples) > limits.train_limit:
        train_report.note("limited_from", amount=len(train_examples))
        train_examples = train_examples[:limits.train_limit]
    if limits.dev_limit is not None and len(dev_examples) > limits.dev_limit:
        dev_report.note("limited_from", amount=len(dev_examples))
        dev_examples = dev_examples[:limits.dev_limit]
    if spec.train and not train_examples:
        raise DataError("no usable training examples", spec.train[0].path)

    family = registry.family(spec.family)
    model_config = model_config or read_directory(config.model).config
    max_positions = model_config.max_position_embeddings
    max_seq_length = config.features.max_seq_length or min(spec.max_seq_length, max_positions)
    settings = input_settings(config, max_seq_length)
    label_names = family.label_names(train_examples, config.data.labels or spec.labels, settings, spec.regression)
    if label_names is not None:
        family.check_labels(train_examples, label_names, settings)
        family.check_labels(dev_examples, label_names, settings)
    head = model_config.replace(**family.head_config(label_names, spec.regression, multi_label=spec.multi_label))
    train_features = family.features(train_examples, tokenizer, settings, config=head, report=train_report,
                                     training=True)
    dev_features = family.features(dev_examples, tokenizer, settings, config=head, report=dev_report)
    version_2 = config.features.version_2_with_negative
    if version_2 is None:
        version_2 = any(getattr(e, "is_impossible", False) for e in [*train_examples, *dev_examples])
    train_report.log_warnings(f"{spec.name} train")
    dev_report.log_warnings(f"{spec.name} dev")
    report.merge(train_report, "train.").merge(dev_report, "dev.")
    return PreparedData(spec, tokenizer, label_names, max_seq_length, train_examples, train_features, dev_examples,
                        dev_features, report, version_2, settings)


def make_evaluation(spec: TaskSpec, examples: Sequence, features: Sequence[Feature], config: FinetuneConfig,
                    model_config, tokenizer: Tokenizer, version_2_with_negative: bool,
                    metric: str | None = None, calibrate: str | None = None) -> Evaluation:
    """The one evaluation path for these examples, with the run's decoding options and scoring choices.

    `metric` (the one that picks the best model) is asked for too where the family computes metrics by name
    and it is not among those it reports anyway (classification's `macro_recall`, regression's `mse`).
    `calibrate` tunes the family's decision settings on these examples (the run's dev set: multi-label
    thresholds, `head.thresholds`)."""
    family = registry.family(spec.family)
    # run_options reads flat setting names (n_best_size, max_answer_length, ...): the [features] table's.
    options = family.run_options({**dataclasses.asdict(config.features),
                                  "version_2_with_negative": version_2_with_negative})
    names = list(spec.metrics) if spec.regression or spec.metrics != ("accuracy",) else None
    if metric is not None and spec.family == "classification" and not spec.multi_label:
        if names is None:  # compute_classification_metrics' defaults, binary or not
            binary = len(getattr(model_config, "label_names", None) or []) == 2
            names = ["accuracy", "f1", "precision", "recall", "mcc"] if binary else ["accuracy", "macro_f1", "mcc"]
            if metric in names:
                names = None
        if names is not None and metric not in names:
            names.append(metric)
    scoring = {"metric_names": names,
               "language": config.features.language or spec.language, "version_2": bool(version_2_with_negative)}
    return Evaluation(family, examples, features, config=model_config, batch_size=config.eval_batch_size,
                      pad_token_id=tokenizer.pad_token_id, options=options, scoring=scoring, tokenizer=tokenizer,
                      calibrate=calibrate)


def load_task_model(config: FinetuneConfig, spec: TaskSpec, label_names: list[str] | None, max_seq_length: int):
    """The model directory loaded into the family's class, its head fresh where the checkpoint has none."""
    if not config.model:
        raise ConfigError("finetune.model is empty: pass --model DIR, a BERT model directory (config.json, weights, "
                          "vocab.txt)")
    family = registry.family(spec.family)
    head = config.head
    overrides: dict[str, Any] = {"freeze_encoder": head.freeze_encoder, "feature_layers": head.feature_layers}
    if head.classifier_hidden_sizes is not None:
        overrides["classifier_hidden_sizes"] = list(head.classifier_hidden_sizes)
    if head.classifier_dropout is not None:
        overrides["classifier_dropout"] = head.classifier_dropout
    overrides.update(family.head_config(label_names, spec.regression, multi_label=spec.multi_label))
    if head.crf:
        overrides["use_crf"] = True
    model, _ = registry.load_model(config.model, family.model_class, config_overrides=overrides,
                                   fresh_head=head.fresh_head, fast_path=config.fast_path)
    if max_seq_length > model.config.max_position_embeddings:
        raise ConfigError(f"max_seq_length={max_seq_length} exceeds the model's max_position_embeddings="
                          f"{model.config.max_position_embeddings}; lower it (long inputs are windowed anyway)")
    return model


def finetuning_record(spec: TaskSpec, config: FinetuneConfig, prepared_max_len: int, label_names, version_2: bool,
                      metric: str) -> dict[str, Any]:
    """What `finetuning.json` stores: how inputs were built, so `evaluate`, `predict` and the server rebuild
    them the same way (`InputSettings.from_record` reads the input settings back).

    The record is flat: the `[data]` and `[features]` settings under their flat names (`finetune_key` places
    them back; `evaluate` reads records written before the tables the same way), the input settings
    (max_seq_length, doc_stride, max_query_length, tag_scheme, label_policy) at the top level where the
    pipelines read them, plus the family, labels and metrics."""
    data, features = config.data, config.features
    return {
        "task": data.task, "format": data.format, "family": spec.family, "regression": spec.regression,
        "text_a_column": _column(data.text_a_column, spec.text_a),
        "text_b_column": _column(data.text_b_column, spec.text_b),
        "label_column": _column(data.label_column, spec.label),
        "header": data.header if data.header is not None else spec.header,
        "file_format": data.file_format, "token_column": data.token_column, "tag_column": data.tag_column,
        "separator": data.separator if data.separator is not None else spec.separator,
        "context_column": data.context_column, "start_column": data.start_column,
        "ending_columns": data.ending_columns, "labels": label_names, "max_seq_length": prepared_max_len,
        "multi_label": spec.multi_label, "label_separator": data.label_separator,
        "doc_stride": features.doc_stride, "max_query_length": features.max_query_length,
        "max_answer_length": features.max_answer_length, "n_best_size": features.n_best_size,
        "version_2_with_negative": version_2, "null_score_diff_threshold": features.null_score_diff_threshold,
        "label_policy": features.label_policy, "tag_scheme": features.tag_scheme,
        "language": features.language or spec.language, "metrics": list(spec.metrics), "metric": metric,
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
        total_steps: the run's length in optimizer steps.
        resumed: what `training.resume` did, in words ("" for resume=never): the checkpoint and step it
            continued from, that it started fresh and why, or that the run was already complete.
        stopped_early: the run ended before total_steps because the dev metric stopped improving
            (`training.patience`).
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
    total_steps: int = 0
    resumed: str = ""
    stopped_early: bool = False


class EvaluationLog:
    """The run's evaluations and their warnings; the loop carries it in every checkpoint (`extra_state`), so
    a resumed run reports the evaluations made before the interruption too."""

    def __init__(self) -> None:
        self.history: list[dict[str, Any]] = []
        self.warnings: list[str] = []

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history, "warnings": self.warnings}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.history[:] = list(state.get("history", []))
        self.warnings[:] = list(state.get("warnings", []))


def metric_names(spec: TaskSpec, version_2: bool = False, dev_examples: Sequence = ()) -> tuple[str, ...]:
    """The metric names an evaluation of `spec` can report, i.e. what `metric` (`--metric`) may choose.

    Classification computes any name of `metrics.classification` when asked (the run asks for the chosen
    one, see `make_evaluation`); tagging reports entity f1/precision/recall; question answering exact_match
    and f1, with SQuAD v2.0 also HasAns_/NoAns_ for the groups the dev set has; multiple choice accuracy.
    """
    if spec.family in METRIC_NAMES:
        names = METRIC_NAMES[spec.family](spec)
    else:
        names = tuple(registry.family(spec.family).default_metrics)
    if version_2 and spec.family == "question_answering":
        groups = {bool(getattr(e, "is_impossible", False)) for e in dev_examples} or {False, True}
        names += tuple(f"{group}_{kind}" for group, flag in (("HasAns", False), ("NoAns", True)) if flag in groups
                       for kind in ("exact", "f1"))
    return names


# Per family (registry name): the names its evaluation can report (`metric_names`).
METRIC_NAMES = {
    "classification": lambda spec: (REGRESSION_METRIC_NAMES if spec.regression else MULTI_LABEL_METRICS
                                    if spec.multi_label else CLASSIFICATION_METRIC_NAMES),
    "tagging": lambda spec: ("f1", "precision", "recall", "invalid_span_share"),
    "question_answering": lambda spec: ("exact_match", "f1"),
    "multiple_choice": lambda spec: ("accuracy",),
}


def check_metric(spec: TaskSpec, metric: str, version_2: bool, dev_examples: Sequence) -> None:
    """Refuse, before any training, a `metric` the run's evaluations will not report."""
    valid = metric_names(spec, version_2, dev_examples)
    if metric not in valid:
        close = difflib.get_close_matches(metric, valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"finetune.metric={metric!r} is invalid{hint}: {spec.name} ({spec.family}"
                          f"{', regression' if spec.regression else ''}) evaluations report {list(valid)}; "
                          "choose one of those (--metric NAME)")


def run_finetuning(config: FinetuneConfig) -> FinetuneResult | SeedsResult:
    """Fine-tune `config.model` on the task and keep the best checkpoint (see the module docstring).

    With `config.seeds`, runs once per seed (`run_seeds`) and returns the `SeedsResult`.

    Raises:
        ConfigError: bad options. DataError: bad data. CheckpointError: unusable model directory.
    """
    if config.seeds:
        return run_seeds(config)
    started = time.perf_counter()
    settings = config.training
    out_dir = Path(settings.out_dir)
    spec = resolve_task(config)
    if not config.model:
        raise ConfigError("finetune.model is empty: pass --model DIR, a BERT model directory (config.json, "
                          "weights, vocab.txt)")
    # Everything that can be checked before training is checked here, so no option fails after an epoch.
    spec = check_dev_set(spec, config)
    if not spec.dev and config.training.patience:
        raise ConfigError(f"finetune.training.patience={config.training.patience} needs evaluations, and this run has "
                          "no dev set (--no-dev): give --dev FILE, or set --patience 0")
    metric = config.metric or spec.metrics[0]
    if spec.dev:
        check_metric(spec, metric, True, ())  # the names any dev set of this task could give
    if config.evaluate_test:
        missing = [s.path for s in spec.test if not Path(s.path).is_file()]
        if missing:
            raise DataError("test file not found; check the data root, or pass --evaluate-test false", missing[0])
    directory = read_directory(config.model)
    tokenizer = directory.require_tokenizer()
    prepared = prepare_data(config, tokenizer, spec, directory.config)
    if spec.dev and not prepared.dev_examples:
        raise DataError("no usable dev examples: the best model could not be chosen; fix the file, or pass "
                        "--no-dev (data.dev = \"\") to train without evaluation", spec.dev[0].path)
    if spec.dev:
        check_metric(spec, metric, prepared.version_2_with_negative, prepared.dev_examples)
    log.info("%s: %d train examples -> %d features, %d dev examples -> %d features; %s", spec.name,
             len(prepared.train_examples), len(prepared.train_features), len(prepared.dev_examples),
             len(prepared.dev_features), "; ".join(prepared.report.lines()))
    batches = FeatureBatches(prepared.train_features, settings.batch_size, tokenizer.pad_token_id, shuffle=True,
                             seed=settings.seed, rank=distributed.env_int("RANK", 0),
                             world_size=distributed.env_int("WORLD_SIZE", 1))
    steps_per_epoch = max(1, math.ceil(len(batches) / settings.grad_accumulation))
    # Fine-tuning evaluates and checkpoints every epoch unless told otherwise; epoch ends are always saved.
    training = dataclasses.replace(settings, eval_every=settings.eval_every or steps_per_epoch,
                                   save_every=settings.save_every or steps_per_epoch)
    total_steps = training.total_steps(len(batches))
    finished = finished_run(config, total_steps)
    if finished is not None:
        return finished
    set_seed(settings.seed)  # the fresh head's initialisation depends on the seed, as the paper's restarts do
    model = load_task_model(config, spec, prepared.label_names, prepared.max_seq_length)
    record = finetuning_record(spec, config, prepared.max_seq_length, prepared.label_names,
                               prepared.version_2_with_negative, metric)
    best_dir = out_dir / "best"
    extra = {FINETUNING_NAME: json.dumps(record, indent=2, ensure_ascii=False) + "\n"}
    evaluations = EvaluationLog()
    history, warnings = evaluations.history, evaluations.warnings
    # Prediction records of the latest evaluation and of the best one (the loop says which is best).
    records: dict[int, list[dict[str, Any]]] = {}

    evaluator = None
    if prepared.dev_examples:
        evaluator = make_evaluation(spec, prepared.dev_examples, prepared.dev_features, config, model.config,
                                    tokenizer, prepared.version_2_with_negative, metric=metric,
                                    calibrate=None if config.head.thresholds == "none" else config.head.thresholds)

    def eval_fn(current: torch.nn.Module, step: int) -> dict[str, float]:
        result = evaluator(current)
        if result.calibration:
            # Tuned on this evaluation (multi-label thresholds): the model saved as best, if it is, keeps them.
            current.config = current.config.replace(**result.calibration)
            log.info("%s eval at step %d: tuned %s", spec.name, step,
                     ", ".join(f"{k} {v}" for k, v in result.calibration.items()))
        history.append({"step": step, "epoch": round(step / steps_per_epoch, 4), "metrics": result.metrics})
        for warning in result.warnings:
            log.warning("%s eval at step %d: %s", spec.name, step, warning)
            warnings.append(f"step {step}: {warning}")
        records[step] = result.predictions
        return result.metrics

    def on_best(step: int, values: dict[str, float]) -> None:
        for earlier in [s for s in records if s != step]:
            del records[earlier]

    keep = BestCheckpoint(metric, metric in LOWER_IS_BETTER, best_dir, extra, on_best)
    family = registry.family(spec.family)
    loss = config.head.loss_settings(family, prepared.train_examples, prepared.label_names, prepared.settings)
    try:
        objective = family.objective_for(model.config, loss)
    except ConfigError as exc:
        raise ConfigError(f"finetune: {exc}") from None
    outcome = train(model, batches, objective, training, eval_fn=eval_fn if evaluator else None,
                    tokenizer=tokenizer, best=keep if evaluator else None,
                    save_also=lambda step: step % steps_per_epoch == 0, extra_state=evaluations)
    if evaluator is None and distributed.is_main():
        save_model(model, best_dir, tokenizer=tokenizer, extra_files=extra)
    best_metrics, best_step = dict(outcome.best_eval), outcome.best_step
    predictions = records.get(best_step) if best_step is not None else None
    if evaluator is not None and best_step is not None and predictions is None and best_dir.is_dir():
        # The best evaluation happened before a resume: score the saved best model again for its records.
        best_model, _ = registry.load_model(best_dir, registry.family(spec.family).model_class,
                                            device=resolve_device(settings.device), fast_path=config.fast_path)
        predictions = evaluator(best_model).predictions
    test_metrics: dict[str, float] = {}
    if spec.test and config.evaluate_test and evaluator is not None:
        test_metrics = evaluate_split(spec, spec.test, config, prepared, best_dir)
    result = FinetuneResult(spec.name, metric, best_metrics, best_step or outcome.step, history, best_dir,
                            out_dir, prepared.report.to_dict(), warnings, time.perf_counter() - started,
                            settings.seed, len(prepared.train_examples), len(prepared.dev_examples), test_metrics,
                            total_steps, resume_note(settings.resume, out_dir, outcome),
                            bool(outcome.stopped_early))
    if distributed.is_main():
        summary = {"task": spec.name, "metric": metric, "best_metrics": result.best_metrics,
                   "best_step": result.best_step, "total_steps": total_steps, "history": history,
                   "stopped_early": result.stopped_early,
                   "test_metrics": test_metrics, "data_report": result.data_report, "warnings": warnings,
                   "seed": settings.seed, "seconds": result.seconds, "train_examples": result.train_examples,
                   "dev_examples": result.dev_examples, "config": dataclasses.asdict(config)}
        write_json(out_dir / "eval_results.json", summary)
        if predictions is not None:
            write_jsonl(out_dir / "dev_predictions.jsonl", predictions)
    if metric in result.best_metrics:
        log.info("%s: best %s %.4f at step %d of %d (%s)", spec.name, metric, result.best_metrics[metric],
                 result.best_step, total_steps, best_dir)
    else:
        log.info("%s: trained %d steps without evaluation; final model saved to %s", spec.name, total_steps,
                 best_dir)
    return result


def check_dev_set(spec: TaskSpec, config: FinetuneConfig) -> TaskSpec:
    """The run's task with its dev set settled: `data.dev = ""` (`--no-dev`) trains without one, on purpose;
    no dev file otherwise is an error (the best model could not be chosen)."""
    if config.data.dev == "":
        log.info("%s: data.dev is empty (--no-dev): training without evaluation; best/ will hold the final model",
                 spec.name)
        return dataclasses.replace(spec, dev=())
    if not spec.dev:
        raise ConfigError(f"{spec.name}: no dev file to evaluate on, so no best model could be chosen; pass --dev "
                          "FILE (data.dev), or --no-dev (data.dev = \"\") to train without evaluation and keep the "
                          "final model")
    return spec


def resume_note(resume: str, out_dir: Path, outcome) -> str:
    """What `training.resume` did, in words (the loop's TrainResult says where it started)."""
    if outcome.resumed_from is not None:
        return f"resumed from {outcome.resumed_from} (step {outcome.start_step} of {outcome.total_steps})"
    if resume == "auto":
        return f"resume auto: no checkpoint in {out_dir}, started a fresh run"
    return ""


def finished_run(config: FinetuneConfig, total_steps: int) -> FinetuneResult | None:
    """With `training.resume` auto (or a checkpoint) on a run that already reached `total_steps` and wrote its
    eval_results.json: that run's result, read back; nothing is trained, evaluated or rewritten. None otherwise
    (a run to start or continue)."""
    settings = config.training
    out_dir = Path(settings.out_dir)
    results = out_dir / "eval_results.json"
    if settings.resume == "never" or not results.is_file():
        return None
    checkpoint = resolve_resume(settings.resume, out_dir)
    if checkpoint is None or (checkpoint_step(checkpoint) < total_steps and not stopped_early(checkpoint)):
        return None
    try:
        stored = json.loads(results.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("total_steps") != total_steps:
        return None
    step = checkpoint_step(checkpoint)
    note = (f"already complete: {checkpoint} is step {step} of {total_steps}; nothing trained, the results in "
            f"{results} are kept")
    log.info("%s", note)
    return FinetuneResult(stored.get("task", ""), stored.get("metric", ""), dict(stored.get("best_metrics") or {}),
                          int(stored.get("best_step") or step), list(stored.get("history") or []), out_dir / "best",
                          out_dir, dict(stored.get("data_report") or {}), list(stored.get("warnings") or []),
                          float(stored.get("seconds") or 0.0), int(stored.get("seed", settings.seed)),
                          int(stored.get("train_examples") or 0), int(stored.get("dev_examples") or 0),
                          dict(stored.get("test_metrics") or {}), total_steps, note,
                          bool(stored.get("stopped_early", False)))


def evaluate_split(spec: TaskSpec, sources: Sequence[DataSource], config: FinetuneConfig, prepared: PreparedData,
                   model_dir: Path) -> dict[str, float]:
    """Metrics of the saved best model on another labelled split of the task (e.g. MSRA's test file)."""
    family = registry.family(spec.family)
    report = DataReport()
    examples = read_examples(spec, sources, config, report)
    device = resolve_device(config.training.device)
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
        log.warning("seeds %s had evaluations whose predictions collapsed to one class", collapsed)
    return result


# --- evaluating a saved model -----------------------------------------------------------------------------

def evaluate(model_dir: str | os.PathLike, data_file: str | os.PathLike, *, out_dir: str | os.PathLike | None = None,
             labelled: bool = True, batch_size: int = 64, device: str = "auto", precision: str = "fp32",
             overrides: dict[str, Any] | None = None) -> EvalResult:
    """Score a fine-tuned model directory on a data file; write `predictions.jsonl` and `metrics.json`.

    How inputs are built (columns, max_seq_length, doc stride, tag scheme...) comes from the directory's
    `finetuning.json`; `overrides` (FinetuneConfig keys, flat or dotted: {"text_a_column": "review"} or
    {"data.text_a_column": "review"}) change it. Records are flat (`finetuning_record`), written before the
    config had tables or after; `finetune_key` places their keys.
    The task kind and label names come from its config.json (`architectures`, `problem_type`, `id2label`).

    Args:
        model_dir: a directory saved by `run_finetuning` (or any task-model directory, with `overrides`
            naming the columns).
        data_file: the file to score.
        out_dir: where to write (default: model_dir/eval-<file stem>).
        labelled: False for a file without labels/answers: predictions only, no metrics.
        batch_size, device, precision: how to run the model.
        overrides: FinetuneConfig keys (flat or dotted) that replace the stored settings.

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
    # The record's settings (not the run's task, format, labels and metric: the model directory has those).
    tree = nest_flat_keys({k: v for k, v in stored.items() if k in FLAT_KEYS and k not in ("task", "format", "labels")})
    try:
        merge(tree, nest_flat_keys(overrides or {}))
    except ConfigError as exc:
        raise ConfigError(f"evaluate: {exc}") from None
    data = tree.setdefault("data", {})
    for name in ("text_a_column", "text_b_column", "label_column"):
        if isinstance(data.get(name), int):
            data[name] = str(data[name])
    data.update(task=None, format=None)
    tree.update(model=os.fspath(model_dir), eval_batch_size=batch_size)
    tree.setdefault("training", {})["device"] = device
    config = build(FinetuneConfig, tree, source=f"evaluate {model_dir}", prefix="")
    regression = directory.config.problem_type == "regression"
    multi_label = directory.config.problem_type == "multi_label_classification"
    defaults = REGRESSION_METRICS if regression else MULTI_LABEL_METRICS if multi_label else family.default_metrics
    spec = TaskSpec(stored.get("task") or family.name, family.name, (), (DataSource(os.fspath(data_file)),),
                    text_a="text_a", label="label", metrics=tuple(stored.get("metrics") or defaults),
                    separator=" ", language="auto", max_seq_length=family.default_max_seq_length, regression=regression,
                    multi_label=multi_label)
    tokenizer = directory.require_tokenizer()
    report = DataReport()
    examples = read_examples(spec, spec.dev, config, report, labelled=labelled)
    if config.data.dev_limit is not None:
        examples = examples[:config.data.dev_limit]
    if not examples:
        raise DataError("no examples to evaluate", data_file)
    settings = input_settings(config, config.features.max_seq_length or spec.max_seq_length)
    if labelled and not regression and directory.config.id2label:
        family.check_labels(examples, directory.config.label_names, settings)
    run_device = resolve_device(device)
    model, _ = registry.load_model(model_dir, family.model_class, device=run_device)
    features = family.features(examples, tokenizer, settings, config=model.config, report=report)
    report.log_warnings(os.fspath(data_file))
    version_2 = bool(config.features.version_2_with_negative) or any(getattr(e, "is_impossible", False) for e in examples)
    chosen = stored.get("metric")  # the metric that picked this model is reported too
    chosen = chosen if chosen in metric_names(spec, version_2, examples) else None
    evaluator = make_evaluation(spec, examples, features, config, model.config, tokenizer, version_2, metric=chosen)
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
