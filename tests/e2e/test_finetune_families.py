"""End to end: a tiny random BERT fine-tuned for a few steps on each task family, then `evaluate` on its artifact.

Each test writes a hand-made data set to a temporary directory, runs `run_finetuning` (seconds on a CPU),
checks the saved best model is a self-contained artifact (label names, task kind, tokenizer, how inputs were
built) and scores a file with `evaluate`, which writes predictions (JSONL) and metrics (JSON).
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from bertforge.checkpoint_format import load_model, read_config
from bertforge.errors import ConfigError, DataError
from bertforge.evaluation.saved_model import evaluate
from bertforge.families.classification import BertForSequenceClassification
from bertforge.model.bert import BertModel
from bertforge.model.config import BertConfig
from bertforge.tokenization import Tokenizer, TokenizerConfig, Vocab
from bertforge.training.finetune import run_finetuning
from bertforge.training.finetune_config import load_finetune_config
from bertforge.training.finetune_results import SeedsResult
from conftest import finetune_values

WORDS = ("the movie film was is good great fun bad awful boring john mary lives works in at paris london acme "
         "corp where does who what . , ? it ends starts then and he she").split()
TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s", "##ing", *"bcdefghijklmnopqrstuvwxyz",
          *"北京上海张三住在"]
POSITIVE, NEGATIVE = ("good", "great", "fun"), ("bad", "awful", "boring")


@pytest.fixture
def tiny_model(tmp_path):
    """A tiny random BERT model directory with a hand-made vocabulary."""
    tokenizer = Tokenizer(Vocab(TOKENS), TokenizerConfig())
    config = BertConfig.preset("tiny", vocab_size=len(TOKENS), max_position_embeddings=128)
    torch.manual_seed(0)
    path = tmp_path / "model"
    BertModel(config).save_pretrained(path, tokenizer=tokenizer)
    return path


def run(tiny_model, tmp_path, **fields) -> object:
    """A run from flat settings (`lr`, `max_seq_length`, ...), placed in their tables as the CLI places them."""
    defaults = {"model": str(tiny_model), "out_dir": str(tmp_path / "out"), "progress": False, "batch_size": 8,
                "eval_batch_size": 16, "lr": 1e-3, "log_every": 100, "device": "cpu"}
    return run_finetuning(load_finetune_config(values=finetune_values(**{**defaults, **fields})))


def assert_artifact(result, architecture: str) -> dict:
    config = json.loads((result.model_dir / "config.json").read_text())
    assert config["architectures"] == [architecture]
    assert (result.model_dir / "vocab.txt").exists() and (result.model_dir / "tokenizer_config.json").exists()
    assert (result.out_dir / "eval_results.json").exists()
    assert (result.out_dir / "dev_predictions.jsonl").exists()
    return config


def sentiment_rows(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        positive = rng.random() < 0.5
        word = rng.choice(POSITIVE if positive else NEGATIVE)
        rows.append(f"the {rng.choice(['movie', 'film'])} was {word}\t{'pos' if positive else 'neg'}")
    return rows


def test_finetune_classification_learns_and_evaluates(tiny_model, tmp_path):
    (tmp_path / "train.tsv").write_text("text_a\tlabel\n" + "\n".join(sentiment_rows(96, 0)) + "\n")
    (tmp_path / "dev.tsv").write_text("text_a\tlabel\n" + "\n".join(sentiment_rows(32, 1)) + "\n")
    result = run(tiny_model, tmp_path, format="classification", train=str(tmp_path / "train.tsv"),
                 dev=str(tmp_path / "dev.tsv"), epochs=4)
    config = assert_artifact(result, "BertForSequenceClassification")
    assert config["id2label"] == {"0": "neg", "1": "pos"}
    assert len(result.history) == 4 and result.history[-1]["step"] == 48
    assert result.best_metrics["accuracy"] >= 0.9
    scored = evaluate(result.model_dir, tmp_path / "dev.tsv", out_dir=tmp_path / "eval")
    assert scored.metrics["accuracy"] == pytest.approx(result.best_metrics["accuracy"])
    lines = (tmp_path / "eval" / "predictions.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    assert len(lines) == 32 and record["label"] in ("neg", "pos") and record["gold"] in ("neg", "pos")
    assert set(record["scores"]) == {"neg", "pos"} and record["score"] == pytest.approx(record["scores"][record["label"]])
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["metrics"]["accuracy"] >= 0.9


def test_finetune_classification_windows_long_inputs(tiny_model, tmp_path):
    long_text = " ".join(["the film was good"] * 20)  # 80 tokens: windowed at max_seq_length 40
    rows = [f"{long_text}\tpos", "the film was bad\tneg"] * 8
    (tmp_path / "train.tsv").write_text("text_a\tlabel\n" + "\n".join(rows) + "\n")
    result = run(tiny_model, tmp_path, format="classification", train=str(tmp_path / "train.tsv"),
                 dev=str(tmp_path / "train.tsv"), max_seq_length=40, steps=2)
    assert result.data_report["counts"]["train.windowed_inputs"] == 8
    predictions = [json.loads(line) for line in (result.out_dir / "dev_predictions.jsonl").read_text().splitlines()]
    assert [p["windows"] for p in predictions[:2]] == [4, 1]  # windows of 38 tokens every 19


def test_finetune_regression_stores_problem_type(tiny_model, tmp_path):
    rng = random.Random(0)
    rows = ["sentence1\tsentence2\tscore"]
    for _ in range(40):
        a, b = rng.choice(POSITIVE + NEGATIVE), rng.choice(POSITIVE + NEGATIVE)
        rows.append(f"it was {a}\tit was {b}\t{5.0 if a == b else rng.uniform(0, 2):.2f}")
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    result = run(tiny_model, tmp_path, format="regression", train=str(tmp_path / "train.tsv"),
                 dev=str(tmp_path / "train.tsv"), text_a_column="sentence1", text_b_column="sentence2",
                 label_column="-1", steps=3)
    config = assert_artifact(result, "BertForSequenceClassification")
    assert config["problem_type"] == "regression" and config["num_labels"] == 1
    assert set(result.best_metrics) == {"pearson", "spearman"}
    scored = evaluate(result.model_dir, tmp_path / "train.tsv", out_dir=tmp_path / "eval")
    record = scored.predictions[0]
    assert isinstance(record["value"], float) and isinstance(record["gold"], float) and record["windows"] == 1
    # Overrides of parts of the stored task description; an unknown part or key is an error naming it.
    limited = evaluate(result.model_dir, tmp_path / "train.tsv", out_dir=tmp_path / "eval-5", limit=5,
                       overrides={"inputs": {"max_seq_length": 32}})
    assert len(limited.predictions) == 5
    with pytest.raises(ConfigError, match=r"unknown setting 'dev_limits'"):
        evaluate(result.model_dir, tmp_path / "train.tsv", overrides={"dev_limits": 5})
    with pytest.raises(ConfigError, match=r"unknown key 'inputs.max_seq_lenght'"):
        evaluate(result.model_dir, tmp_path / "train.tsv", overrides={"inputs": {"max_seq_lenght": 32}})


def test_finetune_resume_keeps_the_best_and_its_predictions(tiny_model, tmp_path):
    # lr 1e-12: the weights barely move, so every evaluation scores the same and the first one stays the best
    # (a later one must be strictly better). The resumed run evaluates only step 3 but reports the run's every
    # evaluation; the best (step 1) came before the resume, so its predictions are rebuilt from the saved best
    # model.
    (tmp_path / "train.tsv").write_text("text_a\tlabel\n" + "\n".join(sentiment_rows(16, 0)) + "\n")
    common = {"format": "classification", "train": str(tmp_path / "train.tsv"), "dev": str(tmp_path / "train.tsv"),
              "lr": 1e-12, "eval_every": 1}
    first = run(tiny_model, tmp_path, steps=2, **common)
    assert first.best_step == 1 and [h["step"] for h in first.history] == [1, 2]
    resumed = run(tiny_model, tmp_path, steps=3, resume="auto", **common)
    assert [h["step"] for h in resumed.history] == [1, 2, 3] and resumed.history[:2] == first.history
    assert resumed.best_step == 1 and resumed.best_metrics == first.best_metrics
    predictions = (resumed.out_dir / "dev_predictions.jsonl").read_text().splitlines()
    assert len(predictions) == 16
    assert json.loads((resumed.out_dir / "eval_results.json").read_text())["best_step"] == 1


def ner_sentences(count: int, seed: int) -> str:
    rng = random.Random(seed)
    blocks = ["-DOCSTART- -X- -X- O", ""]
    for _ in range(count):
        person, place = rng.choice([("john", "B-PER"), ("mary", "B-PER")]), rng.choice(["paris", "london"])
        verb = rng.choice(["lives", "works"])
        lines = [f"{person[0]} NNP B-NP {person[1]}", f"{verb} VBZ B-VP O", "in IN B-PP O",
                 f"{place} NNP B-NP B-LOC", ". . O O"]
        if rng.random() < 0.5:
            lines[3:3] = ["at IN B-PP O", "acme NNP B-NP B-ORG", "corp NNP I-NP I-ORG"]
        blocks += lines + [""]
    return "\n".join(blocks)


def test_finetune_ner_entities_with_character_offsets(tiny_model, tmp_path):
    (tmp_path / "train.txt").write_text(ner_sentences(48, 0))
    (tmp_path / "dev.txt").write_text(ner_sentences(16, 1))
    result = run(tiny_model, tmp_path, format="ner", train=str(tmp_path / "train.txt"), dev=str(tmp_path / "dev.txt"),
                 epochs=6, lr=3e-3)
    config = assert_artifact(result, "BertForTokenClassification")
    assert config["id2label"]["0"] == "O" and "B-PER" in config["id2label"].values()
    assert result.best_metrics["f1"] > 0.5
    scored = evaluate(result.model_dir, tmp_path / "dev.txt", out_dir=tmp_path / "eval")
    record = scored.predictions[0]
    for entity in record["entities"]:
        assert record["text"][entity["start"]:entity["end"]] == entity["text"]
    assert "per_type" in scored.details


def test_finetune_ner_iobes_labels_decode_to_bio(tiny_model, tmp_path):
    (tmp_path / "train.txt").write_text(ner_sentences(16, 0))
    result = run(tiny_model, tmp_path, format="ner", train=str(tmp_path / "train.txt"), dev=str(tmp_path / "train.txt"),
                 tag_scheme="IOBES", steps=2)
    config = json.loads((result.model_dir / "config.json").read_text())
    assert "S-PER" in config["id2label"].values() and "E-ORG" in config["id2label"].values()
    tags = {tag for line in (result.out_dir / "dev_predictions.jsonl").read_text().splitlines()
            for tag in json.loads(line)["tags"]}
    assert not {tag[:2] for tag in tags} & {"S-", "E-"}


def squad_file(path, seed: int, impossible: bool = False) -> None:
    rng = random.Random(seed)
    articles = []
    for a in range(4):
        paragraphs = []
        for p in range(3):
            person, place = rng.choice(["john", "mary"]), rng.choice(["paris", "london"])
            filler = " ".join(["the film was good ."] * rng.randint(0, 12))
            context = f"{filler} {person} lives in {place} . {filler}".strip()
            start = context.index(f"{person} lives in {place}") + len(f"{person} lives in ")
            qas = [{"id": f"q{a}-{p}", "question": f"where does {person} live ?",
                    "answers": [{"text": place, "answer_start": start}]}]
            if impossible:
                qas.append({"id": f"q{a}-{p}-x", "question": "who works at acme ?", "answers": [],
                            "is_impossible": True})
            paragraphs.append({"context": context, "qas": qas})
        articles.append({"title": f"t{a}", "paragraphs": paragraphs})
    path.write_text(json.dumps({"version": "2.0" if impossible else "1.1", "data": articles}))


def test_finetune_qa_windows_and_answers(tiny_model, tmp_path):
    squad_file(tmp_path / "train.json", 0)
    squad_file(tmp_path / "dev.json", 1)
    result = run(tiny_model, tmp_path, format="qa", train=str(tmp_path / "train.json"), dev=str(tmp_path / "dev.json"),
                 max_seq_length=48, doc_stride=16, epochs=8, lr=3e-3)
    config = assert_artifact(result, "BertForQuestionAnswering")
    assert "id2label" not in config or config.get("problem_type") is None
    assert result.data_report["counts"]["train.windowed_inputs"] > 0
    assert set(result.best_metrics) == {"exact_match", "f1"}
    assert result.best_metrics["f1"] >= 0.5  # metrics.question_answering reports fractions (0.8, not 80.0)
    scored = evaluate(result.model_dir, tmp_path / "dev.json", out_dir=tmp_path / "eval")
    record = scored.predictions[0]
    assert record["id"] == "q0-0" and isinstance(record["prediction"], str) and record["nbest"]


def test_finetune_qa_version_2_null_answers(tiny_model, tmp_path):
    squad_file(tmp_path / "train.json", 0, impossible=True)
    result = run(tiny_model, tmp_path, format="qa", train=str(tmp_path / "train.json"),
                 dev=str(tmp_path / "train.json"), max_seq_length=64, steps=2)
    assert "HasAns_f1" in result.best_metrics and "NoAns_f1" in result.best_metrics
    record = json.loads((result.out_dir / "dev_predictions.jsonl").read_text().splitlines()[0])
    assert "null_margin" in record


def test_finetune_multiple_choice(tiny_model, tmp_path):
    rng = random.Random(0)
    rows = ["sent1,sent2,ending0,ending1,label"]
    for _ in range(24):
        word = rng.choice(POSITIVE)
        right = rng.randint(0, 1)
        endings = ["it was awful .", f"it was {word} ."] if right else [f"it was {word} .", "it was awful ."]
        rows.append(f"the film was {word} .,then,{endings[0]},{endings[1]},{right}")
    (tmp_path / "swag.csv").write_text("\n".join(rows) + "\n")
    result = run(tiny_model, tmp_path, format="choice", train=str(tmp_path / "swag.csv"),
                 dev=str(tmp_path / "swag.csv"), steps=3)
    assert_artifact(result, "BertForMultipleChoice")
    assert "accuracy" in result.best_metrics
    scored = evaluate(result.model_dir, tmp_path / "swag.csv", out_dir=tmp_path / "eval")
    assert len(scored.predictions[0]["scores"]) == 2


def test_finetune_feature_based_keeps_encoder_fixed(tiny_model, tmp_path):
    (tmp_path / "train.tsv").write_text("text_a\tlabel\n" + "\n".join(sentiment_rows(32, 0)) + "\n")
    result = run(tiny_model, tmp_path, format="classification", train=str(tmp_path / "train.tsv"),
                 dev=str(tmp_path / "train.tsv"), freeze_encoder=True, feature_layers=[-1, -2],
                 classifier_hidden_sizes=[16], steps=3)
    before = load_model(tiny_model, BertModel)[0].state_dict()
    after, report = load_model(result.model_dir, BertForSequenceClassification)
    assert not report.fresh  # the fine-tuned head is in the artifact, nothing re-initialised
    assert after.config.feature_layers == [-1, -2] and after.config.classifier_hidden_sizes == [16]
    for name, tensor in after.bert.state_dict().items():
        if not name.startswith("pooler."):
            torch.testing.assert_close(tensor, before[name], rtol=0, atol=0)
    stored, _ = read_config(result.model_dir)
    assert stored.freeze_encoder


def test_finetune_seeds_report_mean_and_std(tiny_model, tmp_path):
    (tmp_path / "train.tsv").write_text("text_a\tlabel\n" + "\n".join(sentiment_rows(16, 0)) + "\n")
    result = run(tiny_model, tmp_path, format="classification", train=str(tmp_path / "train.tsv"),
                 dev=str(tmp_path / "train.tsv"), steps=1, seeds=[1, 2])
    assert isinstance(result, SeedsResult)
    assert [run.seed for run in result.runs] == [1, 2]
    summary = json.loads((tmp_path / "out" / "seeds.json").read_text())
    assert summary["summary"]["accuracy"]["n"] == 2
    assert "±" in result.line()
    assert (tmp_path / "out" / "seed-1" / "best" / "config.json").exists()


def test_finetune_options_that_would_fail_later_fail_before_training(tiny_model, tmp_path):
    (tmp_path / "train.tsv").write_text("text_a\tlabel\n" + "\n".join(sentiment_rows(16, 0)) + "\n")
    common = {"format": "classification", "train": str(tmp_path / "train.tsv"), "steps": 2}
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"metric='bogus' is invalid: classification \(classification\) "
                       r"evaluations report \['accuracy', 'f1', 'precision', 'recall', 'macro_f1'"):
        run(tiny_model, tmp_path, dev=str(tmp_path / "train.tsv"), metric="bogus", **common)
    # No dev file: an error, not a best/ chosen by nothing.
    with pytest.raises(ConfigError, match=r"no dev file to evaluate on.*--no-dev"):
        run(tiny_model, tmp_path, **common)
    # A dev file whose every row is unusable (skipped): an error naming it.
    (tmp_path / "dev.tsv").write_text("text_a\tlabel\n\tpos\n\tneg\n")
    with pytest.raises(DataError, match=rf"{tmp_path / 'dev.tsv'}: no usable dev examples"):
        run(tiny_model, tmp_path, dev=str(tmp_path / "dev.tsv"), on_invalid="skip", **common)
    assert not out.exists()  # nothing was trained, nothing written

    # Explicitly without a dev set (data.dev = ""): trains, saves the final model, reports no metrics.
    result = run(tiny_model, tmp_path, dev="", **common)
    assert result.best_metrics == {} and result.history == [] and (result.model_dir / "config.json").exists()


def test_finetune_metric_outside_the_defaults_is_computed(tiny_model, tmp_path):
    (tmp_path / "train.tsv").write_text("text_a\tlabel\n" + "\n".join(sentiment_rows(16, 0)) + "\n")
    result = run(tiny_model, tmp_path, format="classification", train=str(tmp_path / "train.tsv"),
                 dev=str(tmp_path / "train.tsv"), steps=1, metric="macro_recall")
    assert result.metric == "macro_recall" and "macro_recall" in result.best_metrics
    assert "accuracy" in result.best_metrics  # the usual ones are still reported
    scored = evaluate(result.model_dir, tmp_path / "train.tsv", out_dir=tmp_path / "eval")
    assert scored.metrics["macro_recall"] == pytest.approx(result.best_metrics["macro_recall"])


def test_finetune_checkpoints_every_epoch_and_keeps_the_last_two(tiny_model, tmp_path):
    from bertforge.training.checkpoint import list_checkpoints

    (tmp_path / "train.tsv").write_text("text_a\tlabel\n" + "\n".join(sentiment_rows(16, 0)) + "\n")
    result = run(tiny_model, tmp_path, format="classification", train=str(tmp_path / "train.tsv"),
                 dev=str(tmp_path / "train.tsv"), epochs=3)  # 2 steps per epoch
    assert [s for s, _ in list_checkpoints(result.out_dir)] == [4, 6]
