"""The one task description: named tasks and every `--format` survive `finetuning.json` (description ->
file -> description is equal), reader settings layer over a task's, earlier releases' flat records read
through the one old-form reader, and records that do not fit their model are one clear error."""

from __future__ import annotations

import json

import pytest

from bertforge.errors import CheckpointError, ConfigError
from bertforge.families import registry
from bertforge.families.classification import FAMILY as CLASSIFICATION
from bertforge.families.question_answering import FAMILY as QUESTION_ANSWERING
from bertforge.families.tagging import FAMILY as TAGGING
from bertforge.families.task import (
    READER_DEFAULTS,
    ReaderSettings,
    TaskDescription,
    from_flat_record,
    read_description,
)
from bertforge.families.tasks import TASKS
from bertforge.training.finetune_config import DataConfig, FeatureConfig, FinetuneConfig, describe


def through_file(task: TaskDescription, tmp_path) -> TaskDescription:
    path = tmp_path / "finetuning.json"
    path.write_text(json.dumps(task.to_json(), indent=2, ensure_ascii=False))
    return read_description(json.loads(path.read_text()), task.family, where=str(path))


@pytest.mark.parametrize("name", sorted(TASKS))
def test_description_round_trip_every_named_task(name, tmp_path):
    task = describe(FinetuneConfig(model="m", data=DataConfig(task=name, data_root=str(tmp_path))))
    assert through_file(task, tmp_path) == task
    assert through_file(TASKS[name], tmp_path) == TASKS[name]


@pytest.mark.parametrize("format_name", sorted(registry.formats()))
def test_description_round_trip_every_format(format_name, tmp_path):
    config = FinetuneConfig(model="m", data=DataConfig(format=format_name, train="t", dev="d", on_invalid="skip"),
                            features=FeatureConfig(doc_stride=32, max_seq_length=96), metric="f1")
    task = describe(config)
    family, kind = registry.formats()[format_name]
    assert task.family is family and task.kind == kind
    again = through_file(task, tmp_path)
    assert again == task and again.reader.on_invalid == "skip" and again.inputs.doc_stride == 32


def test_description_holds_the_family_object_and_complete_options():
    task = TASKS["squad"]
    assert task.family is QUESTION_ANSWERING
    assert task.options == QUESTION_ANSWERING.options  # the family's defaults, under its own names
    assert set(task.options) == {"n_best_size", "max_answer_length", "version_2_with_negative",
                                 "null_score_diff_threshold"}
    assert json.loads(json.dumps(task.to_json()))["family"] == "question_answering"


def test_description_refuses_a_kind_its_family_has_not():
    with pytest.raises(ConfigError, match="kind='regression' is invalid for the tagging family"):
        TaskDescription("t", TAGGING, "regression")
    with pytest.raises(ConfigError, match="kind=None is invalid for the classification family"):
        TaskDescription("t", CLASSIFICATION, None)


def test_reader_settings_given_ones_win_over_the_base():
    base = ReaderSettings(text_a_column="sentence", separator="").over(READER_DEFAULTS)
    mine = ReaderSettings(on_invalid="skip", separator="space")
    merged = mine.over(base)
    assert (merged.text_a_column, merged.separator, merged.on_invalid, merged.tag_column) == ("sentence", " ", "skip", -1)
    with pytest.raises(ConfigError, match=r"finetune\.data\.on_invalid='drop' is invalid"):
        ReaderSettings(on_invalid="drop")


def test_description_overridden_changes_reader_inputs_options_only():
    task = TASKS["sst2"]
    changed = task.overridden({"reader": {"text_a_column": "review"}, "inputs": {"max_seq_length": 64}},
                              where="evaluate m")
    assert (changed.reader.text_a_column, changed.reader.label_column, changed.inputs.max_seq_length) == (
        "review", "label", 64)
    with pytest.raises(ConfigError, match="evaluate m: unknown setting 'labels'"):
        task.overridden({"labels": {}}, where="evaluate m")
    with pytest.raises(ConfigError, match=r"unknown key 'reader\.text_column'"):
        task.overridden({"reader": {"text_column": "x"}}, where="evaluate m")
    with pytest.raises(ConfigError, match=r"options: unknown option\(s\) \['top_k'\]"):
        task.overridden({"options": {"top_k": 3}}, where="evaluate m")


def test_flat_record_of_an_earlier_release_reads_as_a_description():
    record = {"task": None, "format": "qa", "family": "question_answering", "regression": False,
              "text_a_column": "text_a", "label_column": "label", "separator": " ", "max_seq_length": 48,
              "doc_stride": 16, "max_query_length": 64, "max_answer_length": 25, "n_best_size": 10,
              "version_2_with_negative": True, "null_score_diff_threshold": 0.5, "label_policy": "first",
              "tag_scheme": "BIO", "language": "auto", "metrics": ["f1", "exact_match"], "metric": "f1"}
    task = read_description(record, QUESTION_ANSWERING)
    assert task == from_flat_record(record, QUESTION_ANSWERING)
    assert (task.name, task.inputs.max_seq_length, task.inputs.doc_stride) == ("qa", 48, 16)
    assert task.options == {"n_best_size": 10, "max_answer_length": 25, "version_2_with_negative": True,
                            "null_score_diff_threshold": 0.5}
    regression = read_description({"format": "regression", "regression": True, "text_a_column": 0,
                                   "label_column": -1}, CLASSIFICATION)
    assert regression.kind == "regression" and regression.reader.text_a_column == 0
    assert regression.metrics == ("pearson", "spearman")


def test_read_description_refuses_records_that_do_not_fit(tmp_path):
    good = TASKS["conll2003"].to_json()
    with pytest.raises(CheckpointError, match="the record is for the tagging family but config.json's architecture "
                       "is BertForSequenceClassification"):
        read_description(good, CLASSIFICATION)
    with pytest.raises(CheckpointError, match="version 9 is not one this bertforge reads"):
        read_description({**good, "version": 9}, TAGGING)
    with pytest.raises(CheckpointError, match=r"not a valid task description .*unknown key 'reader\.colour'"):
        read_description({**good, "reader": {**good["reader"], "colour": "red"}}, TAGGING)
