"""`bertforge glue` end to end: fine-tune and evaluate every GLUE task present under the data root (the
official layouts in tests/fixtures/glue/), print the paper's table and write the leaderboard's submission
folder — one `<TASK>.tsv` per task, header `index<TAB>prediction`, one line per test row with the row's id,
the labels as GLUE writes them.

The model is a tiny random BERT with the vocabulary of the bundled MiniLM checkpoint: the claim is that the
files are read, trained on, scored and written, not that the model learns. The slow variant runs the real
GLUE files in ../shared/data with a few hundred examples per task.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bertforge.cli import main
from bertforge.configuration import shared_data_root
from bertforge.families.tasks import TASKS
from bertforge.training.glue import GLUE_ROWS, find_test_file, read_test_ids

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BINARY = {"0", "1"}
NLI2 = {"entailment", "not_entailment"}
NLI3 = {"entailment", "neutral", "contradiction"}
LABELS = {"CoLA": BINARY, "SST-2": BINARY, "MRPC": BINARY, "QQP": BINARY, "WNLI": BINARY, "RTE": NLI2,
          "QNLI": NLI2, "MNLI-m": NLI3, "MNLI-mm": NLI3, "AX": NLI3, "STS-B": None}
METRICS = {"MNLI-m": "accuracy", "MNLI-mm": "accuracy", "QQP": "F1/accuracy", "QNLI": "accuracy",
           "SST-2": "accuracy", "CoLA": "MCC", "STS-B": "Pearson/Spearman", "MRPC": "F1/accuracy",
           "RTE": "accuracy", "WNLI": "accuracy"}


@pytest.fixture(scope="module")
def tiny_model(tiny_minilm_model) -> Path:
    return tiny_minilm_model


def glue(model: Path, root: Path, out: Path, *extra: str) -> int:
    return main(["glue", "--model", str(model), "--data-root", str(root), "--out", str(out), "--epochs", "1",
                 "--train-limit", "8", "--batch-size", "4", "--max-seq-length", "48", "--device", "cpu",
                 "--precision", "fp32", *extra])


def table_rows(printed: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in printed.splitlines() if line.strip()}


def check_submission(path: Path, test: Path, index_column: str, labels: set[str] | None) -> int:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "index\tprediction"
    rows = [line.split("\t") for line in lines[1:]]
    assert all(len(row) == 2 for row in rows)
    assert [row[0] for row in rows] == read_test_ids(test, index_column)
    for _, prediction in rows:
        if labels is None:
            assert 0.0 <= float(prediction) <= 5.0 and len(prediction.split(".")[1]) == 3
        else:
            assert prediction in labels, (path.name, prediction)
    return len(rows)


def test_glue_on_every_task_in_the_official_layouts(tiny_model, tmp_path, capsys):
    out = tmp_path / "glue"
    assert glue(tiny_model, FIXTURES, out) == 0
    printed = capsys.readouterr().out
    rows = table_rows(printed)
    assert printed.splitlines()[0].split()[:3] == ["task", "metric", "dev"]
    for name, metric in METRICS.items():
        row = rows[name]
        assert row[1] == metric, row
        scores = row[2].split("/")
        assert len(scores) == len(metric.split("/")) and all(-100 <= float(s) <= 100 for s in scores), row
        assert row[3] == f"{name}.tsv"
    assert rows["AX"][1:4] == ["-", "-", "AX.tsv"]
    assert "average" in rows and "QQP: train: 1 rows skipped (column_count)" in printed

    submission = out / "submission"
    assert sorted(p.name for p in submission.iterdir()) == sorted(f"{row.name}.tsv" for row in GLUE_ROWS)
    for row in GLUE_ROWS:
        test = find_test_file(row, FIXTURES)
        count = check_submission(submission / f"{row.name}.tsv", test, row.index_column, LABELS[row.name])
        assert f"{row.name}.tsv ({count} rows)" in printed
        body = [line for line in test.read_text(encoding="utf-8-sig").splitlines() if line.strip()]
        assert count == len(body) - 1  # every test row but the header

    results = json.loads((out / "glue_results.json").read_text(encoding="utf-8"))
    by_name = {row["task"]: row for row in results["rows"]}
    assert set(by_name["MRPC"]["metrics"]) >= {"f1", "accuracy"} and by_name["AX"]["metrics"] == {}
    assert by_name["MNLI-m"]["model_dir"] == by_name["MNLI-mm"]["model_dir"] == by_name["AX"]["model_dir"]
    assert (out / "mnli" / "best" / "finetuning.json").is_file() and not (out / "mnli-mm").exists()
    assert (out / "glue_table.txt").read_text(encoding="utf-8").startswith("task")


def test_glue_skips_absent_tasks_saying_so_and_runs_the_chosen_ones(tiny_model, tmp_path, capsys):
    root = tmp_path / "data"
    for folder in ("RTE", "STS-B"):
        shutil.copytree(FIXTURES / "glue" / folder, root / "glue" / folder)
    (root / "glue" / "STS-B" / "test.tsv").unlink()
    out = tmp_path / "glue"
    assert glue(tiny_model, root, out, "--tasks", "rte,STS-B,mrpc,ax") == 0
    printed = capsys.readouterr().out
    rows = table_rows(printed)
    assert set(rows) == {"task", "RTE", "STS-B", "MRPC", "AX", "average", "submission:", "note:"}
    assert "skipped: glue/MRPC/train.tsv, glue/MRPC/dev.tsv not found" in printed
    assert "AX" in rows and "needs the mnli model" in printed
    assert "no test file" in printed and "note: STS-B: glue/STS-B/test.tsv not found" in printed
    assert sorted(p.name for p in (out / "submission").iterdir()) == ["RTE.tsv"]
    assert main(["glue", "--model", str(tiny_model), "--data-root", str(root), "--tasks", "sst3"]) == 2


@pytest.mark.slow
@pytest.mark.skipif(not (shared_data_root() / "glue").is_dir(), reason="the GLUE data is not present")
def test_glue_on_the_real_files(minilm_path, tmp_path, capsys):
    root = shared_data_root()
    out = tmp_path / "glue"
    assert main(["glue", "--model", str(minilm_path), "--data-root", str(root), "--out", str(out), "--epochs", "1",
                 "--train-limit", "300", "--dev-limit", "200", "--batch-size", "32", "--max-seq-length", "128",
                 "--device", "cpu", "--precision", "fp32"]) == 0
    printed = capsys.readouterr().out
    written = {p.stem for p in (out / "submission").iterdir()}
    for row in GLUE_ROWS:
        test = find_test_file(row, root)
        trained = (root / TASKS[row.task].train[0].path).is_file()
        if test is None or not trained:
            assert row.name not in written and (f"{row.name} " in printed)
            continue
        count = check_submission(out / "submission" / f"{row.name}.tsv", test, row.index_column, LABELS[row.name])
        assert count == len(read_test_ids(test, row.index_column)) > 100
    assert {"CoLA", "SST-2", "STS-B", "RTE", "WNLI"} <= written
    rows = table_rows(printed)
    assert float(rows["SST-2"][2]) > 50.0  # MiniLM on 300 reviews beats chance on SST-2's dev set
