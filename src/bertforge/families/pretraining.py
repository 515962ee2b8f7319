"""Pretraining: the encoder with the masked-LM and next-sentence heads, their objective, and fill-mask.

Owns: the models (`BertForPretraining`: MLM + NSP, Google's recipe; `BertForMaskedLM`: MLM only, as RoBERTa,
Cramming and later recipes train, without NSP head or pooler; ModernBERT's MLM model is `model.modernbert`'s),
the choice between them (`OBJECTIVES`, `ARCHES`, `PretrainingTraining.model_class_for`), their objective
(MLM + NSP loss sums and counts, the loop's task protocol), held-out evaluation, and the fill-mask pipeline's
inputs and JSON (a pretrained model answers "[MASK]" queries). Pretraining data (corpus, instances, shards, masking, batches) is `bertforge.data`'s.

The MLM head runs only at the masked positions the batch names (`mlm_positions`, about 15% of tokens), not
over all T: the [M, V] logits are the largest tensor of pretraining and most of them would be thrown away.
The model returns loss *sums and counts*; the training loop divides by the count across micro-batches and
ranks, so a step's loss is the mean over every masked token it saw, however the batch was split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.constants import IGNORE_INDEX
from bertforge.data.finetuning import Feature
from bertforge.errors import ConfigError, DataError, InputError
from bertforge.families.base import Family, FamilyTraining, Objective, check_number, text_of
from bertforge.families.sparse import SpladeRows
from bertforge.model.bert import BertModel, BertPretrainedModel, IndexableOutput
from bertforge.model.config import BertConfig
from bertforge.model.heads import MlmHead, masked_lm_sums
from bertforge.model.modernbert import ModernBertForMaskedLM

# `pretrain --objective`: the heads trained, and the loss terms.
OBJECTIVES = ("mlm+nsp", "mlm")
# `pretrain --arch`: the encoder pretrained (BERT's `model/bert.py`, or ModernBERT's `model/modernbert.py`).
ARCHES = ("bert", "modernbert")


@dataclass
class PretrainingOutput(IndexableOutput):
    """mlm_logits: [B, M, V] at the given positions ([B, T, V] when none are given); nsp_logits: [B, 2]
    ([S, 2] for S packed sequences), None for a model without NSP head (`BertForMaskedLM`).

    With labels: `loss` (this batch's mean MLM + mean NSP loss) and the float sums/counts the loop
    aggregates: mlm_loss_sum, mlm_correct, mlm_count, nsp_loss_sum, nsp_correct, nsp_count (0-dim tensors).
    `outputs[0]` is the loss when there is one, then the MLM and NSP logits (transformers' order).
    """

    tuple_fields = ("loss", "mlm_logits", "nsp_logits", "hidden_states", "attentions")

    mlm_logits: torch.Tensor
    nsp_logits: torch.Tensor | None
    loss: torch.Tensor | None = None
    mlm_loss_sum: torch.Tensor | None = None
    mlm_correct: torch.Tensor | None = None
    mlm_count: torch.Tensor | None = None
    nsp_loss_sum: torch.Tensor | None = None
    nsp_correct: torch.Tensor | None = None
    nsp_count: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class BertForPretraining(SpladeRows, BertPretrainedModel):
    """The encoder with the MLM head (decoder tied to the word embeddings) and the NSP head on the pooler."""

    encoder_prefix = "bert."
    head_prefixes = ("mlm.", "nsp.")
    next_sentence = True  # whether the model has the NSP head (and the pooler it reads)

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=self.next_sentence)
        self.mlm = MlmHead(config)
        self.nsp = nn.Linear(config.hidden_size, 2) if self.next_sentence else None
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
                packed rows (`sequence_ids`), one label per sequence, [S], in row-major order. A model without
                NSP head ignores them (pretraining batches always carry them).
        """
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states=output_hidden_states,
                        output_attentions=output_attentions, sequence_ids=sequence_ids)
        hidden = out.last_hidden_state  # [B, T, H]
        if mlm_positions is not None:
            index = mlm_positions.long()[..., None].expand(-1, -1, hidden.shape[-1])  # [B, M] -> [B, M, H]
            hidden = hidden.gather(1, index)  # [B, T, H] -> [B, M, H]
        mlm_logits = self.mlm(hidden, self.bert.embeddings.word.weight)  # [B, M, V]
        nsp_logits = self.nsp(out.pooled_output) if self.nsp is not None else None  # [B, 2] (or [S, 2] packed)
        result = PretrainingOutput(mlm_logits, nsp_logits, hidden_states=out.hidden_states,
                                   attentions=out.attentions)
        if mlm_labels is None and nsp_labels is None:
            return result

        zero = mlm_logits.new_zeros((), dtype=torch.float32)
        if mlm_labels is not None:
            result.mlm_loss_sum, result.mlm_correct, result.mlm_count = masked_lm_sums(mlm_logits, mlm_labels)
        else:
            result.mlm_loss_sum = result.mlm_count = result.mlm_correct = zero
        if nsp_labels is not None and nsp_logits is not None:
            # NSP labels are never ignored: both 0 and 1 are real targets (a classic bug ignores label 0).
            result.nsp_loss_sum = F.cross_entropy(nsp_logits.float(), nsp_labels.long(), reduction="sum")
            result.nsp_count = nsp_logits.new_tensor(float(nsp_labels.numel()), dtype=torch.float32)
            result.nsp_correct = (nsp_logits.argmax(-1) == nsp_labels).sum().float()
        else:
            result.nsp_loss_sum = result.nsp_count = result.nsp_correct = zero
        result.loss = (result.mlm_loss_sum / result.mlm_count.clamp(min=1.0)
                       + result.nsp_loss_sum / result.nsp_count.clamp(min=1.0))
        return result


class BertForMaskedLM(BertForPretraining):
    """MLM only (`pretrain --objective mlm`): the encoder without pooler and the MLM head, as Hugging Face's
    BertForMaskedLM (the name its config.json carries). It loads wherever a BERT loads: fine-tuning starts
    its task head and pooler fresh, fill-mask and export use the MLM head."""

    head_prefixes = ("mlm.",)
    next_sentence = False


class PretrainingObjective(Objective):
    """The training loop's view of `BertForPretraining`.

    Loss terms `mlm` (summed over labelled masked tokens) and `nsp` (summed over sequences), each divided
    by its own count over the whole step, so the loss is mean MLM + mean NSP however the batch is split;
    metrics `mlm_acc` and `nsp_acc`. A batch without NSP labels contributes 0 to `nsp` with count 0. With
    `next_sentence` False (MLM-only pretraining) the terms and metrics are `mlm` and `mlm_acc` alone.
    """

    next_sentence = True  # False: MLM only (the terms and metrics have no `nsp`)

    def __init__(self, next_sentence: bool = True):
        self.next_sentence = next_sentence

    def counts(self, batch) -> dict[str, torch.Tensor]:
        """Denominators from the batch alone: labelled masked tokens, and sequences with an NSP label."""
        mlm = (batch.mlm_labels != IGNORE_INDEX).sum().float()
        if not self.next_sentence:
            return {"mlm": mlm}
        nsp_labels = getattr(batch, "nsp_labels", None)
        nsp = mlm.new_tensor(0.0 if nsp_labels is None else float(nsp_labels.numel()))
        return {"mlm": mlm, "nsp": nsp}

    def loss_terms(self, output: PretrainingOutput, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        if not self.next_sentence:  # the model may have no NSP fields at all (ModernBERT)
            return {"mlm": (output.mlm_loss_sum, output.mlm_count)}
        return {"mlm": (output.mlm_loss_sum, output.mlm_count), "nsp": (output.nsp_loss_sum, output.nsp_count)}

    def metrics(self, output: PretrainingOutput, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        if not self.next_sentence:
            return {"mlm_acc": (output.mlm_correct, output.mlm_count)}
        return {"mlm_acc": (output.mlm_correct, output.mlm_count), "nsp_acc": (output.nsp_correct, output.nsp_count)}


class PretrainingTraining(FamilyTraining):
    """How the pretraining loop trains and evaluates `BertForPretraining` (its `PretrainingObjective`)."""

    def objective_for(self, config: BertConfig, loss=None, next_sentence: bool = True) -> PretrainingObjective:
        self.refuse_loss_settings(loss)
        return PretrainingObjective(next_sentence)

    def model_class_for(self, objective: str, arch: str = "bert") -> type[BertPretrainedModel]:
        """The model an objective trains: `mlm+nsp` -> BertForPretraining, `mlm` -> BertForMaskedLM; for
        ModernBERT (`arch` "modernbert") `mlm` -> ModernBertForMaskedLM, and no NSP (it has no such head)."""
        if objective not in OBJECTIVES:
            raise ConfigError(f"objective={objective!r} is invalid: use one of {OBJECTIVES}")
        if arch not in ARCHES:
            raise ConfigError(f"arch={arch!r} is invalid: use one of {ARCHES}")
        if arch == "modernbert":
            if objective != "mlm":
                raise ConfigError(f"objective={objective!r} does not apply to arch='modernbert': ModernBERT is "
                                  "pretrained with masked LM only (no next-sentence head); use objective mlm")
            return ModernBertForMaskedLM
        return BertForPretraining if objective == "mlm+nsp" else BertForMaskedLM

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
                nsp = [getattr(out, name, None) for name in ("nsp_loss_sum", "nsp_correct", "nsp_count")]
                nsp = [out.mlm_count.new_zeros(()) if value is None else value for value in nsp]  # no NSP head
                totals += torch.stack([out.mlm_loss_sum, out.mlm_correct, out.mlm_count, *nsp]).double()
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


# The mask tokens a fill-mask text may hold: BERT's and ModernBERT's, RoBERTa-style vocabularies'.
MASK_MARKERS = ("[MASK]", "<mask>")


class Pretraining(Family):
    """How a pretrained model fills in [MASK]s; its training is `PretrainingTraining` (`training`)."""

    # --- fill-mask ----------------------------------------------------------------------------------
    # The tokenizer treats "[MASK]" in raw text as plain text (so user text can never inject control
    # tokens); fill-mask therefore finds the markers (the tokenizer's mask token: "[MASK]", "<mask>") in the
    # string itself, tokenizes the pieces between them and puts the mask id in their place, the spaces next to
    # a marker going with it where the tokenizer says so (a tokenizer.json's lstrip/rstrip: ModernBERT's mask
    # takes the space before it), as transformers' fill-mask reads the text. Special tokens are never proposed.
    name = "pretraining"
    aliases = ("pretrain", "mlm", "fill-mask", "masked_lm")
    model_class = BertForPretraining
    task = "fill-mask"
    default_max_seq_length = 512
    options = {"top_k": 5}
    export_outputs = {"mlm_logits": {0: "batch", 1: "sequence"}, "nsp_logits": {0: "batch"}}
    runs_as_graph = False  # fill-mask gathers the masked positions inside the model (`mlm_positions`)
    training_hooks = PretrainingTraining
    example_inputs = ["The capital of France is [MASK].", "I went to the [MASK] to buy some bread.",
                    "She [MASK] the letter and smiled."]

    def validate_options(self, options):
        check_number(options, "top_k", 1, 100, integer=True)

    def parse(self, item: Any) -> str:
        text = text_of(item)
        if not any(marker in text for marker in MASK_MARKERS):
            raise InputError("no [MASK] in the text; put [MASK] (or the model's own mask token, e.g. <mask>) where a "
                             "token should be predicted")
        return text

    def features(self, examples, tokenizer, settings, *, config, report=None, training=False):
        marker = tokenizer.config.mask_token
        left, right = tokenizer.mask_token_strips()
        features = []
        for index, text in enumerate(examples):
            if marker not in text:
                raise InputError(f"input {index}: no {marker} in the text; this model's mask token is {marker}")
            ids: list[int] = []
            positions: list[int] = []
            spans: list[tuple[int, int]] = []
            cursor = 0
            pieces = text.split(marker)
            for number, piece in enumerate(pieces):
                read = piece.rstrip() if left and number < len(pieces) - 1 else piece
                read = read.lstrip() if right and number > 0 else read
                if read:
                    ids += tokenizer.encode(read, add_special_tokens=False).ids
                cursor += len(piece)
                if number < len(pieces) - 1:
                    positions.append(len(ids) + 1)  # +1: [CLS] comes first
                    spans.append((cursor, cursor + len(marker)))
                    ids.append(tokenizer.mask_token_id)
                    cursor += len(marker)
            ids, types = tokenizer.post_processor.assemble(ids)
            if len(ids) > settings.max_seq_length:
                raise InputError(f"input {index}: the text has {len(ids)} tokens, more than this model's limit of "
                                 f"{settings.max_seq_length}; shorten it around the {marker}")
            features.append(Feature(index, ids, types, mask_positions=positions, offsets=spans))
        return features

    def forward(self, model, batch, options=None):
        out = model(**batch.model_inputs(), mlm_positions=batch.mlm_positions)
        logits = out.mlm_logits.float().cpu()  # [B, M, V]
        counts = (batch.mlm_positions > 0).sum(-1).tolist()  # position 0 is [CLS], never a mask
        return [logits[row, :int(n)] for row, n in enumerate(counts)]

    def decode(self, examples, features, outputs, options, config, tokenizer):
        results = []
        for text, feature, logits in zip(examples, features, outputs):
            logits = torch.as_tensor(logits).clone()
            logits[..., tokenizer.all_special_ids] = float("-inf")
            probs = logits.softmax(-1)  # [M, V]
            scores, ids = probs.topk(options["top_k"], dim=-1)
            masks, filled, cursor = [], [], 0
            for row, (start, end) in enumerate(feature.offsets):
                tokens = tokenizer.convert_ids_to_tokens(ids[row].tolist())
                masks.append({"start": start, "end": end, "predictions": [
                    {"token": token, "id": int(i), "score": float(s)}
                    for token, i, s in zip(tokens, ids[row].tolist(), scores[row].tolist())]})
                # The best token as text: a WordPiece continuation without its "##", a byte-level BPE token
                # without the space it carries.
                best = tokenizer.decode(ids[row][:1].tolist(), skip_special_tokens=False).strip()
                filled += [text[cursor:start], best.removeprefix("##")]
                cursor = end
            filled.append(text[cursor:])
            results.append({"masks": masks, "filled": "".join(filled)})
        return results


FAMILY = Pretraining()
