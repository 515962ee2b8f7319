"""Heads that sit on the encoder: the masked-LM head, the classifier head and feature selection.

The task models of `bertforge.families` combine `BertModel` with these; keeping the heads here lets inference
and export reuse them without importing training code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.constants import IGNORE_INDEX
from bertforge.model.bert import BertOutput, IndexableOutput, activation
from bertforge.model.config import BertConfig


@dataclass
class TaskOutput(IndexableOutput):
    """logits: [B, C] (sequence), [B, T, C] (tokens), [B, C] choices; loss: scalar when labels were given.
    `outputs[0]` is the loss when there is one, else the logits (transformers' order)."""

    tuple_fields = ("loss", "logits", "hidden_states", "attentions")

    logits: torch.Tensor
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def masked_lm_sums(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The masked-LM loss as the training loop aggregates it: (cross-entropy summed over the labelled
    tokens, how many of them the top logit gets right, how many there are), three float 0-dim tensors.

    logits [..., V] and labels [...] (original token ids, `IGNORE_INDEX` where there is nothing to predict)."""
    flat_logits = logits.flatten(0, -2).float()  # [..., V] -> [N, V]
    flat_labels = labels.flatten().long()  # [N]
    real = flat_labels != IGNORE_INDEX
    loss_sum = F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX, reduction="sum")
    correct = ((flat_logits.argmax(-1) == flat_labels) & real).sum().float()
    return loss_sum, correct, real.sum().float()


class MlmHead(nn.Module):
    """Transform (dense, activation, LayerNorm) then a decoder tied to the word embeddings, with its own bias.

    The decoder weight is not a parameter of this head: the caller passes the word-embedding matrix, so
    the tie cannot come undone when weights are loaded or moved, and saved files hold it once.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.act = activation(config.hidden_act)

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        # [..., H] -> [..., V]
        return F.linear(self.norm(self.act(self.transform(hidden))), word_embeddings, self.bias)


class ClassifierHead(nn.Module):
    """1-3 hidden layers (width, activation, dropout) then the output layer: the optional deeper head."""

    def __init__(self, in_features: int, num_outputs: int, hidden_sizes: list[int], dropout: float, act: str):
        super().__init__()
        widths = [in_features, *hidden_sizes]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.out = nn.Linear(widths[-1], num_outputs)
        self.dropout = nn.Dropout(dropout)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.hidden:
            x = self.dropout(self.act(layer(x)))
        return self.out(x)


def build_classifier(config: BertConfig, in_features: int, num_outputs: int) -> nn.Module:
    """The paper's single linear layer by default (Hugging Face's `classifier`), else a `ClassifierHead`."""
    if not config.classifier_hidden_sizes:
        return nn.Linear(in_features, num_outputs)
    return ClassifierHead(in_features, num_outputs, list(config.classifier_hidden_sizes), config.head_dropout, "relu")


def feature_size(config: BertConfig) -> int:
    """Width of the features the task head receives (H, or H times the number of chosen layers)."""
    return config.hidden_size * (len(config.feature_layers) if config.feature_layers else 1)


def needs_hidden_states(config: BertConfig) -> bool:
    return bool(config.feature_layers)


def token_features(config: BertConfig, output: BertOutput) -> torch.Tensor:
    """Per-token features [B, T, H * k]: the last layer, or the chosen layers concatenated."""
    if not config.feature_layers:
        return output.last_hidden_state
    return torch.cat([output.hidden_states[i] for i in config.feature_layers], dim=-1)


def sequence_features(config: BertConfig, output: BertOutput) -> torch.Tensor:
    """Per-sequence features [B, H * k]: the pooled [CLS], or the chosen layers' [CLS] vectors concatenated."""
    if not config.feature_layers:
        return output.pooled_output
    return token_features(config, output)[:, 0]


def score_lists(score_rows: Callable[..., TaskOutput], num_labels: int, input_ids: torch.Tensor,
                *inputs: torch.Tensor | None, labels: torch.Tensor | None = None) -> TaskOutput:
    """A one-output pair classifier's scores of lists of pairs (listwise reranking, BERT's and ModernBERT's):
    input_ids and each of `inputs` (token types, mask, positions; None stays None) [B, L, T] run as the rows
    [B*L, T] of one batch through `score_rows` (the classifier on rows), logits [B*L, 1] -> [B, L]."""
    if labels is not None or num_labels != 1:
        raise ValueError("lists of inputs [B, L, T] are scored by a one-output model, without labels (their loss "
                         "is the reranking family's)")
    lists, count, tokens = input_ids.shape

    def flat(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else x.reshape(lists * count, tokens)  # [B, L, T] -> [B*L, T]

    out = score_rows(flat(input_ids), *(flat(x) for x in inputs))
    return TaskOutput(out.logits.view(lists, count), None, out.hidden_states, out.attentions)
