"""A ModernBERT directory fine-tuned for question answering and for multiple choice through the CLI, end to end:
`bertforge finetune --format qa|choice` from a tiny random ModernBERT masked LM (a byte-level BPE tokenizer.json
trained here) on the hand-made data of BERT's family tests (tests/e2e/test_finetune_families.py), then
`bertforge evaluate`, `bertforge predict --task answer|choose` and the server (`POST /v1/answer|choose`) on the
result, which must agree (the one path of tests/e2e/test_one_path.py), as do `predict` at int8 and on ONNX
Runtime within the engine tests' budgets; and the saved directory loads in transformers with the same scores.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from tests.e2e.test_finetune_families import POSITIVE, squad_file
from tests.e2e.test_modernbert_directory import tiny_modernbert
from tests.e2e.test_one_path import SCORE_TOLERANCE, close, evaluate_records, predict_results, served_results
from tests.unit.test_engine import TOLERANCES

from bertforge.cli import main
from bertforge.families.multiple_choice import ModernBertForMultipleChoice
from bertforge.families.question_answering import ModernBertForQuestionAnswering

transformers = pytest.importorskip("transformers")


def finetune(tmp_path, *flags: str) -> dict:
    """`bertforge finetune` from the tiny ModernBERT at tmp_path/base into tmp_path/ft; its eval results."""
    assert main(["finetune", "--model", str(tmp_path / "base"), "--out", str(tmp_path / "ft"), "--batch-size", "8",
                 "--device", "cpu", "--progress=false", *flags]) == 0
    return json.loads((tmp_path / "ft" / "eval_results.json").read_text())


def predicted_on_engines(directory, task: str, root) -> dict[tuple[str, str], list[dict]]:
    """`bertforge predict` of root/inputs.jsonl (what `predict_results` wrote) at int8 on torch and on ONNX
    Runtime at fp32 (the exported graph of the span or choice head)."""
    answers = {}
    for engine, precision in (("torch", "int8"), ("onnxruntime", "fp32")):
        sink = root / f"{task}-{engine}-{precision}.jsonl"
        assert main(["predict", "--model", str(directory), "--task", task, "--input", str(root / "inputs.jsonl"),
                     "--output", str(sink), "--device", "cpu", "--engine", engine, "--precision", precision]) == 0
        answers[engine, precision] = [json.loads(line) for line in sink.read_text().splitlines()]
    return answers


def test_modernbert_directory_finetunes_answers_and_serves_question_answering(tmp_path, monkeypatch):
    squad_file(tmp_path / "train.json", 0)
    squad_file(tmp_path / "dev.json", 1)
    texts = [p["context"] + " " + q["question"] for a in json.loads((tmp_path / "train.json").read_text())["data"]
             for p in a["paragraphs"] for q in p["qas"]]
    tokenizer = tiny_modernbert(tmp_path / "base", texts)
    results = finetune(tmp_path, "--format", "qa", "--train", str(tmp_path / "train.json"), "--dev",
                       str(tmp_path / "dev.json"), "--max-seq-length", "48", "--doc-stride", "16", "--epochs", "8",
                       "--lr", "3e-3")
    best = tmp_path / "ft" / "best"
    saved = json.loads((best / "config.json").read_text())
    assert saved["model_type"] == "modernbert" and saved["architectures"] == ["ModernBertForQuestionAnswering"]
    assert saved["num_labels"] == 2 and "id2label" not in saved
    assert set(results["best_metrics"]) == {"exact_match", "f1"}

    evaluated = evaluate_records(best, tmp_path / "dev.json", tmp_path / "eval")
    dev = json.loads((tmp_path / "dev.json").read_text())["data"]
    inputs = [{"id": q["id"], "question": q["question"], "context": p["context"]}
              for a in dev for p in a["paragraphs"] for q in p["qas"]]
    predicted = predict_results(best, "answer", inputs, tmp_path)
    served = served_results(best, "answer", [{k: q[k] for k in ("question", "context")} for q in inputs])
    assert len(evaluated) == len(predicted) == len(served) == len(inputs) == 12
    for e, p, s, question in zip(evaluated, predicted, served, inputs, strict=True):
        assert e["id"] == p["id"] == question["id"]
        assert (e["answer"], e["start"], e["end"]) == (p["answer"], p["start"], p["end"]) == \
            (s["answer"], s["start"], s["end"])
        assert question["context"][p["start"]:p["end"]] == p["answer"]  # character offsets of the context
        assert abs(e["probability"] - p["probability"]) <= SCORE_TOLERANCE
        assert abs(e["probability"] - s["probability"]) <= SCORE_TOLERANCE
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path / "cache"))
    for (engine, precision), answers in predicted_on_engines(best, "answer", tmp_path).items():
        if precision == "fp32":
            assert [(a["answer"], a["start"]) for a in answers] == [(p["answer"], p["start"]) for p in predicted]
        assert max(abs(a["probability"] - p["probability"]) for a, p in zip(answers, predicted, strict=True)) <= \
            TOLERANCES[precision], engine
    # It learned the task: the place after "lives in" (BERT's test asks the same of its tiny model).
    scored = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert scored["data_report"]["counts"]["windowed_inputs"] > 0  # contexts longer than the 48-token window
    assert scored["metrics"]["f1"] >= 0.5, scored["metrics"]

    # The fine-tuned directory loads in transformers with the same start and end scores at the real tokens.
    theirs = transformers.AutoModelForQuestionAnswering.from_pretrained(best).eval()
    ours = ModernBertForQuestionAnswering.from_pretrained(best, fast_path=False)
    ids = torch.tensor([tokenizer.encode(inputs[0]["question"], inputs[0]["context"]).ids[:48]])
    with torch.no_grad():
        mine, reference = ours(ids), theirs(input_ids=ids)
    np.testing.assert_allclose(mine.start_logits.numpy(), reference.start_logits.numpy(), atol=1e-5)
    np.testing.assert_allclose(mine.end_logits.numpy(), reference.end_logits.numpy(), atol=1e-5)


def test_modernbert_directory_finetunes_chooses_and_serves_multiple_choice(tmp_path, monkeypatch):
    rng = random.Random(0)
    rows = ["sent1,sent2,ending0,ending1,label"]
    for _ in range(24):
        word = rng.choice(POSITIVE)
        right = rng.randint(0, 1)
        endings = ["it was awful .", f"it was {word} ."] if right else [f"it was {word} .", "it was awful ."]
        rows.append(f"the film was {word} .,then,{endings[0]},{endings[1]},{right}")
    (tmp_path / "swag.csv").write_text("\n".join(rows) + "\n")
    tokenizer = tiny_modernbert(tmp_path / "base", [row.replace(",", " ") for row in rows[1:]],
                                classifier_pooling="mean")
    results = finetune(tmp_path, "--format", "choice", "--train", str(tmp_path / "swag.csv"), "--dev",
                       str(tmp_path / "swag.csv"), "--steps", "3", "--max-seq-length", "32")
    assert set(results["best_metrics"]) == {"accuracy"}
    best = tmp_path / "ft" / "best"
    saved = json.loads((best / "config.json").read_text())
    assert saved["model_type"] == "modernbert" and saved["architectures"] == ["ModernBertForMultipleChoice"]
    assert saved["classifier_pooling"] == "mean"

    evaluated = evaluate_records(best, tmp_path / "swag.csv", tmp_path / "eval")
    inputs = [{"context": row.split(",")[0], "start": "then", "endings": row.split(",")[2:4]} for row in rows[1:]]
    predicted = predict_results(best, "choose", inputs, tmp_path)
    served = served_results(best, "choose", inputs)
    assert len(evaluated) == len(predicted) == len(served) == 24
    for e, p, s in zip(evaluated, predicted, served, strict=True):
        assert e["choice"] == p["choice"] == s["choice"] and len(p["scores"]) == 2
        assert close(e["scores"], p["scores"]) and close(e["scores"], s["scores"])
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path / "cache"))
    for (engine, precision), answers in predicted_on_engines(best, "choose", tmp_path).items():
        got, expected = np.array([a["scores"] for a in answers]), np.array([p["scores"] for p in predicted])
        assert np.abs(got - expected).max() <= TOLERANCES[precision], engine

    # The scores are the saved model's own, and transformers' on the same directory: softmax over the choices of
    # [CLS] context [SEP] start ending [SEP], one row per ending.
    question = inputs[0]
    rows_ids = [tokenizer.encode(question["context"], f"then {ending}").ids for ending in question["endings"]]
    width = max(map(len, rows_ids))
    ids = torch.tensor([[row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows_ids]])  # [1, 2, T]
    mask = torch.tensor([[[1] * len(row) + [0] * (width - len(row)) for row in rows_ids]])
    ours = ModernBertForMultipleChoice.from_pretrained(best, fast_path=False)
    theirs = transformers.AutoModelForMultipleChoice.from_pretrained(best).eval()
    with torch.no_grad():
        mine = ours(ids, attention_mask=mask).logits.softmax(-1)[0].numpy()
        reference = theirs(input_ids=ids, attention_mask=mask).logits.softmax(-1)[0].numpy()
    np.testing.assert_allclose(mine, reference, atol=1e-5)
    np.testing.assert_allclose(predicted[0]["scores"], mine, atol=1e-5)


def test_modernbert_answers_a_long_context_in_one_window_of_its_own_length(tmp_path):
    """A question-answering directory without a fine-tuning record (as transformers saves one): BERT's window
    is 384 tokens, a ModernBERT's its own positions (here 2,048), so a context past 512 tokens is one window
    (the windowing rule unchanged: a longer one is still cut into windows of that length)."""
    from bertforge.inference.pipelines import load_pipeline

    sentence = "john lives in paris and mary works in london near the river bank"
    tokenizer = tiny_modernbert(tmp_path, [sentence], cls=ModernBertForQuestionAnswering,
                                max_position_embeddings=2048)
    pipeline = load_pipeline(tmp_path, "answer")
    assert pipeline.max_length == 2048
    question = {"question": "where does john live ?", "context": " ".join([sentence] * 50)}
    assert 512 < len(tokenizer.encode(question["context"]).ids) < 2048 - 16
    assert len(pipeline.features([pipeline.parse(question)])) == 1
    answer = pipeline(question)
    assert question["context"][answer["start"]:answer["end"]] == answer["answer"] != ""
