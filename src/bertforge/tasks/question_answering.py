"""Extractive question answering: a start and an end score for every token."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.model.config import BertConfig
from bertforge.model.heads import feature_size, token_features
from bertforge.tasks.base import FineTuningModel


@dataclass
class QuestionAnsweringOutput:
    """start_logits, end_logits: [B, T] (padding at the dtype's minimum); loss: mean of the start and end
    cross-entropies over the real tokens."""

    start_logits: torch.Tensor
    end_logits: torch.Tensor
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class BertForQuestionAnswering(FineTuningModel):
    def __init__(self, config: BertConfig):
        super().__init__(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(feature_size(config), 2)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, start_positions=None,
                end_positions=None, output_attentions: bool = False,
                output_hidden_states: bool = False) -> QuestionAnsweringOutput:
        out = self.encode(input_ids, token_type_ids, attention_mask, output_attentions, output_hidden_states)
        logits = self.qa_outputs(token_features(self.config, out))  # [B, T, 2]
        if attention_mask is not None:
            # Padding is never an answer position. Masking it keeps the loss independent of the layout: the
            # padded path gives padding whatever its hidden states score, the padding-free path a zero vector
            # (logit = bias), and with padding inside the softmax the two trained different models.
            logits = logits.masked_fill((attention_mask == 0)[..., None], torch.finfo(logits.dtype).min)
        start_logits, end_logits = logits[..., 0], logits[..., 1]  # [B, T] each
        loss = None
        if start_positions is not None and end_positions is not None:
            # Positions outside the window (answer not in it) point at index 0, the [CLS] token, by the
            # feature builder's convention; anything beyond T is ignored rather than crashing.
            tokens = start_logits.shape[1]
            start = start_positions.long().clamp(0, tokens)
            end = end_positions.long().clamp(0, tokens)
            loss = (F.cross_entropy(start_logits.float(), start, ignore_index=tokens)
                    + F.cross_entropy(end_logits.float(), end, ignore_index=tokens)) / 2
        return QuestionAnsweringOutput(start_logits, end_logits, loss, out.hidden_states, out.attentions)


class QuestionAnsweringTask:
    """Loss (sum, count) for span extraction: the mean of the start and end cross-entropies per window.

    A window without the answer targets index 0 ([CLS]), as the feature builder sets it.
    """

    def counts(self, batch) -> dict[str, torch.Tensor]:
        """Windows in the batch."""
        return {"span_cross_entropy": torch.tensor(float(batch.start_positions.shape[0]))}

    def loss_terms(self, output: QuestionAnsweringOutput, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        start = F.cross_entropy(output.start_logits.float(), batch.start_positions.long(), reduction="sum")
        end = F.cross_entropy(output.end_logits.float(), batch.end_positions.long(), reduction="sum")
        count = output.start_logits.new_tensor(float(batch.start_positions.shape[0]))
        return {"span_cross_entropy": ((start + end) / 2, count)}

    def metrics(self, output: QuestionAnsweringOutput, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        start = output.start_logits.detach().argmax(-1) == batch.start_positions
        end = output.end_logits.detach().argmax(-1) == batch.end_positions
        count = output.start_logits.new_tensor(float(start.shape[0]))
        return {"span_accuracy": ((start & end).sum().float(), count)}
