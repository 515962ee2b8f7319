"""`evaluate` predictions carry each row's id, so the predictions of a test file with withheld labels can be
submitted: the file's id column (GLUE's `index`, QQP's `id`, ChnSentiCorp's `qid`, or the one named), SQuAD's
question ids, else the row's "file:line"."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bertforge.cli import main
from bertforge.configuration import shared_data_root
from bertforge.data.classification import read_classification
from bertforge.data.multiple_choice import read_choice
from bertforge.errors import DataError
from bertforge.evaluation import example_id
from bertforge.evaluation.saved_model import evaluate
from bertforge.training.finetune import run_finetuning
from bertforge.training.finetune_config import DataConfig, load_finetune_config
from conftest import finetune_values

ROOT = Path(__file__).resolve().parents[2]
SST2 = ROOT / "tests" / "fixtures" / "glue" / "SST-2"
SQUAD = shared_data_root() / "squad_v1.1" / "dev-v1.1.json"


def finetune(model: Path, out: Path, **fields) -> Path:
    values = {"model": str(model), "out_dir": str(out), "progress": False, "batch_size": 4, "steps": 1,
              "device": "cpu", "max_seq_length": 48, **fields}
    return run_finetuning(load_finetune_config(values=finetune_values(**values))).model_dir


@pytest.fixture(scope="module")
def sst2_model(tiny_minilm_model, tmp_path_factory) -> Path:
    return finetune(tiny_minilm_model, tmp_path_factory.mktemp("sst2"), format="classification",
                    train=str(SST2 / "train.tsv"), dev=str(SST2 / "dev.tsv"), text_a_column="sentence",
                    label_column="label")


def tsv_column(path: Path, name: str) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    index = lines[0].split("\t").index(name)
    return [line.split("\t")[index] for line in lines[1:] if line.strip()]


def test_evaluate_test_file_predictions_carry_its_index_column(sst2_model, tmp_path, capsys):
    assert main(["evaluate", "--model", str(sst2_model), "--data", str(SST2 / "test.tsv"), "--unlabelled",
                 "--out", str(tmp_path / "test"), "--device", "cpu"]) == 0
    records = [json.loads(line) for line in (tmp_path / "test" / "predictions.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == tsv_column(SST2 / "test.tsv", "index") == ["0", "1", "2", "3", "4"]
    assert all(r["label"] in ("0", "1") for r in records)


def test_evaluate_rows_without_an_id_column_carry_file_and_line(sst2_model, tmp_path):
    result = evaluate(sst2_model, SST2 / "dev.tsv", out_dir=tmp_path / "dev")
    assert [r["id"] for r in result.predictions] == [f"{SST2 / 'dev.tsv'}:{line}" for line in range(2, 8)]
    assert "accuracy" in result.metrics


@pytest.mark.skipif("id_column" not in {f.name for f in dataclasses.fields(DataConfig)},
                    reason="needs the [data] id_column setting in training/finetuning.py (see the report)")
def test_evaluate_id_column_names_the_column_to_take(sst2_model, tmp_path):
    table = tmp_path / "reviews.tsv"
    table.write_text("sentence\treview_no\tlabel\nfine film\tr-17\t1\ndull film\tr-18\t0\n", encoding="utf-8")
    assert main(["evaluate", "--model", str(sst2_model), "--data", str(table), "--id-column", "review_no",
                 "--out", str(tmp_path / "ev"), "--device", "cpu"]) == 0
    records = [json.loads(line) for line in (tmp_path / "ev" / "predictions.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["r-17", "r-18"]


def squad_slice(path: Path) -> list[str]:
    """Two paragraphs of the real SQuAD v1.1 dev file (a generated pair where the shared data is absent)."""
    if SQUAD.exists():
        article = json.loads(SQUAD.read_text(encoding="utf-8"))["data"][0]
        article = {**article, "paragraphs": article["paragraphs"][:2]}
    else:
        context = "Ana lives in Lisbon. Rui lives in Porto."
        qas = [{"id": f"q{i}", "question": f"Where does {who} live?",
                "answers": [{"text": town, "answer_start": context.index(town)}]}
               for i, (who, town) in enumerate((("Ana", "Lisbon"), ("Rui", "Porto")))]
        article = {"title": "t", "paragraphs": [{"context": context, "qas": qas}]}
    path.write_text(json.dumps({"version": "1.1", "data": [article]}), encoding="utf-8")
    return [qa["id"] for paragraph in article["paragraphs"] for qa in paragraph["qas"]]


def test_evaluate_squad_predictions_carry_the_question_ids(tiny_minilm_model, tmp_path):
    qids = squad_slice(tmp_path / "squad.json")
    model = finetune(tiny_minilm_model, tmp_path / "qa", format="qa", train=str(tmp_path / "squad.json"),
                     dev=str(tmp_path / "squad.json"), max_seq_length=64, doc_stride=32)
    result = evaluate(model, tmp_path / "squad.json", out_dir=tmp_path / "eval", labelled=False)
    assert [r["id"] for r in result.predictions] == qids and len(qids) >= 2
    on_disk = [json.loads(line)["id"] for line in (tmp_path / "eval" / "predictions.jsonl").read_text().splitlines()]
    assert on_disk == qids


def test_read_classification_id_from_a_known_header_column_or_the_one_named(tmp_path):
    senti = tmp_path / "senti.tsv"
    senti.write_text("qid\tlabel\ttext_a\n7\t1\t好\n8\t0\t差\n", encoding="utf-8")
    assert [e.id for e in read_classification(senti, text_a="text_a", label="label")] == ["7", "8"]
    headerless = tmp_path / "cola.tsv"
    headerless.write_text("gj04\t1\t*\tBill left.\ngj05\t0\t*\tLeft Bill the.\n", encoding="utf-8")
    assert [e.id for e in read_classification(headerless, text_a=3, label=1)] == \
        [f"{headerless}:1", f"{headerless}:2"]
    assert [e.id for e in read_classification(headerless, text_a=3, label=1, id_column=0)] == ["gj04", "gj05"]
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"id": 31, "text": "a"}\n{"text": "b"}\n', encoding="utf-8")
    assert [e.id for e in read_classification(rows, text_a="text")] == ["31", f"{rows}:2"]
    with pytest.raises(DataError, match="no column named 'ref' for id"):
        read_classification(senti, text_a="text_a", id_column="ref")


def test_read_choice_ids_from_swags_unnamed_first_column(tmp_path):
    swag = tmp_path / "val.csv"
    swag.write_text(",video-id,sent1,sent2,ending0,ending1,label\n"
                    "0,lsmdc1,She opened it.,Then,it rained.,it shone.,0\n"
                    "1,lsmdc2,He sat.,Then,he slept.,he ran.,1\n", encoding="utf-8")
    examples = read_choice(swag)
    assert [e.id for e in examples] == ["0", "1"] and [example_id(e) for e in examples] == ["0", "1"]


def test_example_id_falls_back_to_the_source_of_a_tagged_sentence(tmp_path):
    from bertforge.data.tagging import read_tagged

    conll = tmp_path / "ner.txt"
    conll.write_text("-DOCSTART- O\n\nAna B-PER\nsmiles O\n\nRui B-PER\n", encoding="utf-8")
    assert [example_id(e) for e in read_tagged(conll)] == [f"{conll}:3", f"{conll}:6"]
