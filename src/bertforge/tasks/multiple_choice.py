"""Multiple choice (SWAG style): every choice is encoded with the context, one score per choice."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.model.config import BertConfig
from bertforge.model.heads import TaskOutput, build_classifier, feature_size, sequence_features
from bertforge.tasks.base import FineTuningModel


class BertForMultipleChoice(FineTuningModel):
    """Inputs [B, C, T] are flattened to [B*C, T]; each pooled [CLS] scores one choice; softmax over C."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.dropout = nn.Dropout(config.head_dropout)
        self.classifier = build_classifier(config, feature_size(config), 1)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                output_attentions: bool = False, output_hidden_states: bool = False):

        batch, choices, tokens = input_ids.shape

        def flat(x):
            return None if x is None else x.reshape(batch * choices, tokens)  # [B, C, T] -> [B*C, T]

        out = self.encode(flat(input_ids), flat(token_type_ids), flat(attention_mask),
                          output_attentions, output_hidden_states)
        scores = self.classifier(self.dropout(sequence_features(self.config, out)))  # [B*C, 1]
        logits = scores.view(batch, choices)  # [B*C, 1] -> [B, C]
        loss = F.cross_entropy(logits.float(), labels.long()) if labels is not None else None
        return TaskOutput(logits, loss, out.hidden_states, out.attentions)


class MultipleChoiceTask:
    """Loss and accuracy (sum, count) pairs for multiple choice: cross-entropy over the choices."""

    def counts(self, batch) -> dict[str, torch.Tensor]:
        """Questions in the batch."""
        return {"cross_entropy": torch.tensor(float(batch.labels.shape[0]))}

    def loss_terms(self, output: TaskOutput, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        logits = output.logits.float()  # [B, C]
        count = logits.new_tensor(float(logits.shape[0]))
        return {"cross_entropy": (F.cross_entropy(logits, batch.labels.long(), reduction="sum"), count)}

    def metrics(self, output: TaskOutput, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        logits = output.logits.detach()
        count = logits.new_tensor(float(logits.shape[0]))
        return {"accuracy": ((logits.argmax(-1) == batch.labels).float().sum(), count)}
