"""What every fine-tuning task model shares: an encoder that may be frozen for feature-based use."""

from __future__ import annotations

import torch

from bertforge.model.bert import BertModel, BertOutput, BertPretrainedModel
from bertforge.model.config import BertConfig
from bertforge.model.heads import needs_hidden_states


class FineTuningModel(BertPretrainedModel):
    """Holds `self.bert`; with `config.freeze_encoder` the encoder is fixed (no gradients, no dropout).

    Freezing gives the feature-based approach of the BERT paper (section 5.3): the head learns on top of
    fixed contextual features, optionally concatenated from several layers (`config.feature_layers`).
    """

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=add_pooling_layer)
        if config.freeze_encoder:
            self.bert.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        if self.config.freeze_encoder:
            self.bert.eval()
        return self

    def encode(self, input_ids, token_type_ids=None, attention_mask=None, output_attentions=False,
               output_hidden_states=False) -> BertOutput:
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.config.freeze_encoder):
            return self.bert(input_ids, token_type_ids, attention_mask,
                             output_hidden_states=output_hidden_states or needs_hidden_states(self.config),
                             output_attentions=output_attentions)
