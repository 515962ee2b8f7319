"""The ONNX Runtime column of the accuracy budget is scored on `bertforge evaluate`'s own path, by its ONNX Runtime
engine: at fp32 it gives evaluate's metrics (sentence pairs, tagging with a CRF, QA windows), and the SQuAD eval file
written for `evaluate` holds exactly the `squad` task's held-apart articles."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bertforge.configuration import shared_data_root
from bertforge.data.question_answering import article_split, count_articles, read_squad
from bertforge.evaluation.saved_model import evaluate
from bertforge.training.finetune import run_finetuning
from bertforge.training.finetune_config import load_finetune_config
from conftest import finetune_values

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from benchmarks.ort_int8_accuracy import ort_accuracy  # noqa: E402
from benchmarks.squad_article_split import split_part  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SQUAD = shared_data_root() / "squad_v1.1" / "dev-v1.1.json"


def finetune(model: Path, out: Path, **fields) -> Path:
    values = {"model": str(model), "out_dir": str(out), "progress": False, "batch_size": 4, "steps": 2,
              "device": "cpu", "max_seq_length": 48, "lr": 1e-3, "dev": "", "evaluate_test": False, **fields}
    return run_finetuning(load_finetune_config(values=finetune_values(**values))).model_dir


def ner_file(path: Path, count: int) -> Path:
    rng = random.Random(0)
    blocks = []
    for _ in range(count):
        who, town = rng.choice(["Ana", "Rui", "John"]), rng.choice(["Lisbon", "Porto", "London"])
        blocks += [f"{who} NNP B-NP B-PER", "lives VBZ B-VP O", "in IN B-PP O", f"{town} NNP B-NP B-LOC", ". . O O", ""]
    path.write_text("\n".join(blocks), encoding="utf-8")
    return path


def qa_file(path: Path) -> Path:
    context = "Ana lives in Lisbon and works in Porto. Rui lives in London, far from the sea, with his two cats."
    qas = [{"id": f"q{i}", "question": question, "answers": [{"text": answer, "answer_start": context.index(answer)}]}
           for i, (question, answer) in enumerate((("Where does Ana live?", "Lisbon"), ("Where does Ana work?", "Porto"),
                                                    ("Where does Rui live?", "London"), ("What does Rui have?", "two cats")))]
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": qas}]}]}), encoding="utf-8")
    return path


def close(ours, theirs) -> bool:
    """Equal, floats within 1e-4 (ONNX Runtime's fp32 graph is held to PyTorch at that bound)."""
    if isinstance(ours, float) and isinstance(theirs, float):
        return abs(ours - theirs) <= 1e-4
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return ours.keys() == theirs.keys() and all(close(ours[k], theirs[k]) for k in ours)
    if isinstance(ours, list) and isinstance(theirs, list):
        return len(ours) == len(theirs) and all(close(a, b) for a, b in zip(ours, theirs))
    return ours == theirs


def assert_ort_fp32_is_evaluate(model: Path, data: Path, tmp_path: Path) -> dict:
    expected = evaluate(model, data, out_dir=tmp_path / "eval", device="cpu")
    out = ort_accuracy(model, data, threads=1, torch_fp32=True, keep_predictions=True)
    assert out["metrics"]["bertforge fp32"] == expected.metrics  # the benchmark's path is evaluate's
    # Per example, what ORT fp32 decodes is what evaluate decodes (metrics of an untrained tiny model are too
    # ill-conditioned to compare: its scores differ in the fifth decimal).
    assert close(out["predictions"]["ORT fp32"], expected.predictions)
    assert out["metrics"]["ORT int8"].keys() == expected.metrics.keys()
    assert out["export"]["fused"]["Attention"] == 2  # the tiny model's layers: the optimizer fused each
    # The per-channel column is `bertforge evaluate --engine onnxruntime --precision int8` (its cached graph).
    engine_int8 = evaluate(model, data, out_dir=tmp_path / "ort-int8", device="cpu", engine="onnxruntime",
                           precision="int8", threads=1)
    assert engine_int8.metrics == out["metrics"]["ORT int8 per-channel"]
    return out


def test_ort_accuracy_sentence_pair_regression_scores_as_evaluate(tiny_minilm_model, tmp_path):
    model = finetune(tiny_minilm_model, tmp_path / "stsb", task="stsb", data_root=str(FIXTURES))
    out = assert_ort_fp32_is_evaluate(model, FIXTURES / "glue" / "STS-B" / "dev.tsv", tmp_path)
    assert set(out["metrics"]["ORT int8"]) == {"pearson", "spearman"}


def test_ort_accuracy_crf_tagger_scores_as_evaluate(tiny_minilm_model, tmp_path):
    data = ner_file(tmp_path / "ner.txt", 12)
    model = finetune(tiny_minilm_model, tmp_path / "ner", format="ner", train=str(data), crf=True)
    out = assert_ort_fp32_is_evaluate(model, data, tmp_path)
    assert out["examples"] == 12 and "f1" in out["metrics"]["ORT int8"]


def test_ort_accuracy_qa_windows_score_as_evaluate(tiny_minilm_model, tmp_path):
    data = qa_file(tmp_path / "qa.json")
    # A 32-token window with stride 8 splits the context: several windows per question, decoded together.
    model = finetune(tiny_minilm_model, tmp_path / "qa", format="qa", train=str(data), max_seq_length=32, doc_stride=8)
    out = assert_ort_fp32_is_evaluate(model, data, tmp_path)
    assert out["features"] > out["examples"] == 4
    assert set(out["metrics"]["ORT int8"]) >= {"exact_match", "f1"}


@pytest.mark.skipif(not SQUAD.exists(), reason="needs the shared SQuAD v1.1 dev file")
def test_squad_article_split_eval_part_is_the_task_eval_split():
    train_ids, eval_ids = article_split(count_articles(SQUAD))
    held = split_part(SQUAD, "eval")
    trained = split_part(SQUAD, "train")
    questions = [qa["id"] for article in held["data"] for p in article["paragraphs"] for qa in p["qas"]]
    assert questions == [e.qid for e in read_squad(SQUAD, articles=eval_ids)]
    assert len(held["data"]) == 12 and len(trained["data"]) == 36 and len(questions) == 2777
    contexts = {p["context"] for article in held["data"] for p in article["paragraphs"]}
    assert not contexts & {p["context"] for article in trained["data"] for p in article["paragraphs"]}
    assert split_part(SQUAD, "eval", articles=2)["data"] == held["data"][:2]  # a shorter run: whole articles


def test_squad_article_split_refuses_an_unknown_part():
    with pytest.raises(ValueError, match="part must be 'train' or 'eval'"):
        split_part(SQUAD, "dev")
