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
        self.dropout = nn.Dropout(config.head_dropout)
        self.classifier = build_classifier(config, feature_size(config), config.num_labels)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                output_attentions: bool = False, output_hidden_states: bool = False) -> TaskOutput:
        out = self.encode(input_ids, token_type_ids, attention_mask, output_attentions, output_hidden_states)
        logits = self.classifier(self.dropout(sequence_features(self.config, out)))  # [B, C]
        loss = None
        if labels is not None:
            kind = self.problem_type(labels)
            if kind == "regression":
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            elif kind == "multi_label_classification":
                loss = F.binary_cross_entropy_with_logits(logits.float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels.long())
        return TaskOutput(logits, loss, out.hidden_states, out.attentions)

    def problem_type(self, labels: torch.Tensor) -> str:
        """`config.problem_type`, or when unset the one Hugging Face infers: one output means regression
        (a checkpoint with `num_labels: 1` and no problem type must not train on a constant-zero loss),
        float labels over several outputs mean multi-label, integer labels single-label."""
        if self.config.problem_type is not None:
            return self.config.problem_type
        if self.config.num_labels == 1:
            return "regression"
        if labels.is_floating_point():
            return "multi_label_classification"
        return "single_label_classification"

    def initial_loss_reference(self) -> torch.Tensor:
        """log(C): the loss of a uniform guess, a sanity bound for the first steps."""
        return torch.log(torch.tensor(float(self.config.num_labels)))


class SequenceClassificationTask:
    """How the training loop trains a sequence classifier: loss and metric (sum, count) pairs from logits.

    The loop calls the model on `batch.model_inputs()` (no labels), then these; it divides each sum by its
    count accumulated over micro-batches and ranks, so a step's loss is the mean over every example seen.
    Windows of one long example are separate training inputs here (each carries the example's label).

    Args:
        problem_type: the model config's problem type (None = single-label classification).
    """

    def __init__(self, problem_type: str | None = None):
        self.problem_type = problem_type
        self.term = {"regression": "mse", "multi_label_classification": "bce"}.get(problem_type or "", "cross_entropy")

    def counts(self, batch) -> dict[str, torch.Tensor]:
        """Examples in the batch (label entries for multi-label), known before the forward pass."""
        labels = batch.labels
        return {self.term: torch.tensor(float(labels.numel() if self.term == "bce" else labels.shape[0]))}

    def loss_terms(self, output: TaskOutput, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        logits = output.logits.float()  # [B, C]
        labels = batch.labels
        count = self.counts(batch)[self.term].to(logits.device)
        if self.term == "mse":
            loss = ((logits.squeeze(-1) - labels.float()) ** 2).sum()
        elif self.term == "bce":
            loss = F.binary_cross_entropy_with_logits(logits, labels.float(), reduction="sum")
        else:
            loss = F.cross_entropy(logits, labels.long(), reduction="sum")
        return {self.term: (loss, count)}

    def metrics(self, output: TaskOutput, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        logits = output.logits.detach().float()
        labels = batch.labels
        count = logits.new_tensor(float(labels.shape[0]))
        if self.problem_type == "regression":
            return {"abs_error": ((logits.squeeze(-1) - labels.float()).abs().sum(), count)}
        if self.problem_type == "multi_label_classification":
            correct = ((logits > 0) == (labels > 0.5)).float().sum()
            return {"label_accuracy": (correct, logits.new_tensor(float(labels.numel())))}
        return {"accuracy": ((logits.argmax(-1) == labels).float().sum(), count)}
