"""The deeper classifier (`--classifier-hidden`: hidden layers before the output, BERT's `ClassifierHead`) on a
ModernBERT encoder: `bertforge finetune --classifier-hidden 16` from a tiny random ModernBERT masked LM trains
it under ModernBERT's prediction head, saves it under its own names (`classifier.hidden.0`, `classifier.out`)
and loads it back whole; `bertforge predict` answers with the saved model's own scores. Every ModernBERT
classifier (tagger, span and choice heads) builds it the same way.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tests.e2e.test_modernbert_directory import tiny_modernbert

from bertforge.cli import main
from bertforge.families import registry
from bertforge.families.multiple_choice import ModernBertForMultipleChoice
from bertforge.families.question_answering import ModernBertForQuestionAnswering
from bertforge.families.tagging import ModernBertForTokenClassification
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.heads import ClassifierHead
from bertforge.model.modernbert import ModernBertForSequenceClassification


def finetune_tiny_classifier(tmp_path, *flags: str):
    """(tokenizer, the best directory) of 3 steps of `finetune --format classification` with `flags` from a tiny
    ModernBERT directory, on 40 two-label sentences."""
    rows = ["text_a\tlabel"] + [f"{'good' if i % 2 else 'bad'} day number {i}\t{'pos' if i % 2 else 'neg'}"
                                for i in range(40)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    tokenizer = tiny_modernbert(tmp_path / "base", [row.split("\t")[0] for row in rows])
    assert main(["finetune", "--format", "classification", "--train", str(tmp_path / "train.tsv"), "--dev",
                 str(tmp_path / "train.tsv"), "--text-a", "text_a", "--label", "label", "--model",
                 str(tmp_path / "base"), "--out", str(tmp_path / "ft"), "--steps", "3", "--batch-size", "8",
                 "--device", "cpu", "--max-seq-length", "16", *flags, "--progress=false"]) == 0
    return tokenizer, tmp_path / "ft" / "best"


def assert_predict_gives_the_model(tmp_path, best, model, tokenizer, *flags: str) -> None:
    """`bertforge predict --task classify` on `best` (with `flags`) gives `model`'s probabilities within 1e-5."""
    texts = ["good day number 3", "bad day"]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert main(["predict", "--model", str(best), "--task", "classify", "--input", str(tmp_path / "in.txt"),
                 "--output", str(tmp_path / "out.jsonl"), "--device", "cpu", "--precision", "fp32", *flags]) == 0
    answers = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    for text, answer in zip(texts, answers, strict=True):
        with torch.no_grad():
            probabilities = model(torch.tensor([tokenizer.encode(text).ids])).logits.softmax(-1)[0]
        np.testing.assert_allclose([answer["scores"][name] for name in model.config.label_names],
                                   probabilities.numpy(), atol=1e-5)


def test_modernbert_finetunes_saves_and_predicts_with_the_deeper_classifier(tmp_path):
    tokenizer, best = finetune_tiny_classifier(tmp_path, "--classifier-hidden", "16")
    saved = json.loads((best / "config.json").read_text())
    assert saved["architectures"] == ["ModernBertForSequenceClassification"] and saved["classifier_hidden_sizes"] == [16]
    weights = load_file(best / "model.safetensors")
    assert weights["classifier.hidden.0.weight"].shape == (16, 32) and weights["classifier.out.weight"].shape == (2, 16)
    model, report = registry.load_model(best, fast_path=False)
    assert isinstance(model.classifier, ClassifierHead) and report.fresh == [] and report.skipped == []
    torch.testing.assert_close(model.classifier.out.weight.detach(), weights["classifier.out.weight"])

    assert_predict_gives_the_model(tmp_path, best, model, tokenizer)


@pytest.mark.parametrize("cls,outputs", [(ModernBertForTokenClassification, 3), (ModernBertForQuestionAnswering, 2),
                                         (ModernBertForMultipleChoice, 1), (ModernBertForSequenceClassification, 3)])
def test_every_modernbert_classifier_builds_the_deeper_classifier(cls, outputs):
    config = ModernBertConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                              num_attention_heads=2, pad_token_id=0, id2label={0: "O", 1: "B-X", 2: "I-X"},
                              classifier_hidden_sizes=[24, 8])
    torch.manual_seed(0)
    model = cls(config).eval()
    head = model.classifier
    assert isinstance(head, ClassifierHead) and [layer.out_features for layer in head.hidden] == [24, 8]
    assert head.out.out_features == outputs
    # ModernBERT's truncated-normal initialisation reaches the hidden layers too (cut at 2σ, σ = 0.02).
    assert all(float(layer.weight.detach().abs().max()) <= 2 * config.initializer_range for layer in head.hidden)
