"""Single-sentence and sentence-pair classification or regression over the [CLS] representation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.model.config import BertConfig
from bertforge.model.heads import TaskOutput, build_classifier, feature_size, sequence_features
from bertforge.tasks.base import FineTuningModel


class BertForSequenceClassification(FineTuningModel):
    """Pooled [CLS] -> dropout -> classifier.  `config.problem_type` picks the loss:
    cross-entropy (single label), BCE (multi label) or MSE (`regression`, one output)."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = build_classifier(config, feature_size(config), config.num_labels)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                output_attentions: bool = False, output_hidden_states: bool = False) -> TaskOutput:
        out = self.encode(input_ids, token_type_ids, attention_mask, output_attentions, output_hidden_states)
        logits = self.classifier(self.dropout(sequence_features(self.config, out)))  # [B, C]
        loss = None
        if labels is not None:
            kind = self.config.problem_type
            if kind == "regression":
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            elif kind == "multi_label_classification":
                loss = F.binary_cross_entropy_with_logits(logits.float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels.long())
        return TaskOutput(logits, loss, out.hidden_states, out.attentions)

    def initial_loss_reference(self) -> torch.Tensor:
        """log(C): the loss of a uniform guess, a sanity bound for the first steps."""
        return torch.log(torch.tensor(float(self.config.num_labels)))
