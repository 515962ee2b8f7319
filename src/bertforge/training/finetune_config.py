"""`FinetuneConfig`: the settings of one fine-tuning run, and `describe`, which turns them into the run's
`families.task.TaskDescription` (row 4).

A run file nests its settings in tables, as pretraining's does; each field carries its help text, which
`bertforge finetune --help` shows:

    model = "runs/pretrain/checkpoint-010000"
    metric = "accuracy"
    [data]                     # DataConfig: what to read; its reader settings are `ReaderSettings`
    task = "sst2"
    [features]                 # FeatureConfig: window, doc stride, tagging scheme, QA decoding
    max_seq_length = 128
    [head]                     # HeadConfig: the task head and its loss
    freeze_encoder = false
    [training]                 # TrainingConfig, with fine-tuning's defaults
    lr = 2e-5

Defaults are the paper's (3 epochs, batch 32, lr 5e-5, 10% warmup, linear decay, max_seq_length 128; 384
with doc stride 128 for QA).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertforge.configuration import (
    build,
    merge,
    parse_override,
    read_toml,
    set_dotted,
    setting,
    settings_source,
    shared_data_root,
)
from bertforge.data.tagging import LABEL_POLICIES, TAG_SCHEMES
from bertforge.errors import ConfigError
from bertforge.families import registry
from bertforge.families.base import MULTI_LABEL, InputSettings, LossSettings
from bertforge.families.contrastive import DEFAULT_SCALE, LOSSES, ContrastiveLoss
from bertforge.families.task import DataSource, ReaderSettings, TaskDescription, reader_settings, rooted
from bertforge.families.tasks import TASKS
from bertforge.training.config import TrainingConfig

log = logging.getLogger("bertforge.finetuning")

THRESHOLD_MODES = ("global", "per_label", "none")
# `[head]` fields that set the embedding family's `ContrastiveLoss` (its own field names).
CONTRASTIVE_FIELDS = ("loss", "scale", "symmetric", "mini_batch_size", "matryoshka_dims", "teacher_temperature",
                      "query_regularizer",
                      "document_regularizer", "regularizer_warmup")


def _checker(table: str, config: Any):
    def need(cond: bool, name: str, fix: str) -> None:
        if not cond:
            raise ConfigError(f"finetune.{table}.{name}={getattr(config, name)!r} is invalid: {fix}")
    return need


@dataclass
class DataConfig(ReaderSettings):
    """`[data]`: what to read, and how (the reader settings are the fields of `ReaderSettings`). A run needs a
    dev set to pick its best model; `dev = ""` (`--no-dev`) trains without evaluation, and best/ is then the
    final model."""

    task: str | None = setting(None, "a named task: its files under the data root, columns, labels and metrics",
                               choices=tuple(TASKS))
    format: str | None = setting(None, "read --train/--dev files of this format instead of a named task",
                                 choices=tuple(registry.formats()))
    train: str | None = setting(None, "training file (with --task: replaces the named task's)")
    dev: str | None = setting(None, "dev file, evaluated every epoch to pick best/ (see --no-dev)")
    data_root: str | None = setting(None, "folder holding the named tasks' data (default $BERTFORGE_DATA, else "
                                          "../shared/data)")
    labels: list[str] | None = setting(None, "the label order (default: the named task's, else the sorted "
                                             "training labels)")
    multi_label: bool = setting(False, "each row has any number of labels (a JSON list in JSONL, else "
                                       "label_separator-separated); one sigmoid per label")
    train_limit: int | None = setting(None, "use only the first N training examples")
    dev_limit: int | None = setting(None, "use only the first N dev examples (and test examples, see --evaluate-test)")

    def __post_init__(self) -> None:
        super().__post_init__()
        need = _checker("data", self)
        need(self.task is None or self.task in TASKS, "task",
             f"unknown task; choose one of {sorted(TASKS)} or give --format with --train/--dev files")
        need(self.format is None or self.format in registry.formats(), "format",
             f"use one of {sorted(registry.formats())}")
        need(self.train_limit is None or self.train_limit > 0, "train_limit", "use a positive count or leave unset")
        need(self.dev_limit is None or self.dev_limit > 0, "dev_limit", "use a positive count or leave unset")

    @property
    def reader(self) -> ReaderSettings:
        """The reader settings given in this table (None where not given)."""
        return ReaderSettings(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ReaderSettings)})


@dataclass
class FeatureConfig:
    """`[features]`: how examples become model inputs, and the decoding options of the family that has them
    (QA's, under the same names in evaluate, predict and the server)."""

    max_seq_length: int | None = setting(None, "tokens per window (default 128, QA 384, at most the model's "
                                               "positions)")
    doc_stride: int | None = setting(None, "step between window starts of a long input (default: QA 128, "
                                           "others half a window)")
    max_query_length: int = setting(64, "QA: question tokens kept")
    max_answer_length: int = setting(30, "QA: longest answer, in tokens")
    n_best_size: int = setting(20, "QA: candidate starts and ends kept per window")
    version_2_with_negative: bool | None = setting(None, "QA: questions may have no answer (SQuAD v2.0; default: "
                                                         "on when the data has such questions)")
    null_score_diff_threshold: float = setting(0.0, "QA: how much the no-answer score must beat the best span")
    label_policy: str = setting("first", "tagging: which sub-tokens of a word carry its label",
                                choices=LABEL_POLICIES)
    tag_scheme: str = setting("BIO", "tagging: the model's label scheme", choices=TAG_SCHEMES)
    language: str | None = setting(None, "scoring language: en, zh or auto (default: the task's)")
    pooling: str | None = setting(None, "embedding: how token states become a sentence vector: cls, mean, max, "
                                        "mean_sqrt_len, weightedmean, lasttoken (default: the model directory's "
                                        "sentence-transformers pooling, else mean)")
    normalize: bool | None = setting(None, "embedding: unit-length vectors (a Normalize module; default: as the "
                                           "model directory has it, else off)")

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
    """`[head]`: the task head and how much of the model trains."""

    freeze_encoder: bool = setting(False, "feature-based (the paper's section 5.3): train the head only")
    feature_layers: list[int] | None = setting(None, "layers concatenated as features, e.g. -1,-2,-3,-4 "
                                                     "(default: the last)")
    classifier_hidden_sizes: list[int] | None = setting(None, "hidden widths of the head, e.g. 128 (default: one "
                                                              "linear layer)")
    classifier_dropout: float | None = setting(None, "dropout before the head (default: the model's hidden "
                                                     "dropout)")
    fresh_head: bool = setting(False, "discard a head stored in the model directory")
    class_weights: list[float] | None = setting(None, "single-label classification and tagging: one loss weight "
                                                      "per label, in label order, e.g. 1,5")
    balanced_class_weights: bool = setting(False, "compute the class weights from the training counts, "
                                                  "N / (labels x count)")
    focal_gamma: float = setting(0.0, "focal loss for single-label classification and tagging (2 is the "
                                      "paper's); 0 = plain cross-entropy")
    crf: bool = setting(False, "tagging: a linear-chain CRF over the tag scores with BIO/IOBES transitions "
                               "(Viterbi decoding everywhere)")
    thresholds: str = setting("global", "multi-label decision thresholds tuned on dev and stored with the "
                                        "model: one for all labels, one per label, or none (0.5)",
                              choices=THRESHOLD_MODES)
    loss: str | None = setting(None, "embedding: mnrl (in-batch negatives), cached_mnrl (the same, a large batch "
                                     "in mini-batches), cosent (scored pairs), margin_mse (triplets with a teacher's "
                                     "margin), kl (an anchor's candidates with a teacher score each) (default: cosent "
                                     "for scored pairs, margin_mse for scored triplets, kl for a score per "
                                     "candidate, else mnrl)", choices=LOSSES[1:])
    scale: float | None = setting(None, f"embedding: the similarity scale of mnrl and cosent (default "
                                        f"{DEFAULT_SCALE:g})")
    teacher_temperature: float | None = setting(None, "embedding: kl divides the teacher's scores by it before "
                                                      "their softmax (default 1)")
    symmetric: bool | None = setting(None, "embedding: mnrl also ranks the anchors for each positive")
    mini_batch_size: int | None = setting(None, "embedding: cached_mnrl's rows per mini-batch (default 32)")
    matryoshka_dims: list[int] | None = setting(None, "embedding: also train these leading widths of the vectors, "
                                                      "e.g. 256,128,64")
    query_regularizer: float | None = setting(None, "sparse: FLOPS regulariser weight of the query vectors "
                                                    "(default 5e-5)")
    document_regularizer: float | None = setting(None, "sparse: FLOPS regulariser weight of the document vectors "
                                                       "(default 3e-5)")
    regularizer_warmup: float | None = setting(None, "sparse: fraction of the steps over which both regulariser "
                                                     "weights grow quadratically from 0 (default 1/3; 0: constant)")

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

    def loss_settings(self, task: TaskDescription, examples: Sequence) -> LossSettings:
        """The training loss's class weights and focal factor; "balanced" weights from `examples`' counts."""
        weights = self.class_weights
        if self.balanced_class_weights:
            if task.labels is None:
                raise ConfigError("finetune.head.balanced_class_weights needs named labels; this task has none "
                                  "(regression or question answering): remove it")
            counts = task.family.training.label_counts(examples, task.labels, task.inputs)
            missing = [name for name, n in zip(task.labels, counts) if n == 0]
            if missing:
                raise ConfigError(f"finetune.head.balanced_class_weights: labels {missing} have no training "
                                  "examples, so their weight is undefined; give head.class_weights explicitly")
            total = sum(counts)
            weights = [total / (len(counts) * n) for n in counts]
            log.info("balanced class weights from %d training labels: %s", total,
                     ", ".join(f"{name} {w:.3g}" for name, w in zip(task.labels, weights)))
        try:
            return LossSettings(tuple(weights) if weights is not None else None, self.focal_gamma,
                                self.contrastive_loss())
        except ConfigError as exc:
            raise ConfigError(f"finetune.head.{exc}") from None

    def contrastive_loss(self) -> ContrastiveLoss | None:
        """The embedding loss settings given in this table (None when none is given)."""
        given = {name: getattr(self, name) for name in CONTRASTIVE_FIELDS if getattr(self, name) is not None}
        if not given:
            return None
        if "matryoshka_dims" in given:
            given["matryoshka_dims"] = tuple(given["matryoshka_dims"])
        return ContrastiveLoss(**given)


@dataclass
class FinetuneTrainingConfig(TrainingConfig):
    """`[training]`: the loop's `TrainingConfig` with the BERT paper's fine-tuning defaults (3 epochs, batch 32,
    lr 5e-5, 10% warmup, linear decay, weight decay 0.01), checkpoints in runs/finetune and no TensorBoard.
    `eval_every` = 0 evaluates every epoch (the dev set picks the best model). Resumable checkpoints are
    written at every epoch end and every `save_every` steps (0: epoch ends only), the last `keep_last` (2)
    kept, so `--resume auto` continues a run that was killed.

    A subclass rather than a `TrainingConfig(...)` default, so that a run file's partial `[training]` table
    (e.g. only `lr`) keeps these defaults for the keys it does not set.
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
        if self.minutes:  # epochs decide fine-tuning's evaluations and checkpoints: a budget would cut them off
            raise ConfigError(f"finetune.training.minutes={self.minutes!r} is invalid: a time budget is for "
                              "pretraining; give fine-tuning epochs or steps")


@dataclass
class FinetuneConfig:
    """One fine-tuning run (`bertforge finetune`): top-level keys and the tables `[data]` (`DataConfig`),
    `[features]` (`FeatureConfig`), `[head]` (`HeadConfig`) and `[training]` (`FinetuneTrainingConfig`)."""

    model: str = setting("", "the model directory to start from (ours, a Hugging Face BERT, or `bertforge "
                             "convert`'s output of a Google checkpoint)")
    seeds: list[int] | None = setting(None, "one run per seed, reported as mean ± std (default: one run with "
                                            "training.seed)")
    metric: str | None = setting(None, "the metric that picks the best checkpoint (default: the task's first)")
    evaluate_test: bool = setting(True, "after training, score the best model on a named task's test split too "
                                  "(announced with its file and count; --dev-limit applies)")
    fast_path: bool = setting(True, "skip padding tokens and fuse the QKV projection in training and evaluation "
                                    "(tested equal to the plain path)")
    eval_batch_size: int = setting(64, "examples per evaluation batch")
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


def family_settings() -> dict[str, list[str]]:
    """Every family-specific setting (`FamilyTraining.settings`) -> who honours it ("tagging", "single label
    classification"), by family and problem kind (`FamilyTraining.run_settings`)."""
    users: dict[str, list[str]] = {}
    for family in registry.FINETUNING_FAMILIES:
        for kind in family.kinds or (None,):
            who = family.name if kind is None else kind.replace("_", " ")
            for key in sorted(family.training.run_settings(kind)):
                users.setdefault(key, []).append(who)
    return users


def check_family_settings(config: FinetuneConfig, task: TaskDescription) -> None:
    """Refuse a setting that only other families (or other problem kinds) use, set away from its default: it
    would be accepted and do nothing. The message names the flag, the setting and who uses it."""
    honoured = task.family.training.run_settings(task.kind)
    for key, users in family_settings().items():
        if key in honoured:
            continue
        table, name = key.split(".")
        section = getattr(config, table)
        declared = next(f for f in dataclasses.fields(section) if f.name == name)
        unset = declared.default if declared.default is not dataclasses.MISSING else declared.default_factory()
        if getattr(section, name) == unset:
            continue
        this = task.kind.replace("_", " ") if task.kind else task.family.name
        raise ConfigError(f"--{name.replace('_', '-')} (finetune.{key}) applies to {' and '.join(users)}; this run "
                          f"({task.name}) is {this}, where it would do nothing: remove it")


def where_is(name: str) -> str | None:
    """The table a key belongs to, for the hint of an "unknown key" error ("lr" -> "training.lr")."""
    for table, cls in TABLES.items():
        if name in {f.name for f in dataclasses.fields(cls)}:
            return f"{table}.{name}"
    return None


def load_finetune_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = (),
                         values: Mapping[str, Any] | None = None) -> FinetuneConfig:
    """A `FinetuneConfig` from a TOML run file, then `values` (a nested dict), then `section.key=value`
    overrides (TOML literals, as the command line gives them).

    Raises:
        ConfigError: unreadable file, unknown key (with the table it belongs in, when it belongs in one),
            value of the wrong kind, or a table's own validation.
    """
    source = settings_source(path, values, overrides)
    tree: dict[str, Any] = read_toml(path) if path is not None else {}
    if values:
        merge(tree, dict(values))
    for text in overrides:
        dotted, value = parse_override(text)
        set_dotted(tree, dotted, value)
    misplaced = [key for key, value in tree.items() if key not in {f.name for f in dataclasses.fields(FinetuneConfig)}]
    if misplaced:
        key = misplaced[0]
        place = where_is(key)
        close = difflib.get_close_matches(key, [f.name for f in dataclasses.fields(FinetuneConfig)], n=1)
        hint = (f"; it belongs in its table: {place} ([{place.split('.')[0]}] {key} = ..., or --{place}=...)"
                if place else f" (did you mean {close[0]!r}?)" if close else "")
        raise ConfigError(f"{source}: unknown key {key!r} at the top level{hint}; top-level keys are "
                          f"{[f.name for f in dataclasses.fields(FinetuneConfig)]}")
    return build(FinetuneConfig, tree, source=source, prefix="")


# --- the run's task description ---------------------------------------------------------------------------

def data_root(config: FinetuneConfig) -> Path:
    return Path(config.data.data_root) if config.data.data_root else shared_data_root()


def describe(config: FinetuneConfig) -> TaskDescription:
    """The task a run trains, complete: the named task (or the `format`'s defaults) with the config's reader
    settings, inputs, decoding options, labels and metric over it. `inputs.max_seq_length` is the task's
    (or the config's); `finetune.prepare_data` lowers a default one to the model's positions.

    Raises:
        ConfigError: neither a task nor a format given, or a format without its files.
    """
    data = config.data
    base = _base_task(config)
    features = config.features
    inputs = InputSettings(max_seq_length=features.max_seq_length or base.inputs.max_seq_length,
                           doc_stride=features.doc_stride, max_query_length=features.max_query_length,
                           tag_scheme=features.tag_scheme, label_policy=features.label_policy)
    # The family's decoding options under their own names: a [features] field of the same name sets one.
    options = {name: getattr(features, name) for name in base.family.options
               if getattr(features, name, None) is not None}
    labels = tuple(data.labels) if data.labels else base.labels
    return base.replace(reader=data.reader.over(base.reader), inputs=inputs, options=options, labels=labels,
                        metric=config.metric, language=features.language or base.language)


def _base_task(config: FinetuneConfig) -> TaskDescription:
    """The named task rooted at the data root (with --train/--dev replacing its files), or a format's."""
    data = config.data
    if data.task is not None:
        task = TASKS[data.task]
        root = data_root(config)
        task = task.replace(train=rooted(task.train, root), dev=rooted(task.dev, root), test=rooted(task.test, root))
        if data.train:
            task = task.replace(train=(DataSource(data.train),))
        if data.dev:
            task = task.replace(dev=(DataSource(data.dev),))
        if data.multi_label:
            task = task.replace(kind=MULTI_LABEL, metrics=task.family.metric_defaults(MULTI_LABEL))
        return task
    if data.format is None:
        raise ConfigError(f"say what to train: --task NAME (one of {sorted(TASKS)}) or --format "
                          f"{'|'.join(registry.formats())} with --train FILE [--dev FILE]")
    if not data.train and not data.dev:
        raise ConfigError(f"--format {data.format} needs --train FILE (and --dev FILE to evaluate)")
    family, kind = registry.formats()[data.format]
    if data.multi_label and kind is not None:
        kind = MULTI_LABEL
    reader = reader_settings(**family.training.format_reader(data.format))
    return TaskDescription(
        name=data.format, family=family, kind=kind,
        train=(DataSource(data.train),) if data.train else (), dev=(DataSource(data.dev),) if data.dev else (),
        reader=reader, inputs=InputSettings(max_seq_length=family.default_max_seq_length),
        metrics=family.metric_defaults(kind, data.reader.over(reader)),
        language=family.default_language)
