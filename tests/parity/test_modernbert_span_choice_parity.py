"""Parity of our ModernBERT question-answering and multiple-choice heads (`ModernBertForQuestionAnswering` in
`families.question_answering`, `ModernBertForMultipleChoice` in `families.multiple_choice`) with transformers'
on tiny random configs, and their Hugging Face directories both ways.

The same set-up as `test_modernbert_parity.py` (whose helpers these tests use): our model's weights copied into
transformers' class through our key table, both run on the same padded batch, compared at the real positions
(our span head sets padding's logits to the dtype's minimum; transformers scores padding from its hidden
states), lengths 8 (a window of 4) and 512 (the released window of 128), both of our layouts.
"""

from __future__ import annotations

import json

import pytest
import torch
from tests.parity.test_modernbert_parity import FP32_ATOL, assert_real_close, batch, tiny, twins

from bertforge.families import registry
from bertforge.families.multiple_choice import ModernBertForMultipleChoice
from bertforge.families.question_answering import ModernBertForQuestionAnswering
from bertforge.model.fast_paths import set_fast_paths

transformers = pytest.importorskip("transformers")


def choice_batch(config, tokens: int, choices: int = 3, questions: int = 2) -> dict:
    """[Q, C, T] ids and mask: each question's choices end at different lengths (`batch`'s padding)."""
    rows = [batch(config, tokens, padded=True, rows=choices, seed=seed) for seed in range(1, questions + 1)]
    return {name: torch.stack([r[name] for r in rows]) for name in ("input_ids", "attention_mask")}


def assert_span_close(ours, theirs, mask) -> float:
    """Start and end logits equal at the real tokens; padding is never an answer in ours."""
    assert bool((ours.start_logits[mask == 0] == torch.finfo(torch.float32).min).all())
    return max(assert_real_close(ours.start_logits, theirs.start_logits, mask, "start logits"),
               assert_real_close(ours.end_logits, theirs.end_logits, mask, "end logits"))


@pytest.mark.parametrize("unpad", [False, True], ids=["padded_layout", "unpadded_layout"])
@pytest.mark.parametrize("tokens,window", [(8, 4), (512, 128)])
def test_modernbert_span_head_matches_reference(tokens, window, unpad):
    config = tiny(local_attention=window)  # carries 3 labels: the span head has 2 outputs whatever the labels
    ours, theirs = twins(ModernBertForQuestionAnswering, config)
    assert theirs.config.num_labels == 2
    set_fast_paths(ours, unpad=unpad)
    inputs = batch(config, tokens, padded=True)
    with torch.no_grad():
        delta = assert_span_close(ours(**inputs), theirs(**inputs), inputs["attention_mask"])
    assert delta <= FP32_ATOL


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("unpad", [False, True], ids=["padded_layout", "unpadded_layout"])
@pytest.mark.parametrize("tokens,window", [(8, 4), (512, 128)])
def test_modernbert_choice_head_matches_reference(tokens, window, unpad, pooling):
    config = tiny(local_attention=window, classifier_pooling=pooling)
    ours, theirs = twins(ModernBertForMultipleChoice, config)
    set_fast_paths(ours, unpad=unpad)
    inputs = choice_batch(config, tokens)
    labels = torch.tensor([2, 0])
    with torch.no_grad():
        out, ref = ours(**inputs, labels=labels), theirs(**inputs, labels=labels)
    assert out.logits.shape == ref.logits.shape == (2, 3)
    torch.testing.assert_close(out.logits, ref.logits, atol=FP32_ATOL, rtol=1e-5)
    torch.testing.assert_close(out.loss, ref.loss, atol=FP32_ATOL, rtol=1e-5)  # mean cross-entropy over questions


def test_modernbert_span_loss_matches_reference():
    # Without padding (where transformers' softmax also spans padding) the two losses are the same number.
    config = tiny(local_attention=4)
    ours, theirs = twins(ModernBertForQuestionAnswering, config)
    inputs = batch(config, 12, padded=False)
    positions = {"start_positions": torch.tensor([1, 4, 0]), "end_positions": torch.tensor([3, 4, 0])}
    with torch.no_grad():
        torch.testing.assert_close(ours(**inputs, **positions).loss, theirs(**inputs, **positions).loss,
                                   atol=FP32_ATOL, rtol=1e-5)


def outputs(model, inputs) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(**inputs)
    return [out.start_logits, out.end_logits] if hasattr(out, "start_logits") else [out.logits]


@pytest.mark.parametrize("cls", [ModernBertForQuestionAnswering, ModernBertForMultipleChoice])
def test_modernbert_span_and_choice_directories_saved_by_transformers_load_here(tmp_path, cls):
    reference = transformers.ModernBertConfig(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=2,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, local_attention=8,
        global_attn_every_n_layers=2, classifier_pooling="mean")
    torch.manual_seed(0)
    theirs = getattr(transformers, cls.__name__)(reference).eval()
    theirs.save_pretrained(tmp_path / "theirs")
    model, report = registry.load_model(tmp_path / "theirs")  # the class its config.json names
    assert type(model) is cls and report.fresh == [] and report.skipped == []
    assert model.config.classifier_pooling == "mean"
    if cls is ModernBertForMultipleChoice:
        inputs = choice_batch(model.config, 30)
        mask = torch.ones(2, 3, dtype=torch.bool)  # one logit per choice, all real
    else:
        inputs = batch(model.config, 30, padded=True)
        mask = inputs["attention_mask"]
    for ours_out, their_out in zip(outputs(model, inputs), outputs(theirs, inputs), strict=True):
        assert_real_close(ours_out, their_out, mask, cls.__name__)
    # ... and back out: our save of it loads in transformers with the same weights.
    model.save_pretrained(tmp_path / "again")
    again = getattr(transformers, cls.__name__).from_pretrained(tmp_path / "again").eval()
    for again_out, their_out in zip(outputs(again, inputs), outputs(theirs, inputs), strict=True):
        assert_real_close(again_out, their_out, mask, cls.__name__)


@pytest.mark.parametrize("cls, auto", [(ModernBertForQuestionAnswering, "AutoModelForQuestionAnswering"),
                                       (ModernBertForMultipleChoice, "AutoModelForMultipleChoice")])
def test_modernbert_span_and_choice_directories_saved_by_us_load_in_transformers(tmp_path, cls, auto):
    config = tiny(local_attention=8)  # 3 labels (as a model fine-tuned from a classifier carries): not a span size
    torch.manual_seed(0)
    ours = set_fast_paths(cls(config).eval(), unpad=False)
    ours.save_pretrained(tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["model_type"] == "modernbert" and written["architectures"] == [cls.__name__]
    theirs = getattr(transformers, auto).from_pretrained(tmp_path / "ours").eval()
    assert type(theirs).__name__ == cls.__name__
    inputs = choice_batch(config, 30) if cls is ModernBertForMultipleChoice else batch(config, 30, padded=True)
    mask = torch.ones(2, 3, dtype=torch.bool) if cls is ModernBertForMultipleChoice else inputs["attention_mask"]
    for ours_out, their_out in zip(outputs(ours, inputs), outputs(theirs, inputs), strict=True):
        assert_real_close(ours_out, their_out, mask, cls.__name__)
