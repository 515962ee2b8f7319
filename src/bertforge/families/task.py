"""The one typed task description: what a fine-tuning run reads, how it builds inputs, which labels and
metrics it has — and, written as JSON, the saved model's `finetuning.json`.

A `TaskDescription` holds the family object itself (never its name), the data sources, the reader settings
as one typed value (`ReaderSettings`), the input settings (`InputSettings`: window, doc stride, ...), the
family's decoding options under the family's own names (QA's `n_best_size`, `max_answer_length`, ...), the
label names, the metric names and the problem kind. The fine-tuning run is built from one
(`training.finetune_config.describe`), saves it with the best model (`to_json`, the one writer), and
`evaluate`, `predict`, the pipelines and the server read it back (`read_description`, the one reader),
which also reads the flat records that earlier releases wrote.

A new reader option has one home: a field of `ReaderSettings` (with its help text). The `[data]` table of a
run file is `ReaderSettings` plus what to read (`training.finetune_config.DataConfig` extends it), and the
family's `read` is where the option takes effect.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bertforge.checkpoint_format import ModelDirectory
from bertforge.configuration import build, setting
from bertforge.constants import FINETUNING_NAME
from bertforge.data.files import ON_INVALID
from bertforge.data.finetuning import DataReport
from bertforge.data.tagging import BIO_ERROR_POLICIES
from bertforge.errors import CheckpointError, ConfigError, InputError
from bertforge.families.base import MULTI_LABEL, REGRESSION, SINGLE_LABEL, Family, InputSettings

# finetuning.json's layout version; records without it are the flat records of earlier releases.
DESCRIPTION_VERSION = 2


@dataclass(frozen=True)
class DataSource:
    """A data file and which deterministic part of it to use: None = all of it; "train"/"eval" = the
    article split (QA) or the carved dev split (tagging) of a task that ships without a dev file."""

    path: str
    part: str | None = None


@dataclass
class ReaderSettings:
    """How a family's reader reads a data file. Every field left None is "not given": a named task's own
    setting, else the reader's default (`READER_DEFAULTS`), fills it in (`over`)."""

    text_a_column: int | str | None = setting(None, "column of the first text (header name or 0-based index)")
    text_b_column: int | str | None = setting(None, "column of the second text of a pair")
    negative_column: int | str | None = setting(None, "embedding triplets: the column of the hard negative")
    label_column: int | str | None = setting(None, "column of the label (header name or 0-based index)")
    header: bool | None = setting(None, "whether the table has a header row (default: detect)")
    file_format: str | None = setting(None, "the table's format (default: from the extension)",
                                      choices=("tsv", "csv", "jsonl"))
    token_column: int | None = setting(None, "CoNLL files: the word column, 0-based (default 0)")
    tag_column: int | None = setting(None, "CoNLL files: the tag column, 0-based, -1 = the last (default -1)")
    separator: str | None = setting(None, 'what joins a CoNLL sentence\'s words: " " (default), or "" for one '
                                          'character per line ("space" and "none" are accepted)')
    context_column: str | None = setting(None, "choice files: the context column (default sent1)")
    start_column: str | None = setting(None, "choice files: the column every ending continues (default sent2)")
    ending_columns: list[str] | None = setting(None, "choice files: the ending columns (default: ending0, ...)")
    label_separator: str | None = setting(None, 'what separates the labels of a multi-label cell (default ",")')
    id_column: str | None = setting(None, "the column naming each row's prediction (default: a column named "
                                          "index, id, idx, qid or guid, else the row's file:line)")
    on_invalid: str | None = setting(None, "malformed rows: error (default) or skip (counted)", choices=ON_INVALID)
    bio_errors: str | None = setting(None, "broken BIO tags in tag files: warn (default) or error",
                                     choices=BIO_ERROR_POLICIES)

    def __post_init__(self) -> None:
        def need(cond: bool, name: str, fix: str) -> None:
            if not cond:
                raise ConfigError(f"finetune.data.{name}={getattr(self, name)!r} is invalid: {fix}")

        need(self.on_invalid in (None, *ON_INVALID), "on_invalid", f"use one of {ON_INVALID}")
        need(self.bio_errors in (None, *BIO_ERROR_POLICIES), "bio_errors", f"use one of {BIO_ERROR_POLICIES}")
        need(self.label_separator is None or bool(self.label_separator), "label_separator",
             'give the character between labels, e.g. "," or "|"')
        need(self.file_format in (None, "tsv", "csv", "jsonl"), "file_format", "use tsv, csv or jsonl")
        if self.separator in ("space", "none"):
            self.separator = " " if self.separator == "space" else ""

    def given(self) -> dict[str, Any]:
        """The settings that were given (not None), by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(ReaderSettings)
                if getattr(self, f.name) is not None}

    def over(self, base: ReaderSettings) -> ReaderSettings:
        """These settings where given, `base`'s elsewhere."""
        return ReaderSettings(**{**base.given(), **self.given()})


READER_DEFAULTS = ReaderSettings(token_column=0, tag_column=-1, separator=" ", context_column="sent1",
                                 start_column="sent2", label_separator=",", on_invalid="error", bio_errors="warn")


def reader_settings(**given: Any) -> ReaderSettings:
    """Resolved reader settings: those given, the reader's defaults (`READER_DEFAULTS`) for the rest."""
    return ReaderSettings(**given).over(READER_DEFAULTS)


@dataclass(frozen=True)
class TaskDescription:
    """One fine-tuning task, complete: the run's input and the saved `finetuning.json`.

    Attributes:
        name: the named task ("sst2") or the format ("pair") it was built from.
        family: the task family object (`families.registry`).
        kind: the problem kind, one of the family's `kinds` (classification: `SINGLE_LABEL`, `MULTI_LABEL`,
            `REGRESSION`); None for a family with one kind.
        train, dev, test: the data sources of each split.
        reader: how the family's reader reads them (resolved: defaults filled in).
        inputs: how examples become windows (`InputSettings`).
        options: the family's decoding options, under the family's names (`Family.options`).
        labels: the label names in id order (None: the head predicts no named labels, or read from data).
        metrics: what the evaluations report first; `metric` picks the best checkpoint.
        language: the scoring language ("en", "zh", "auto").
        note: where a named task's files come from, and any split it carves.
    """

    name: str
    family: Family
    kind: str | None = None
    train: tuple[DataSource, ...] = ()
    dev: tuple[DataSource, ...] = ()
    test: tuple[DataSource, ...] = ()
    reader: ReaderSettings = field(default_factory=reader_settings)
    inputs: InputSettings = field(default_factory=InputSettings)
    options: Mapping[str, Any] = field(default_factory=dict)
    labels: tuple[str, ...] | None = None
    metrics: tuple[str, ...] = ()
    metric: str | None = None
    language: str = "en"
    note: str = ""

    def __post_init__(self) -> None:
        if self.kind not in (None, *self.family.kinds) or (self.family.kinds and self.kind is None):
            raise ConfigError(f"task {self.name}: kind={self.kind!r} is invalid for the {self.family.name} family; "
                              f"use one of {list(self.family.kinds) or [None]}")
        # Every description carries the complete options (the family's defaults where not given), checked.
        object.__setattr__(self, "options", self.family.check_options(dict(self.options)))

    def replace(self, **changes: Any) -> TaskDescription:
        return dataclasses.replace(self, **changes)

    @property
    def regression(self) -> bool:
        return self.kind == REGRESSION

    @property
    def chosen_metric(self) -> str:
        """The metric that picks the best checkpoint: `metric`, else the first of `metrics`."""
        return self.metric or self.metrics[0]

    def read(self, sources: Sequence[DataSource], report: DataReport, labelled: bool = True) -> list:
        """The examples of `sources` (with their deterministic parts), concatenated, read by the family."""
        examples: list = []
        for source in sources:
            examples.extend(self.family.read(source.path, part=source.part, task=self, report=report,
                                             labelled=labelled))
        return examples

    def to_json(self) -> dict[str, Any]:
        """`finetuning.json`: this description as plain JSON values (`read_description` reads it back)."""
        def sources(items: tuple[DataSource, ...]) -> list[dict[str, Any]]:
            return [dataclasses.asdict(s) for s in items]

        return {"version": DESCRIPTION_VERSION, "name": self.name, "family": self.family.name, "kind": self.kind,
                "train": sources(self.train), "dev": sources(self.dev), "test": sources(self.test),
                "reader": dataclasses.asdict(self.reader), "inputs": self.inputs.to_dict(),
                "options": dict(self.options), "labels": None if self.labels is None else list(self.labels),
                "metrics": list(self.metrics), "metric": self.metric, "language": self.language, "note": self.note}

    def overridden(self, changes: Mapping[str, Mapping[str, Any]], where: str) -> TaskDescription:
        """This description with some `reader`, `inputs` or `options` values replaced:
        {"reader": {"text_a_column": "review"}, "inputs": {"max_seq_length": 64}}.

        Raises:
            ConfigError: an unknown part or key (named, with the valid ones), or a value the part refuses.
        """
        unknown = sorted(set(changes) - {"reader", "inputs", "options"})
        if unknown:
            raise ConfigError(f"{where}: unknown setting {unknown[0]!r}; give reader.<key>, inputs.<key> or "
                              "options.<key>")
        reader, inputs, options = self.reader, self.inputs, dict(self.options)
        if changes.get("reader"):
            reader = build(ReaderSettings, dict(changes["reader"]), source=where, prefix="reader.").over(reader)
        if changes.get("inputs"):
            inputs = build(InputSettings, {**inputs.to_dict(), **changes["inputs"]}, source=where, prefix="inputs.")
        if changes.get("options"):
            try:
                options = self.family.check_options({**options, **changes["options"]})
            except InputError as exc:
                raise ConfigError(f"{where}: options: {exc}") from None
        return self.replace(reader=reader, inputs=inputs, options=options)


def read_description(record: Mapping[str, Any], family: Family, *, where: str = "finetuning.json",
                     families: Mapping[str, Family] | None = None) -> TaskDescription:
    """The description a model directory's `finetuning.json` holds (the one reader of that file).

    `family` is the model's family (from its config.json architecture); a record naming another family is an
    error. Records written before the description had a version (flat records) are read by `from_flat_record`.

    Raises:
        CheckpointError: a record that is not a description (unknown keys, values of the wrong kind).
    """
    if "version" not in record:
        return from_flat_record(record, family, where=where)
    if record.get("version") != DESCRIPTION_VERSION:
        raise CheckpointError(f"{where}: version {record.get('version')!r} is not one this bertforge reads "
                              f"({DESCRIPTION_VERSION}); save the model again with this release")
    named = record.get("family")
    if named not in (None, family.name):
        raise CheckpointError(f"{where}: the record is for the {named} family but config.json's architecture is "
                              f"{family.model_class.__name__} ({family.name}); the files do not belong together")
    try:
        reader = build(ReaderSettings, dict(record.get("reader") or {}), source=where, prefix="reader.")
        inputs = build(InputSettings, dict(record.get("inputs") or {}), source=where, prefix="inputs.")
        options = dict(record.get("options") or {})
        labels = record.get("labels")
        return TaskDescription(
            name=str(record.get("name") or family.name), family=family, kind=record.get("kind"),
            train=_sources(record.get("train")), dev=_sources(record.get("dev")), test=_sources(record.get("test")),
            reader=reader, inputs=inputs, options=options, labels=None if labels is None else tuple(labels),
            metrics=tuple(record.get("metrics") or ()), metric=record.get("metric"),
            language=str(record.get("language") or "en"), note=str(record.get("note") or ""))
    except (ConfigError, InputError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{where}: not a valid task description ({exc}); save the model again") from None


def _sources(items: Any) -> tuple[DataSource, ...]:
    return tuple(DataSource(str(item["path"]), item.get("part")) for item in items or ())


def from_flat_record(record: Mapping[str, Any], family: Family, *, where: str = "finetuning.json"
                     ) -> TaskDescription:
    """A flat record of an earlier release (`text_a_column`, `max_seq_length`, `regression` ... at the top
    level, QA's options under the training names) as a description."""
    def known(cls: type) -> dict[str, Any]:
        names = {f.name for f in dataclasses.fields(cls)}
        return {k: v for k, v in record.items() if k in names and v is not None}

    kind = None
    if family.kinds:  # the families with problem kinds (classification)
        kind = REGRESSION if record.get("regression") else MULTI_LABEL if record.get("multi_label") else SINGLE_LABEL
    try:
        reader = reader_settings(**known(ReaderSettings))
        inputs = InputSettings(**{"max_seq_length": family.default_max_seq_length, **known(InputSettings)})
        options = {k: record[k] for k in family.options if record.get(k) is not None}
        family.check_options(options)
    except (ConfigError, InputError, TypeError) as exc:
        raise CheckpointError(f"{where}: an earlier release's record that cannot be read ({exc}); fine-tune "
                              "again") from None
    labels = record.get("labels")
    return TaskDescription(
        name=str(record.get("task") or record.get("format") or family.name), family=family, kind=kind,
        reader=reader, inputs=inputs, options=options, labels=None if labels is None else tuple(labels),
        metrics=tuple(record.get("metrics") or family.metric_defaults(kind)), metric=record.get("metric"),
        language=str(record.get("language") or "auto"))


def described_by_model(family: Family, kind: str | None, labels: Sequence[str] | None) -> TaskDescription:
    """The description of a task-model directory without `finetuning.json` (e.g. a Hugging Face fine-tuned
    model): the family's default window, columns named text_a / text_b / label, labels from config.json."""
    return TaskDescription(
        name=family.name, family=family, kind=kind,
        reader=reader_settings(text_a_column="text_a", label_column="label"),
        inputs=InputSettings(max_seq_length=family.default_max_seq_length),
        labels=None if labels is None else tuple(labels), metrics=family.metric_defaults(kind), language="auto")


def rooted(sources: tuple[DataSource, ...], root: str | os.PathLike) -> tuple[DataSource, ...]:
    """Sources relative to a data root, made absolute under it."""
    return tuple(DataSource(os.path.join(os.fspath(root), s.path), s.part) for s in sources)


def task_of(directory: ModelDirectory, family: Family) -> TaskDescription:
    """The task a model directory was fine-tuned for: its `finetuning.json`, else what its config.json says
    (`described_by_model`). `directory` is read once by the caller (`checkpoint_format.read_directory`)."""
    if directory.finetuning is not None:
        return read_description(directory.finetuning, family, where=os.fspath(directory.path / FINETUNING_NAME))
    config = directory.config
    kind = (config.problem_type or SINGLE_LABEL) if family.kinds else None
    return described_by_model(family, kind, config.label_names if config.id2label else None)
