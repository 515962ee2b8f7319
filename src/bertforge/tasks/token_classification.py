"""Token tagging (NER and similar): one label per token, loss only where a label is given."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.constants import IGNORE_INDEX
from bertforge.model.config import BertConfig
from bertforge.model.heads import TaskOutput, build_classifier, feature_size, token_features
from bertforge.tasks.base import FineTuningModel


class BertForTokenClassification(FineTuningModel):
    """Each token's hidden state -> dropout -> classifier.  Labels [B, T] use IGNORE_INDEX on tokens that
    carry no label (continuation pieces, special tokens, padding)."""

    def __init__(self, config: BertConfig):
        super().__init__(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(config.head_dropout)
        self.classifier = build_classifier(config, feature_size(config), config.num_labels)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                output_attentions: bool = False, output_hidden_states: bool = False) -> TaskOutput:
        out = self.encode(input_ids, token_type_ids, attention_mask, output_attentions, output_hidden_states)
        logits = self.classifier(self.dropout(token_features(self.config, out)))  # [B, T, C]
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten().long(), ignore_index=IGNORE_INDEX)
        return TaskOutput(logits, loss, out.hidden_states, out.attentions)


class TokenClassificationTask:
    """Loss and metric (sum, count) pairs for tagging: cross-entropy over the labelled tokens only.

    Counts are labelled tokens (not sentences), so the loop's mean is the per-token loss the model's own
    `loss` computes, whatever the batch split.
    """

    def counts(self, batch) -> dict[str, torch.Tensor]:
        """Labelled tokens in the batch."""
        return {"cross_entropy": (batch.labels != IGNORE_INDEX).sum().float()}

    def loss_terms(self, output: TaskOutput, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        logits = output.logits.flatten(0, 1).float()  # [B, T, C] -> [B*T, C]
        labels = batch.labels.flatten().long()  # [B*T]
        loss = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")
        return {"cross_entropy": (loss, (labels != IGNORE_INDEX).sum().float())}

    def metrics(self, output: TaskOutput, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        labels = batch.labels
        real = labels != IGNORE_INDEX
        correct = ((output.logits.detach().argmax(-1) == labels) & real).sum().float()
        return {"token_accuracy": (correct, real.sum().float())}
