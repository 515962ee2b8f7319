"""Task heads and task models without a reference: the tied MLM decoder, pretraining sums and counts,
classifier depth, feature-based (frozen, multi-layer) use, and each task's output shapes and loss rules."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bertforge.constants import IGNORE_INDEX
from bertforge.families.classification import BertForSequenceClassification
from bertforge.families.multiple_choice import BertForMultipleChoice
from bertforge.families.pretraining import BertForPretraining
from bertforge.families.question_answering import BertForQuestionAnswering
from bertforge.families.tagging import BertForTokenClassification
from bertforge.model.heads import ClassifierHead, build_classifier, feature_size

FP32_ATOL = 1e-5
FP32_RTOL = 1e-5

FEATURE_LAYERS = [-1, -2, -3, -4]


def batch(config, rows: int = 2, tokens: int = 6):
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, config.vocab_size, (rows, tokens), generator=generator)
    attention_mask = torch.ones(rows, tokens, dtype=torch.long)
    attention_mask[-1, tokens - 2 :] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def build(cls, config, seed: int = 0):
    torch.manual_seed(seed)
    return cls(config)


# --- MLM head and pretraining ----------------------------------------------------------------------------

def test_mlm_decoder_is_the_word_embedding(tiny_config):
    model = build(BertForPretraining, tiny_config).eval()
    assert not any("decoder" in key for key in model.state_dict()), "the tied decoder must not be stored twice"
    inputs = batch(tiny_config)
    hidden = model.bert(**inputs).last_hidden_state
    head = model.mlm
    expected = F.linear(head.norm(F.gelu(head.transform(hidden))), model.bert.embeddings.word.weight, head.bias)
    torch.testing.assert_close(model(**inputs).mlm_logits, expected, atol=FP32_ATOL, rtol=FP32_RTOL)
    with torch.no_grad():
        model.bert.embeddings.word.weight[5] += 1.0
    changed = model(**inputs).mlm_logits
    assert not torch.allclose(changed[..., 5], expected[..., 5])


def test_mlm_loss_trains_word_embeddings_through_decoder(tiny_config):
    model = build(BertForPretraining, tiny_config)
    inputs = batch(tiny_config)
    out = model(**inputs, mlm_positions=torch.tensor([[1, 2], [1, 3]]), mlm_labels=torch.tensor([[7, 8], [9, 70]]))
    out.loss.backward()
    # Row 70 of the vocabulary is never an input here (ids were drawn with a fixed seed), yet it is a target.
    assert (inputs["input_ids"] != 70).all()
    assert model.bert.embeddings.word.weight.grad[70].abs().sum() > 0
    assert model.mlm.bias.grad is not None


def test_pretraining_sums_and_counts(tiny_config):
    model = build(BertForPretraining, tiny_config).eval()
    inputs = batch(tiny_config)
    positions = torch.tensor([[1, 2, 3], [1, 2, 0]])
    labels = torch.tensor([[7, 8, 9], [10, 11, IGNORE_INDEX]])
    nsp_labels = torch.tensor([0, 1])
    out = model(**inputs, mlm_positions=positions, mlm_labels=labels, nsp_labels=nsp_labels)
    assert out.mlm_logits.shape == (2, 3, tiny_config.vocab_size) and out.nsp_logits.shape == (2, 2)
    assert out.mlm_count.item() == 5 and out.nsp_count.item() == 2
    flat_logits, flat_labels = out.mlm_logits.reshape(-1, tiny_config.vocab_size), labels.reshape(-1)
    expected_sum = F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX, reduction="sum")
    torch.testing.assert_close(out.mlm_loss_sum, expected_sum, atol=FP32_ATOL, rtol=FP32_RTOL)
    correct = ((flat_logits.argmax(-1) == flat_labels) & (flat_labels != IGNORE_INDEX)).sum()
    assert out.mlm_correct.item() == correct.item()
    # NSP label 0 ("B follows A") is a real target, never ignored.
    expected_nsp = F.cross_entropy(out.nsp_logits, nsp_labels, reduction="sum")
    torch.testing.assert_close(out.nsp_loss_sum, expected_nsp, atol=FP32_ATOL, rtol=FP32_RTOL)
    torch.testing.assert_close(out.loss, expected_sum / 5 + expected_nsp / 2, atol=FP32_ATOL, rtol=FP32_RTOL)


def test_pretraining_without_positions_scores_every_token(tiny_config):
    model = build(BertForPretraining, tiny_config).eval()
    out = model(**batch(tiny_config))
    assert out.mlm_logits.shape == (2, 6, tiny_config.vocab_size) and out.loss is None


def test_pretraining_mlm_only_loss(tiny_config):
    model = build(BertForPretraining, tiny_config).eval()
    out = model(**batch(tiny_config), mlm_positions=torch.tensor([[1], [2]]), mlm_labels=torch.tensor([[4], [5]]))
    assert out.nsp_count.item() == 0 and out.nsp_loss_sum.item() == 0
    torch.testing.assert_close(out.loss, out.mlm_loss_sum / 2, atol=FP32_ATOL, rtol=FP32_RTOL)


# --- classifier heads ------------------------------------------------------------------------------------

def test_classifier_default_is_single_linear_layer(tiny_config):
    head = build_classifier(tiny_config, 32, 3)
    assert isinstance(head, nn.Linear) and (head.in_features, head.out_features) == (32, 3)


def test_classifier_hidden_sizes_builds_one_hidden_layer(tiny_config):
    config = tiny_config.with_labels(["a", "b", "c"]).replace(classifier_hidden_sizes=[64])
    model = build(BertForSequenceClassification, config).eval()
    head = model.classifier
    assert isinstance(head, ClassifierHead) and len(head.hidden) == 1
    assert (head.hidden[0].in_features, head.hidden[0].out_features) == (32, 64)
    assert (head.out.in_features, head.out.out_features) == (64, 3)
    assert model(**batch(config)).logits.shape == (2, 3)


def test_classifier_hidden_sizes_three_layers(tiny_config):
    head = build_classifier(tiny_config.replace(classifier_hidden_sizes=[16, 8, 4]), 32, 2)
    assert [layer.out_features for layer in head.hidden] == [16, 8, 4] and head.out.in_features == 4


def test_classifier_hidden_sizes_model_saves_and_loads(tmp_path, tiny_config):
    config = tiny_config.with_labels(["a", "b"]).replace(classifier_hidden_sizes=[16])
    model = build(BertForSequenceClassification, config).eval()
    model.save_pretrained(tmp_path)
    loaded = BertForSequenceClassification.from_pretrained(tmp_path)
    assert loaded.config.classifier_hidden_sizes == [16]
    inputs = batch(config)
    torch.testing.assert_close(loaded(**inputs).logits, model(**inputs).logits, atol=0, rtol=0)


# --- feature-based use -----------------------------------------------------------------------------------

def feature_config(tiny_config, **overrides):
    # Four layers so that the last four hidden states are four different layers.
    return tiny_config.replace(num_hidden_layers=4, feature_layers=FEATURE_LAYERS, freeze_encoder=True,
                               hidden_dropout_prob=0.1, **overrides).with_labels(["a", "b", "c"])


@pytest.mark.parametrize(
    ("cls", "head_name"),
    [(BertForSequenceClassification, "classifier"), (BertForTokenClassification, "classifier"),
     (BertForQuestionAnswering, "qa_outputs"), (BertForMultipleChoice, "classifier")],
)
def test_feature_layers_widen_head_input(tiny_config, cls, head_name):
    config = feature_config(tiny_config)
    assert feature_size(config) == 4 * 32
    model = build(cls, config)
    assert getattr(model, head_name).in_features == 4 * 32


def test_feature_layers_concatenate_cls_vectors(tiny_config):
    model = build(BertForSequenceClassification, feature_config(tiny_config)).eval()
    inputs = batch(model.config)
    hidden = model.bert(**inputs, output_hidden_states=True).hidden_states
    features = torch.cat([hidden[i][:, 0] for i in FEATURE_LAYERS], dim=-1)  # [B, 4H]
    torch.testing.assert_close(model(**inputs).logits, model.classifier(features), atol=FP32_ATOL, rtol=FP32_RTOL)


def test_feature_layers_token_features(tiny_config):
    model = build(BertForTokenClassification, feature_config(tiny_config)).eval()
    inputs = batch(model.config)
    hidden = model.bert(**inputs, output_hidden_states=True).hidden_states
    features = torch.cat([hidden[i] for i in FEATURE_LAYERS], dim=-1)  # [B, T, 4H]
    torch.testing.assert_close(model(**inputs).logits, model.classifier(features), atol=FP32_ATOL, rtol=FP32_RTOL)


@pytest.mark.parametrize("cls", [BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering])
def test_frozen_encoder_gets_no_gradient(tiny_config, cls):
    model = build(cls, feature_config(tiny_config)).train()
    out = model(**batch(model.config))
    logits = out.start_logits if cls is BertForQuestionAnswering else out.logits
    logits.sum().backward()
    assert all(p.grad is None and not p.requires_grad for p in model.bert.parameters())
    head = [p for name, p in model.named_parameters() if not name.startswith("bert.")]
    assert head and all(p.grad is not None for p in head)


def test_frozen_encoder_stays_in_eval_mode(tiny_config):
    model = build(BertForSequenceClassification, feature_config(tiny_config)).train()
    assert model.training and model.dropout.training
    assert not model.bert.training and not any(m.training for m in model.bert.modules())
    inputs = batch(model.config)
    # Encoder dropout is off, so its features repeat exactly even in training mode.
    first = model.bert(**inputs).last_hidden_state
    torch.testing.assert_close(model.bert(**inputs).last_hidden_state, first, atol=0, rtol=0)
    model.eval()
    assert not model.training and not model.bert.training


def test_unfrozen_encoder_trains(tiny_config):
    config = tiny_config.with_labels(["a", "b"])
    model = build(BertForSequenceClassification, config).train()
    assert model.bert.training
    model(**batch(config), labels=torch.tensor([0, 1])).loss.backward()
    assert model.bert.encoder.layers[0].attention.query.weight.grad is not None


# --- task outputs and loss rules -------------------------------------------------------------------------

def test_sequence_classification_single_label_without_problem_type(tiny_config):
    config = tiny_config.with_labels(["a", "b", "c"])
    model = build(BertForSequenceClassification, config).eval()
    out = model(**batch(config), labels=torch.tensor([2, 0]))
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, torch.tensor([2, 0])),
                               atol=FP32_ATOL, rtol=FP32_RTOL)


def test_sequence_classification_one_label_means_regression(tiny_config):
    model = build(BertForSequenceClassification, tiny_config.with_labels(["score"])).eval()
    labels = torch.tensor([0.5, 2.0])
    out = model(**batch(tiny_config), labels=labels)
    torch.testing.assert_close(out.loss, F.mse_loss(out.logits.squeeze(-1), labels), atol=FP32_ATOL, rtol=FP32_RTOL)


def test_sequence_classification_initial_loss_reference(tiny_config):
    model = build(BertForSequenceClassification, tiny_config.with_labels(["a", "b", "c", "d"]))
    assert model.initial_loss_reference().item() == pytest.approx(1.3862944)


def test_token_classification_ignores_unlabelled_tokens(tiny_config):
    config = tiny_config.with_labels(["O", "B", "I"])
    model = build(BertForTokenClassification, config).eval()
    labels = torch.full((2, 6), IGNORE_INDEX)
    labels[0, 1], labels[1, 2] = 1, 2
    out = model(**batch(config), labels=labels)
    assert out.logits.shape == (2, 6, 3)
    expected = F.cross_entropy(torch.stack([out.logits[0, 1], out.logits[1, 2]]), torch.tensor([1, 2]))
    torch.testing.assert_close(out.loss, expected, atol=FP32_ATOL, rtol=FP32_RTOL)


def test_question_answering_loss_ignores_positions_outside_window(tiny_config):
    model = build(BertForQuestionAnswering, tiny_config).eval()
    out = model(**batch(tiny_config), start_positions=torch.tensor([2, 100]), end_positions=torch.tensor([3, 100]))
    assert out.start_logits.shape == out.end_logits.shape == (2, 6)
    expected = (F.cross_entropy(out.start_logits[:1], torch.tensor([2]))
                + F.cross_entropy(out.end_logits[:1], torch.tensor([3]))) / 2
    torch.testing.assert_close(out.loss, expected, atol=FP32_ATOL, rtol=FP32_RTOL)
    assert not any(k.startswith("bert.pooler") for k in model.state_dict())


def test_multiple_choice_scores_each_choice_independently(tiny_config):
    model = build(BertForMultipleChoice, tiny_config).eval()
    inputs = {k: v.view(1, 2, 6) for k, v in batch(tiny_config).items()}  # one question, two choices
    out = model(**inputs, labels=torch.tensor([1]))
    assert out.logits.shape == (1, 2)
    alone = model(**{k: v[:, 1:] for k, v in inputs.items()}).logits
    torch.testing.assert_close(out.logits[:, 1:], alone, atol=FP32_ATOL, rtol=FP32_RTOL)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, torch.tensor([1])), atol=FP32_ATOL,
                               rtol=FP32_RTOL)
