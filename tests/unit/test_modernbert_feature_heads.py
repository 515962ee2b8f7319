"""Layer features (`config.feature_layers`) on the four ModernBERT classifiers: each head reads the chosen
hidden states, as `output_hidden_states=True` reports them (index 0 the embeddings, the last one normed),
concatenated per token, [B, T, H*k]; the prediction head's dense layer takes H*k inputs and gives H, and the
sequence and choice heads pool (`classifier_pooling`) the concatenated features. Each head's output equals
that definition computed by hand from the encoder's hidden states, on a padded batch, both poolings."""

from __future__ import annotations

import pytest
import torch

from bertforge.families.multiple_choice import ModernBertForMultipleChoice
from bertforge.families.question_answering import ModernBertForQuestionAnswering
from bertforge.families.tagging import ModernBertForTokenClassification
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.modernbert import ModernBertForSequenceClassification

LAYERS = [-1, 0, 2]  # the last (normed) layer, the embeddings, the second layer's output
HIDDEN = 32


def feature_config(**fields) -> ModernBertConfig:
    return ModernBertConfig(vocab_size=60, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=3,
                            num_attention_heads=2, local_attention=4, pad_token_id=0,
                            id2label={0: "O", 1: "B-X", 2: "I-X"}, feature_layers=LAYERS, **fields)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of 9 tokens, the second with 3 padding tokens (so the unpadded path and mean pooling matter)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 60, (2, 9), generator=generator)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    return ids.masked_fill(mask == 0, 0), mask


def by_hand(model, ids: torch.Tensor, mask: torch.Tensor, pooling: str | None) -> torch.Tensor:
    """The definition: the chosen hidden states concatenated per token, pooled where the head pools, the
    prediction head, the classifier."""
    hidden = model.bert(ids, None, mask, output_hidden_states=True).hidden_states  # 4 x [B, T, H]
    features = torch.cat([hidden[i] for i in LAYERS], dim=-1)  # [B, T, 3H]
    if pooling == "cls":
        features = features[:, 0]
    elif pooling == "mean":
        weights = mask[:, :, None].float()
        features = (features * weights).sum(1) / weights.sum(1)
    head = model.head
    return model.classifier(head.norm(head.act(head.dense(features))))


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_modernbert_sequence_head_reads_concatenated_layers(pooling):
    torch.manual_seed(0)
    model = ModernBertForSequenceClassification(feature_config(classifier_pooling=pooling)).eval()
    assert (model.head.dense.in_features, model.head.dense.out_features) == (3 * HIDDEN, HIDDEN)
    ids, mask = batch()
    with torch.no_grad():
        torch.testing.assert_close(model(ids, None, mask).logits, by_hand(model, ids, mask, pooling))


def test_modernbert_tagger_reads_concatenated_layers():
    torch.manual_seed(0)
    model = ModernBertForTokenClassification(feature_config()).eval()
    ids, mask = batch()
    with torch.no_grad():
        logits = model(ids, None, mask).logits  # [B, T, C]
        expected = by_hand(model, ids, mask, None)
    real = mask.bool()
    torch.testing.assert_close(logits[real], expected[real])


def test_modernbert_span_head_reads_concatenated_layers():
    torch.manual_seed(0)
    model = ModernBertForQuestionAnswering(feature_config()).eval()
    ids, mask = batch()
    with torch.no_grad():
        out = model(ids, None, mask)
        expected = by_hand(model, ids, mask, None)  # [B, T, 2]
    real = mask.bool()
    torch.testing.assert_close(out.start_logits[real], expected[..., 0][real])
    torch.testing.assert_close(out.end_logits[real], expected[..., 1][real])


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_modernbert_choice_head_reads_concatenated_layers(pooling):
    torch.manual_seed(0)
    model = ModernBertForMultipleChoice(feature_config(classifier_pooling=pooling)).eval()
    ids, mask = batch()  # two choices of one question: [1, 2, T]
    with torch.no_grad():
        logits = model(ids[None], None, mask[None]).logits  # [1, 2]
        expected = by_hand(model, ids, mask, pooling).view(1, 2)
    torch.testing.assert_close(logits, expected)


def test_modernbert_feature_layers_with_a_frozen_encoder_train_only_the_head():
    torch.manual_seed(0)
    model = ModernBertForSequenceClassification(feature_config(freeze_encoder=True)).train()
    ids, mask = batch()
    model(ids, None, mask).logits.sum().backward()
    assert all(p.grad is None for p in model.bert.parameters())
    assert model.head.dense.weight.grad is not None and model.classifier.weight.grad is not None


def test_modernbert_feature_head_starts_fresh_only_on_a_pretrained_encoder(tmp_path):
    from bertforge.checkpoint_format import load_model
    from bertforge.errors import CheckpointError
    from bertforge.model.modernbert import ModernBertForMaskedLM

    plain = feature_config().replace(feature_layers=None)
    torch.manual_seed(0)
    ModernBertForMaskedLM(plain).save_pretrained(tmp_path / "mlm")  # its prediction head reads H
    model, report = load_model(tmp_path / "mlm", ModernBertForSequenceClassification,
                               config_overrides={"feature_layers": LAYERS})
    assert {"head.dense.weight", "head.norm.weight", "classifier.weight"} <= set(report.fresh)
    assert model.head.dense.weight.shape == (HIDDEN, 3 * HIDDEN)
    # initialised as a fresh head is (truncated normal, cut at 2σ), not left as the constructor's empty memory
    assert 0 < float(model.head.dense.weight.abs().max()) <= 2 * plain.initializer_range
    # A fine-tuned classifier keeps its head: reading other layers is a new head, which the user asks for.
    ModernBertForSequenceClassification(plain).save_pretrained(tmp_path / "classifier")
    with pytest.raises(CheckpointError, match=r"head\.dense\.weight: stored \(32, 32\), model \(32, 96\).*fresh_head"):
        load_model(tmp_path / "classifier", ModernBertForSequenceClassification,
                   config_overrides={"feature_layers": LAYERS})
    _, report = load_model(tmp_path / "classifier", ModernBertForSequenceClassification,
                           config_overrides={"feature_layers": LAYERS}, fresh_head=True)
    assert "head.dense.weight" in report.fresh
