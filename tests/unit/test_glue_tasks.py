"""Every GLUE task by name, from its official files: the fixtures in tests/fixtures/glue/ copy GLUE's layouts
(MRPC with its byte-order mark and CRLF line ends, CoLA without a header, MNLI's 12/16/10 columns, QQP's
`id qid1 qid2 ...` with a malformed training row, QNLI's `index question sentence label`, the unlabeled
diagnostic set), and each is read through its named task's reader with no column flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertforge.data.finetuning import DataReport
from bertforge.errors import ConfigError, DataError
from bertforge.families.task import DataSource
from bertforge.families.tasks import TASKS
from bertforge.training.finetune_config import describe, load_finetune_config
from bertforge.training.glue import (
    GLUE_ROWS,
    TASK_VALUES,
    find_test_file,
    format_prediction,
    read_test_ids,
    select_rows,
    write_submission,
)
from conftest import finetune_values

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
GLUE = ROOT / "glue"
GLUE_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "mnli-mm", "qnli", "rte", "wnli")


def config(task: str, **values):
    return load_finetune_config(values=finetune_values(model="m", task=task, data_root=str(ROOT), **values))


def read(task: str, split: str, **values) -> tuple[list, DataReport]:
    spec = describe(config(task, **values))
    report = DataReport()
    return spec.read(getattr(spec, split), report), report


def columns(path: Path) -> set[int]:
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    return {len(line.split("\t")) for line in lines if line.strip()}


def test_every_glue_task_is_named_with_the_papers_metrics():
    assert set(GLUE_TASKS) <= set(TASKS)
    assert TASKS["mrpc"].metrics == ("f1", "accuracy") and TASKS["qqp"].metrics == ("f1", "accuracy")
    assert TASKS["mnli"].metrics == TASKS["mnli-mm"].metrics == TASKS["qnli"].metrics == ("accuracy",)
    assert TASKS["cola"].metrics[0] == "mcc" and TASKS["stsb"].metrics == ("pearson", "spearman")
    assert TASKS["mnli"].dev[0].path == "glue/MNLI/dev_matched.tsv"
    assert TASKS["mnli-mm"].dev[0].path == "glue/MNLI/dev_mismatched.tsv"
    assert TASKS["mnli"].train == TASKS["mnli-mm"].train
    assert {row.task for row in GLUE_ROWS} <= set(TASKS)


@pytest.mark.parametrize("task", GLUE_TASKS)
def test_fixture_train_and_dev_read_with_the_tasks_labels(task):
    for split in ("train", "dev"):
        examples, report = read(task, split, **TASK_VALUES.get(task, {}).get("data", {}))
        assert examples, (task, split)
        spec = TASKS[task]
        for example in examples:
            assert example.text_a.strip() and "\r" not in example.text_a and not example.text_a.startswith("\ufeff")
            if spec.reader.text_b_column is not None:
                assert example.text_b and "\r" not in example.text_b
            if spec.regression:
                assert 0.0 <= example.label <= 5.0
            else:
                assert example.label in spec.labels, (task, split, example.label)
        family = spec.family
        if spec.labels:
            family.check_labels(examples, list(spec.labels), None)


def test_mrpc_as_shipped_bom_crlf_quality_header():
    raw = (GLUE / "MRPC" / "train.tsv").read_bytes()
    assert raw.startswith(b"\xef\xbb\xbfQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\r\n") and raw.count(b"\r\n") == 9
    examples, _ = read("mrpc", "train")
    assert len(examples) == 8
    first = examples[0]
    assert first.text_a.startswith("Amrozi accused his brother") and first.text_b.startswith("Referring to him")
    assert first.text_b.endswith("evidence .") and first.label == "1"
    assert [e.label for e in examples] == ["1", "0", "1", "0", "1", "1", "0", "1"]
    dev, _ = read("mrpc", "dev")
    assert len(dev) == 5 and dev[1].label == "0" and dev[0].text_b.startswith('" The foodservice')


def test_cola_without_header_and_sst2_stsb_layouts():
    cola, _ = read("cola", "train")
    assert len(cola) == 10 and {e.label for e in cola} == {"0", "1"}
    assert columns(GLUE / "CoLA" / "train.tsv") == {4}
    sst, _ = read("sst2", "dev")
    assert len(sst) == 6 and sst[0].text_b is None
    stsb, _ = read("stsb", "train")
    assert stsb[0].text_a == "A plane is taking off." and stsb[0].label == 5.0
    assert columns(GLUE / "STS-B" / "train.tsv") == {10} and columns(GLUE / "STS-B" / "test.tsv") == {9}


def test_mnli_columns_and_gold_label():
    assert columns(GLUE / "MNLI" / "train.tsv") == {12}
    assert columns(GLUE / "MNLI" / "dev_matched.tsv") == columns(GLUE / "MNLI" / "dev_mismatched.tsv") == {16}
    assert columns(GLUE / "MNLI" / "test_matched.tsv") == columns(GLUE / "MNLI" / "test_mismatched.tsv") == {10}
    train, _ = read("mnli", "train")
    assert len(train) == 9 and train[0].text_a.startswith("Conceptually cream skimming")
    assert train[0].text_b.startswith("Product and geography") and train[0].label == "neutral"
    assert {e.label for e in train} == {"contradiction", "entailment", "neutral"}
    matched, _ = read("mnli", "dev")
    # label1..label5 are the annotators' labels; gold_label (the last column) is the label.
    assert [e.label for e in matched] == ["neutral", "contradiction", "entailment", "contradiction", "contradiction"]
    mismatched, _ = read("mnli-mm", "dev")
    assert len(mismatched) == 4 and mismatched[0].text_a.startswith("Your contribution helped")
    assert [e.label for e in mismatched] == ["contradiction", "contradiction", "entailment", "neutral"]


def test_qqp_malformed_row_is_an_error_by_default_and_skipped_by_the_glue_run():
    with pytest.raises(DataError, match=r"QQP/train\.tsv.*6|column"):
        read("qqp", "train")
    assert TASK_VALUES["qqp"] == {"data": {"on_invalid": "skip"}}
    examples, report = read("qqp", "train", on_invalid="skip")
    assert len(examples) == 8 and report.counts["skipped_column_count"] == 1
    assert examples[1].text_a == "How do I control my horny emotions?" and examples[1].label == "1"
    assert "--on-invalid skip" in TASKS["qqp"].note


def test_qnli_question_sentence_label():
    examples, _ = read("qnli", "train")
    assert len(examples) == 8
    assert examples[0].text_a == "When did the third Digimon series begin?"
    assert examples[0].text_b.startswith("Unlike the two seasons") and examples[0].label == "not_entailment"
    assert examples[2].label == "entailment"


@pytest.mark.parametrize("row", GLUE_ROWS, ids=[row.name for row in GLUE_ROWS])
def test_every_test_file_reads_unlabeled_with_its_ids(row):
    path = find_test_file(row, ROOT)
    assert path is not None, row.name
    spec = describe(config(row.task)).overridden(row.test_overrides, where="test")
    examples = spec.read((DataSource(str(path)),), DataReport(), labelled=False)
    ids = read_test_ids(path, row.index_column)
    assert len(ids) == len(examples) >= 2
    assert ids == [str(i) for i in range(len(ids))]
    assert all(e.label is None and e.text_a.strip() and not e.text_a.isdigit() for e in examples)
    assert all((e.text_b is None) == (spec.reader.text_b_column is None) for e in examples)


def test_test_file_layouts():
    assert (GLUE / "QQP" / "test.tsv").read_text(encoding="utf-8").startswith("id\tquestion1\tquestion2\n")
    assert (GLUE / "MRPC" / "test.tsv").read_bytes().startswith(b"\xef\xbb\xbfindex\t#1 ID\t#2 ID\t#1 String")
    assert (GLUE / "CoLA" / "test.tsv").read_text(encoding="utf-8").startswith("index\tsentence\n")
    assert find_test_file(select_rows(["ax"])[0], ROOT) == GLUE / "diagnostic.tsv"


def test_select_rows_by_key_or_leaderboard_name():
    assert [r.name for r in select_rows([])] == [r.name for r in GLUE_ROWS]
    assert [r.name for r in select_rows(["SST-2", "mnli-mm", "cola"])] == ["MNLI-mm", "SST-2", "CoLA"]
    assert [r.name for r in select_rows(["MNLI-m", "sts-b", "AX"])] == ["MNLI-m", "STS-B", "AX"]
    assert {r.task for r in select_rows(["mnli", "mnli-mm", "ax"])} == {"mnli"}
    with pytest.raises(ConfigError, match="unknown task 'sst3'.*mnli-mm"):
        select_rows(["sst3"])


def test_submission_names_and_predictions_as_the_leaderboard_expects(tmp_path):
    assert [f"{row.name}.tsv" for row in GLUE_ROWS] == [
        "MNLI-m.tsv", "MNLI-mm.tsv", "QQP.tsv", "QNLI.tsv", "SST-2.tsv", "CoLA.tsv", "STS-B.tsv", "MRPC.tsv",
        "RTE.tsv", "WNLI.tsv", "AX.tsv"]
    stsb, rte = select_rows(["stsb"])[0], select_rows(["rte"])[0]
    assert format_prediction(stsb, {"value": 3.14159}, None) == "3.142"
    assert format_prediction(stsb, {"value": -0.4}, None) == "0.000"
    assert format_prediction(stsb, {"value": 5.7}, None) == "5.000"
    assert format_prediction(rte, {"label": "not_entailment"}, TASKS["rte"].labels) == "not_entailment"
    with pytest.raises(DataError, match="not one of"):
        format_prediction(rte, {"label": "neutral"}, TASKS["rte"].labels)
    path = tmp_path / "RTE.tsv"
    write_submission(path, ["0", "1"], ["entailment", "not_entailment"])
    assert path.read_text(encoding="utf-8") == "index\tprediction\n0\tentailment\n1\tnot_entailment\n"
    with pytest.raises(ValueError):
        write_submission(path, ["0"], ["entailment", "not_entailment"])


def test_glue_row_collapse_is_marked_in_the_table_and_the_json(tmp_path):
    from bertforge.metrics.classification import prediction_collapse
    from bertforge.training.glue import GLUE_ROWS, GlueResult, GlueRowResult

    mrpc = next(row for row in GLUE_ROWS if row.name == "MRPC")
    collapsed = GlueRowResult(mrpc, metrics={"f1": 0.812, "accuracy": 0.684}, submission=tmp_path / "MRPC.tsv",
                              test_rows=1725)
    collapsed.notes.append(f"dev: {prediction_collapse(['1'] * 408)}")
    healthy = GlueRowResult(next(row for row in GLUE_ROWS if row.name == "RTE"), metrics={"accuracy": 0.6})
    result = GlueResult([collapsed, healthy], tmp_path, tmp_path / "submission", tmp_path)
    table = result.table()
    line = next(text for text in table.splitlines() if text.startswith("MRPC"))
    assert "81.2/68.4" in line and "COLLAPSED" in line and "do not submit" in line
    assert "COLLAPSED" not in next(text for text in table.splitlines() if text.startswith("RTE"))
    rows = {row["task"]: row for row in result.to_dict()["rows"]}
    assert rows["MRPC"]["collapsed"] is True and "collapsed to one class" in rows["MRPC"]["notes"][0]
    assert rows["RTE"]["collapsed"] is False
