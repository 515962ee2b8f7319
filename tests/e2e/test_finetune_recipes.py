"""Fine-tuning recipes of the classification family, end to end on a tiny random BERT: multi-label files with
tuned thresholds stored with the model (and applied by evaluate and predict alike), class weights and focal
loss, and the errors each recipe gives for options that cannot work."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from bertforge.checkpoint_format import read_config
from bertforge.data.classification import read_classification
from bertforge.data.finetuning import DataReport
from bertforge.errors import ConfigError, DataError
from bertforge.evaluation.saved_model import evaluate
from bertforge.families.base import LossSettings, label_loss, symmetric_kl
from bertforge.families.classification import FAMILY, ClassificationObjective, decision_thresholds
from bertforge.inference.pipelines import load_pipeline
from bertforge.metrics.classification import multi_label_metrics, per_class_scores, tune_thresholds
from bertforge.model.bert import BertModel
from bertforge.model.config import BertConfig
from bertforge.tokenization import Tokenizer, TokenizerConfig, Vocab
from bertforge.training.finetune import run_finetuning
from bertforge.training.finetune_config import load_finetune_config
from conftest import finetune_values

COLOURS = ("red", "blue", "green")
FILLER = "the a car house tree sky is was and with".split()
TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *COLOURS, *FILLER]


@pytest.fixture
def tiny_model(tmp_path):
    tokenizer = Tokenizer(Vocab(TOKENS), TokenizerConfig())
    config = BertConfig.preset("tiny", vocab_size=len(TOKENS), max_position_embeddings=64)
    torch.manual_seed(0)
    path = tmp_path / "model"
    BertModel(config).save_pretrained(path, tokenizer=tokenizer)
    return path


def colour_rows(count: int, seed: int) -> list[dict]:
    """Sentences naming some colours; the labels are the colours named (0 to 3 of them)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        named = [c for c in COLOURS if rng.random() < 0.4]
        words = [*named, *rng.sample(FILLER, 4)]
        rng.shuffle(words)
        rows.append({"text": " ".join(words), "labels": named})
    return rows


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def run(tiny_model, tmp_path, **fields):
    defaults = {"model": str(tiny_model), "out_dir": str(tmp_path / "out"), "progress": False, "batch_size": 16,
                "eval_batch_size": 32, "lr": 2e-3, "log_every": 100, "device": "cpu"}
    return run_finetuning(load_finetune_config(values=finetune_values(**{**defaults, **fields})))


# --- reading ----------------------------------------------------------------------------------------------

def test_read_classification_multi_label_jsonl_lists_and_separated_cells(tmp_path):
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text('\ufeff{"text": "x", "labels": ["PER", "LOC", "PER"]}\n{"text": "y", "labels": []}\n',
                     encoding="utf-8")
    report = DataReport()
    examples = read_classification(jsonl, text_a="text", label="labels", multi_label=True, report=report)
    assert [e.label for e in examples] == [("PER", "LOC"), ()]
    assert report["rows_without_labels"] == 1
    tsv = tmp_path / "a.tsv"
    tsv.write_text("text\tlabels\nx\tPER|ORG\ny\t\n", encoding="utf-8")
    examples = read_classification(tsv, text_a="text", label="labels", multi_label=True, label_separator="|")
    assert [e.label for e in examples] == [("PER", "ORG"), ()]


def test_read_classification_multi_label_bad_cell_names_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "x", "labels": ["PER"]}\n{"text": "y", "labels": [{"a": 1}]}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.jsonl:2.*list holds label names"):
        read_classification(path, text_a="text", label="labels", multi_label=True)


# --- metrics and thresholds -------------------------------------------------------------------------------

def test_multi_label_metrics_micro_macro_by_hand():
    predicted = [[True, False], [True, True], [False, False]]
    gold = [[True, False], [False, True], [False, True]]
    metrics, per_label = multi_label_metrics(predicted, gold, ["A", "B"])
    # A: tp 1, predicted 2, gold 1 -> p 0.5 r 1 f1 2/3; B: tp 1, predicted 1, gold 2 -> p 1 r 0.5 f1 2/3.
    assert per_label["A"] == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1})
    assert metrics["macro_f1"] == pytest.approx(2 / 3)
    assert metrics["micro_precision"] == pytest.approx(2 / 3) and metrics["micro_recall"] == pytest.approx(2 / 3)
    assert metrics["subset_accuracy"] == pytest.approx(1 / 3)


def test_tune_thresholds_global_and_per_label_find_the_best_cut():
    scores = [[0.9, 0.30], [0.2, 0.35], [0.8, 0.10], [0.1, 0.05]]
    gold = [[True, True], [False, True], [True, False], [False, False]]
    (global_cut,) = tune_thresholds(scores, gold)
    decided = [[s >= global_cut for s in row] for row in scores]
    assert decided == gold  # 0.3 separates both labels, and it is the grid value nearest 0.5 that does
    assert global_cut == pytest.approx(0.3)
    per = tune_thresholds(scores, gold, per_label=True)
    assert per[0] == pytest.approx(0.5) and 0.10 < per[1] <= 0.30  # label A: every cut in (0.2, 0.8] ties


def test_per_class_scores_show_a_rare_class_ignored():
    scores = per_class_scores(["a"] * 10, ["a"] * 9 + ["b"], ["a", "b"])
    assert scores["b"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert scores["a"]["recall"] == 1.0


def test_decision_thresholds_override_stored_default():
    config = BertConfig.preset("tiny").with_labels(["A", "B", "C"], "multi_label_classification")
    assert decision_thresholds(config, None) == [0.5, 0.5, 0.5]
    assert decision_thresholds(config.replace(label_thresholds=[0.2]), None) == [0.2, 0.2, 0.2]
    assert decision_thresholds(config.replace(label_thresholds=[0.1, 0.2, 0.3]), 0.7) == [0.7, 0.7, 0.7]


# --- losses -----------------------------------------------------------------------------------------------

def test_label_loss_weights_and_focal_match_hand_computation():
    torch.manual_seed(0)
    logits, labels = torch.randn(6, 3), torch.tensor([0, 1, 2, 2, -100, 1])
    plain, count = label_loss(logits, labels)
    assert count.item() == 5
    keep = labels != -100
    log_p = torch.log_softmax(logits[keep], -1).gather(-1, labels[keep][:, None]).squeeze(-1)
    assert plain.item() == pytest.approx(-log_p.sum().item(), rel=1e-6)
    weights = (1.0, 2.0, 0.5)
    weighted, _ = label_loss(logits, labels, LossSettings(weights))
    expected = -(log_p * torch.tensor(weights)[labels[keep]]).sum()
    assert weighted.item() == pytest.approx(expected.item(), rel=1e-6)
    focal, _ = label_loss(logits, labels, LossSettings(focal_gamma=2.0))
    assert focal.item() == pytest.approx((-(1 - log_p.exp()) ** 2 * log_p).sum().item(), rel=1e-6)
    assert focal.item() < plain.item()


def test_classification_objective_refuses_weights_of_wrong_length_and_non_single_label():
    config = BertConfig.preset("tiny").with_labels(["a", "b"], "single_label_classification")
    with pytest.raises(ConfigError, match="class_weights has 3 values but the model has 2 labels"):
        FAMILY.training.objective_for(config, LossSettings((1.0, 2.0, 3.0)))
    multi = config.replace(problem_type="multi_label_classification")
    with pytest.raises(ConfigError, match="single-label classification"):
        FAMILY.training.objective_for(multi, LossSettings(focal_gamma=2.0))


def test_classification_consistency_is_zero_for_equal_passes_and_symmetric():
    from bertforge.model.heads import TaskOutput

    torch.manual_seed(1)
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    objective = ClassificationObjective("single_label_classification")
    same = objective.consistency(TaskOutput(a, None), TaskOutput(a.clone(), None), None)
    assert same.item() == pytest.approx(0.0, abs=1e-6)
    forward = objective.consistency(TaskOutput(a, None), TaskOutput(b, None), None)
    assert forward.item() == pytest.approx(objective.consistency(TaskOutput(b, None), TaskOutput(a, None), None).item())
    assert forward.item() == pytest.approx(symmetric_kl(a, b).item()) and forward.item() > 0


# --- end to end -------------------------------------------------------------------------------------------

def test_finetune_multi_label_stores_tuned_thresholds_used_by_evaluate_and_predict(tiny_model, tmp_path):
    write_jsonl(tmp_path / "train.jsonl", colour_rows(160, 0))
    write_jsonl(tmp_path / "dev.jsonl", colour_rows(48, 1))
    result = run(tiny_model, tmp_path, format="multilabel", train=str(tmp_path / "train.jsonl"),
                 dev=str(tmp_path / "dev.jsonl"), text_a_column="text", label_column="labels", epochs=3,
                 thresholds="per_label")
    assert result.metric == "micro_f1"
    config, _ = read_config(result.model_dir)
    assert config.problem_type == "multi_label_classification" and config.label_names == sorted(COLOURS)
    assert config.label_thresholds is not None and len(config.label_thresholds) == 3
    scored = evaluate(result.model_dir, tmp_path / "dev.jsonl", out_dir=tmp_path / "eval")
    assert scored.metrics["micro_f1"] == pytest.approx(result.best_metrics["micro_f1"])
    assert set(scored.details["per_label"]) == set(COLOURS)
    records = [json.loads(line) for line in (tmp_path / "eval" / "predictions.jsonl").read_text().splitlines()]
    pipeline = load_pipeline(result.model_dir, "classify", device="cpu")
    predicted = pipeline([r["text_a"] for r in records])
    assert [p["labels"] for p in predicted] == [r["labels"] for r in records]
    # The thresholds decide: each label is on exactly when its score reaches that label's threshold.
    cuts = dict(zip(config.label_names, config.label_thresholds))
    for p in predicted:
        assert p["labels"] == [k for k in config.label_names if p["scores"][k] >= cuts[k]]


def test_finetune_multi_label_unknown_dev_label_is_one_error(tiny_model, tmp_path):
    write_jsonl(tmp_path / "train.jsonl", colour_rows(32, 0))
    write_jsonl(tmp_path / "dev.jsonl", [{"text": "the sky", "labels": ["purple"]}])
    with pytest.raises(DataError, match=r"dev\.jsonl:1: label 'purple' was never seen in training"):
        run(tiny_model, tmp_path, format="multilabel", train=str(tmp_path / "train.jsonl"),
            dev=str(tmp_path / "dev.jsonl"), text_a_column="text", label_column="labels", steps=1)


def imbalanced_rows(count: int, seed: int, rare: float) -> list[str]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        positive = rng.random() < rare
        rows.append(f"the {'red' if positive else 'blue'} {rng.choice(FILLER)} {rng.choice(FILLER)}\t"
                    f"{'pos' if positive else 'neg'}")
    return rows


def test_finetune_balanced_class_weights_and_focal_train_and_report_per_class(tiny_model, tmp_path, caplog):
    (tmp_path / "train.tsv").write_text("text\tlabel\n" + "\n".join(imbalanced_rows(120, 0, 0.1)) + "\n")
    (tmp_path / "dev.tsv").write_text("text\tlabel\n" + "\n".join(imbalanced_rows(40, 1, 0.5)) + "\n")
    caplog.set_level("INFO", logger="bertforge")
    result = run(tiny_model, tmp_path, format="classification", train=str(tmp_path / "train.tsv"),
                 dev=str(tmp_path / "dev.tsv"), text_a_column="text", label_column="label", epochs=2,
                 balanced_class_weights=True, focal_gamma=1.0, metric="macro_f1")
    assert "balanced class weights" in caplog.text
    assert np.isfinite(result.best_metrics["macro_f1"])
    scored = evaluate(result.model_dir, tmp_path / "dev.tsv", out_dir=tmp_path / "eval")
    assert set(scored.details["per_class"]) == {"neg", "pos"}


def test_finetune_class_weights_of_wrong_length_is_one_error(tiny_model, tmp_path):
    (tmp_path / "train.tsv").write_text("text\tlabel\n" + "\n".join(imbalanced_rows(16, 0, 0.5)) + "\n")
    (tmp_path / "dev.tsv").write_text("text\tlabel\n" + "\n".join(imbalanced_rows(8, 1, 0.5)) + "\n")
    with pytest.raises(ConfigError, match="class_weights has 3 values but the model has 2 labels"):
        run(tiny_model, tmp_path, format="classification", train=str(tmp_path / "train.tsv"),
            dev=str(tmp_path / "dev.tsv"), text_a_column="text", label_column="label", steps=1,
            class_weights=[1.0, 2.0, 3.0])


def sentiment_files(tmp_path, train: int = 64, dev: int = 24):
    (tmp_path / "train.tsv").write_text("text\tlabel\n" + "\n".join(imbalanced_rows(train, 0, 0.5)) + "\n")
    (tmp_path / "dev.tsv").write_text("text\tlabel\n" + "\n".join(imbalanced_rows(dev, 1, 0.5)) + "\n")
    return {"format": "classification", "train": str(tmp_path / "train.tsv"), "dev": str(tmp_path / "dev.tsv"),
            "text_a_column": "text", "label_column": "label"}


def test_finetune_patience_stops_early_and_resume_keeps_results(tiny_model, tmp_path):
    files = sentiment_files(tmp_path)
    # A learning rate too small to change any prediction: the first evaluation stays the best.
    result = run(tiny_model, tmp_path, **files, epochs=6, lr=1e-12, patience=2)
    assert result.stopped_early and [h["step"] for h in result.history] == [4, 8, 12]
    assert result.best_step == 4
    stored = json.loads((result.out_dir / "eval_results.json").read_text())
    again = run(tiny_model, tmp_path, **files, epochs=6, lr=1e-12, patience=2, resume="auto")
    assert again.resumed.startswith("already complete") and again.stopped_early
    assert json.loads((result.out_dir / "eval_results.json").read_text()) == stored


def test_finetune_patience_without_dev_is_one_error(tiny_model, tmp_path):
    files = sentiment_files(tmp_path)
    with pytest.raises(ConfigError, match=r"patience=2 needs evaluations.*--no-dev.*--patience 0"):
        run(tiny_model, tmp_path, **{**files, "dev": ""}, steps=2, patience=2)


def test_finetune_loop_recipes_combine_from_flat_keys(tiny_model, tmp_path):
    files = sentiment_files(tmp_path)
    result = run(tiny_model, tmp_path, **files, epochs=1, layer_lr_decay=0.8, fgm_epsilon=0.5, rdrop_alpha=1.0,
                 ema_decay=0.5, grad_accumulation=2)
    logged = [json.loads(line) for line in (result.out_dir / "metrics.jsonl").read_text().splitlines()]
    train = [e for e in logged if e.get("split") == "train"][-1]
    values = train.get("values", train)
    assert "loss_rdrop" in values and "adv_cross_entropy" in values
    assert np.isfinite(result.best_metrics["accuracy"])


def test_optim_parameter_groups_give_crf_its_lr_scale():
    from bertforge.families.tagging import BertForTokenClassification
    from bertforge.training.optim import parameter_groups

    config = BertConfig.preset("tiny", vocab_size=len(TOKENS)).with_labels(["O", "B-PER", "I-PER"])
    model = BertForTokenClassification(config.replace(use_crf=True))
    groups = parameter_groups(model, 0.01, 1.0, lr=1e-4)
    crf_ids = {id(p) for p in model.crf.parameters()}
    for group in groups:
        in_crf = {id(p) in crf_ids for p in group["params"]}
        assert len(in_crf) == 1  # CRF scores never share a group with other parameters
        assert group["lr"] == pytest.approx(1e-2 if in_crf == {True} else 1e-4)
    plain = parameter_groups(BertForTokenClassification(config), 0.01, 1.0, lr=1e-4)
    assert len(plain) == 2 and all("lr" not in g for g in plain)


def test_tagging_label_counts_follow_the_tag_scheme():
    from bertforge.data.tagging import TaggingExample
    from bertforge.families.base import InputSettings
    from bertforge.families.registry import family

    tagging = family("tagging")
    examples = [TaggingExample(["John", "Smith", "runs"], ["B-PER", "I-PER", "O"], " ", "a:1"),
                TaggingExample(["Mary"], ["B-PER"], " ", "a:3")]
    assert tagging.training.label_counts(examples, ["O", "B-PER", "I-PER"], InputSettings()) == [1, 2, 1]
    iobes = ["O", "B-PER", "E-PER", "I-PER", "S-PER"]
    assert tagging.training.label_counts(examples, iobes, InputSettings(tag_scheme="IOBES")) == [1, 1, 1, 0, 1]


def test_tagging_named_task_tag_set_survives_a_small_train_limit():
    from bertforge.data.tagging import TaggingExample, scheme_tags, tag_list
    from bertforge.families.base import InputSettings
    from bertforge.families.registry import family
    from bertforge.families.tasks import TASKS

    tags = TASKS["conll2003"].labels
    few = [TaggingExample(["John", "runs"], ["B-PER", "O"], " ", "a:1")]
    assert tag_list(few) == ["O", "B-PER"]  # what a 1-sentence run used to get: dev's I-LOC unknown
    names = family("tagging").training.label_names(few, tags, InputSettings())
    assert names == list(tags) and len(names) == 9
    iobes = scheme_tags(tags, "IOBES")
    assert len(iobes) == 17 and iobes[0] == "O" and "S-MISC" in iobes and "E-PER" in iobes
    assert scheme_tags(["O", "I-X", "B-X"]) == ["O", "I-X", "B-X"]  # a given BIO order is kept
