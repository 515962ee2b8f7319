"""`BertForPretraining`: the encoder with the masked-LM and next-sentence heads, and their losses.

The MLM head runs only at the masked positions the batch names (`mlm_positions`, about 15% of tokens), not
over all T: the [M, V] logits are the largest tensor of pretraining and most of them would be thrown away.
The model returns loss *sums and counts*; the training loop divides by the count across micro-batches and
ranks, so a step's loss is the mean over every masked token it saw, however the batch was split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.constants import IGNORE_INDEX
from bertforge.errors import DataError
from bertforge.model.bert import BertModel, BertPretrainedModel
from bertforge.model.config import BertConfig
from bertforge.model.heads import MlmHead


@dataclass
class PretrainingOutput:
    """mlm_logits: [B, M, V] at the given positions ([B, T, V] when none are given); nsp_logits: [B, 2]
    ([S, 2] for S packed sequences).

    With labels: `loss` (this batch's mean MLM + mean NSP loss) and the float sums/counts the loop
    aggregates: mlm_loss_sum, mlm_correct, mlm_count, nsp_loss_sum, nsp_correct, nsp_count (0-dim tensors).
    """

    mlm_logits: torch.Tensor
    nsp_logits: torch.Tensor
    loss: torch.Tensor | None = None
    mlm_loss_sum: torch.Tensor | None = None
    mlm_correct: torch.Tensor | None = None
    mlm_count: torch.Tensor | None = None
    nsp_loss_sum: torch.Tensor | None = None
    nsp_correct: torch.Tensor | None = None
    nsp_count: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class BertForPretraining(BertPretrainedModel):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.mlm = MlmHead(config)
        self.nsp = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        mlm_positions: torch.Tensor | None = None,
        mlm_labels: torch.Tensor | None = None,
        nsp_labels: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        sequence_ids: torch.Tensor | None = None,
    ) -> PretrainingOutput:
        """Args beyond BertModel's:
            mlm_positions: long [B, M], indices into T of the masked tokens (padding rows: any index).
            mlm_labels: long [B, M], original token ids, IGNORE_INDEX where the row is padding.
            nsp_labels: long [B], 0 = segment B follows A, 1 = B is random (Google's convention); with
                packed rows (`sequence_ids`), one label per sequence, [S], in row-major order.
        """
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states=output_hidden_states,
                        output_attentions=output_attentions, sequence_ids=sequence_ids)
        hidden = out.last_hidden_state  # [B, T, H]
        if mlm_positions is not None:
            index = mlm_positions.long()[..., None].expand(-1, -1, hidden.shape[-1])  # [B, M] -> [B, M, H]
            hidden = hidden.gather(1, index)  # [B, T, H] -> [B, M, H]
        mlm_logits = self.mlm(hidden, self.bert.embeddings.word.weight)  # [B, M, V]
        nsp_logits = self.nsp(out.pooled_output)  # [B, 2] (or [S, 2] packed)
        result = PretrainingOutput(mlm_logits, nsp_logits, hidden_states=out.hidden_states,
                                   attentions=out.attentions)
        if mlm_labels is None and nsp_labels is None:
            return result

        zero = nsp_logits.new_zeros((), dtype=torch.float32)
        if mlm_labels is not None:
            flat_logits = mlm_logits.flatten(0, -2).float()  # [B*M, V]
            flat_labels = mlm_labels.flatten().long()  # [B*M]
            real = flat_labels != IGNORE_INDEX
            result.mlm_loss_sum = F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX,
                                                  reduction="sum")
            result.mlm_count = real.sum().float()
            result.mlm_correct = ((flat_logits.argmax(-1) == flat_labels) & real).sum().float()
        else:
            result.mlm_loss_sum = result.mlm_count = result.mlm_correct = zero
        if nsp_labels is not None:
            # NSP labels are never ignored: both 0 and 1 are real targets (a classic bug ignores label 0).
            result.nsp_loss_sum = F.cross_entropy(nsp_logits.float(), nsp_labels.long(), reduction="sum")
            result.nsp_count = nsp_logits.new_tensor(float(nsp_labels.numel()), dtype=torch.float32)
            result.nsp_correct = (nsp_logits.argmax(-1) == nsp_labels).sum().float()
        else:
            result.nsp_loss_sum = result.nsp_count = result.nsp_correct = zero
        result.loss = (result.mlm_loss_sum / result.mlm_count.clamp(min=1.0)
                       + result.nsp_loss_sum / result.nsp_count.clamp(min=1.0))
        return result


class PretrainingTask:
    """How the training loop trains and evaluates `BertForPretraining`.

    Loss terms `mlm` (summed over labelled masked tokens) and `nsp` (summed over sequences), each divided
    by its own count over the whole step, so the loss is mean MLM + mean NSP however the batch is split;
    metrics `mlm_acc` and `nsp_acc`. A batch without NSP labels (MLM-only pretraining) contributes 0 to
    `nsp` with count 0.
    """

    def counts(self, batch) -> dict[str, torch.Tensor]:
        """Denominators from the batch alone: labelled masked tokens, and sequences with an NSP label."""
        mlm = (batch.mlm_labels != IGNORE_INDEX).sum().float()
        nsp_labels = getattr(batch, "nsp_labels", None)
        nsp = mlm.new_tensor(0.0 if nsp_labels is None else float(nsp_labels.numel()))
        return {"mlm": mlm, "nsp": nsp}

    def loss_terms(self, output: PretrainingOutput, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {"mlm": (output.mlm_loss_sum, output.mlm_count), "nsp": (output.nsp_loss_sum, output.nsp_count)}

    def metrics(self, output: PretrainingOutput, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {"mlm_acc": (output.mlm_correct, output.mlm_count), "nsp_acc": (output.nsp_correct, output.nsp_count)}

    @torch.no_grad()
    def evaluate(self, model: BertForPretraining, batches) -> dict[str, float]:
        """Held-out loss and accuracy: mlm_loss, mlm_acc, nsp_loss, nsp_acc and loss (their sum).

        Args:
            model: the model (put in eval mode for the call, then restored).
            batches: a re-iterable of held-out batches (the same ones every call, so numbers compare);
                under torch.distributed, each rank's shard, summed over ranks.
        """
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        totals = torch.zeros(6, dtype=torch.float64, device=device)
        # How often each token is a masked target: the share of the most frequent one is the accuracy of
        # always guessing it, the floor that MLM accuracy must clear to show the model learned anything.
        label_counts = torch.zeros(model.config.vocab_size, dtype=torch.float64, device=device)
        try:
            for batch in batches:
                batch = batch.to(device)
                out = model(**batch.model_inputs())
                totals += torch.stack([out.mlm_loss_sum, out.mlm_correct, out.mlm_count, out.nsp_loss_sum,
                                       out.nsp_correct, out.nsp_count]).double()
                labels = batch.mlm_labels[batch.mlm_labels != IGNORE_INDEX]
                label_counts += torch.bincount(labels, minlength=label_counts.numel()).double()
        finally:
            model.train(was_training)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(totals)
            torch.distributed.all_reduce(label_counts)
        if float(totals[2] + totals[5]) == 0:
            raise DataError("the held-out batches are empty; check the held-out split of the data directory")
        mlm_loss, mlm_correct, mlm_count, nsp_loss, nsp_correct, nsp_count = totals.tolist()
        values = {"mlm_loss": mlm_loss / max(mlm_count, 1.0), "mlm_acc": mlm_correct / max(mlm_count, 1.0),
                  "mlm_majority_acc": float(label_counts.max()) / max(mlm_count, 1.0)}
        if nsp_count:
            values.update(nsp_loss=nsp_loss / nsp_count, nsp_acc=nsp_correct / nsp_count)
        values["loss"] = values["mlm_loss"] + values.get("nsp_loss", 0.0)
        return values
