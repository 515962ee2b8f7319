"""The ModernBERT encoder (Warner et al., 2024, "Smarter, Better, Faster, Longer"), readable top to bottom,
with its heads: masked LM and sequence classification. The tagger (token classification, with its optional
CRF), the span head (question answering) and the choice head (multiple choice) live with their families
(`families.tagging`, `families.question_answering`, `families.multiple_choice`), beside BERT's, whose objective,
output and padding rules they share; they are built from the parts here (`ModernBertClassifier`,
`PredictionHead`, `classifier_pool`).

What differs from `model/bert.py`: no position or token-type table (rotary position embeddings instead, θ
`global_rope_theta` on global layers and `local_rope_theta` on local ones); pre-LayerNorm layers (norm ->
attention -> add, norm -> GeGLU feed-forward -> add) with a norm after the embeddings, none before the first
layer's attention, and a final norm; one fused query/key/value projection; no biases by default; every
`global_attn_every_n_layers`-th layer attends globally and the others to a sliding window of
`local_attention` tokens (half each side); a prediction head (dense, activation, norm) before the MLM
decoder and the classifiers, and no pooler.

What is the same is shared: the token layouts and their attention (`model/layouts.py`: padded with a
banded mask for local layers, or only the real tokens, attended per sequence within the window), the output
types and the activations (`model/bert.py`), saving and loading (`checkpoint_format`, with the Hugging Face
names in `interop/modernbert.py`). A task model keeps its encoder as `.bert`, as BERT's do, so the fast-path
switches and the engine find it.

Shape legend: B batch, T tokens per row, H hidden size, N heads, D head size (H / N), I intermediate size,
V vocabulary, C labels, R real tokens of a batch. In the encoder `x` is [B, T, H] padded, [R, H] unpadded;
rotary tables are [B, T, D] padded, [R, D] unpadded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.errors import InputError
from bertforge.model.bert import BertOutput, BertPretrainedModel, activation
from bertforge.model.config.modernbert import GLOBAL_ATTENTION, LOCAL_ATTENTION, ModernBertConfig
from bertforge.model.heads import (
    ClassifierHead,
    TaskOutput,
    build_classifier,
    feature_size,
    masked_lm_sums,
    needs_hidden_states,
    score_lists,
    token_features,
)
from bertforge.model.layouts import Padded, Unpadded, choose_layout, packed_positions


def rotary_tables(positions: torch.Tensor, head_size: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin of the rotary angles (Su et al., 2021), float32: long positions [...] -> two [..., D].

    Feature pair (j, j + D/2) of a token at position p turns by p / theta^(2j / D). The sin table's first half
    is negated (-sin, sin), so that `rotate` is x cos + swap(x) sin, one pass fewer than negating x's half."""
    inverse = 1.0 / (theta ** (torch.arange(0, head_size, 2, dtype=torch.float, device=positions.device) / head_size))
    angles = positions[..., None].float() * inverse  # [..., 1] * [D/2] -> [..., D/2]
    sin = angles.sin()
    return torch.cat((angles, angles), dim=-1).cos(), torch.cat((-sin, sin), dim=-1)  # [..., D] each


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate queries and keys: x [..., K, N, D] (K of them, the query and key of each token), cos and signed sin
    [..., D] (`rotary_tables`) -> [..., K, N, D] in x's dtype (the turn itself in float32, so bf16 positions far
    into a long sequence keep their angle): (a, b) -> (a cos - b sin, b cos + a sin) per feature pair.

    x cos, then each half adds the other half times its sin in place: no swapped copy of x is made (a traced graph
    keeps the out-of-place form, the one an exporter reads)."""
    half = x.shape[-1] // 2
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    cos, sin = cos[..., None, None, :], sin[..., None, None, :]  # [..., D] -> [..., 1, 1, D]
    turned = wide * cos
    if torch.jit.is_tracing():
        swapped = torch.cat((wide[..., half:], wide[..., :half]), dim=-1)  # (a, b) -> (b, a), [..., K, N, D]
        return torch.addcmul(turned, swapped, sin).to(x.dtype)
    turned[..., :half].addcmul_(wide[..., half:], sin[..., :half])  # a cos - b sin
    turned[..., half:].addcmul_(wide[..., :half], sin[..., half:])  # b cos + a sin
    return turned.to(x.dtype)


def norm(config: ModernBertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


class Embeddings(nn.Module):
    """Token embeddings, then a norm: the positions enter as rotations inside attention."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.norm = norm(config)
        self.dropout = nn.Dropout(config.embedding_dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.norm(self.word(input_ids)))  # [B, T] -> [B, T, H]


class SelfAttention(nn.Module):
    """Fused QKV projection, rotary positions on queries and keys, attention (global, or within `window`
    positions), output projection. No norm or residual: the layer owns those (pre-LN)."""

    def __init__(self, config: ModernBertConfig, window: int | None):
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.window = window  # None: global attention
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=config.attention_bias)
        self.output = nn.Linear(hidden, hidden, bias=config.attention_bias)
        self.dropout = nn.Dropout(config.attention_dropout)
        self.attention_dropout = config.attention_dropout

    def forward(self, x: torch.Tensor, layout: Padded | Unpadded, rotation: tuple[torch.Tensor, torch.Tensor],
                return_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: [B, T, H] (or [R, H] unpadded), rotation: cos and sin [B, T, D] (or [R, D]).
        Returns (like x, probabilities [B, N, T, T] or None)."""
        qkv = self.qkv(x).unflatten(-1, (3, self.num_heads, -1))  # [..., H] -> [..., 3H] -> [..., 3, N, D]
        q, k = rotate(qkv[..., :2, :, :], *rotation).flatten(-2).unbind(-2)  # [..., 2, N, D] -> 2 x [..., H]
        v = qkv[..., 2, :, :].flatten(-2)  # [..., N, D] -> [..., H]
        dropout = self.attention_dropout if self.training else 0.0
        context, probs = layout.attend(q, k, v, self.num_heads, dropout, return_probs, self.window)  # like x
        return self.dropout(self.output(context)), probs


class FeedForward(nn.Module):
    """GeGLU: H -> 2I, one half through the activation gates the other, I -> H."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.up = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.dropout = nn.Dropout(config.mlp_dropout)
        self.act = activation(config.hidden_activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.up(x).chunk(2, dim=-1)  # [..., H] -> [..., 2I] -> 2 x [..., I]
        return self.down(self.dropout(self.act(value) * gate))  # [..., I] -> [..., H]


class Layer(nn.Module):
    """x + attention(norm(x)), then x + feed_forward(norm(x)). The first layer's attention reads the
    embeddings' own norm, so it has none of its own."""

    def __init__(self, config: ModernBertConfig, index: int):
        super().__init__()
        self.kind = config.attention_kinds[index]
        window = None if self.kind == GLOBAL_ATTENTION else config.window_radius
        self.attention_norm = nn.Identity() if index == 0 else norm(config)
        self.attention = SelfAttention(config, window)
        self.feed_forward_norm = norm(config)
        self.feed_forward = FeedForward(config)

    def forward(self, x: torch.Tensor, layout: Padded | Unpadded, rotation: tuple[torch.Tensor, torch.Tensor],
                return_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        attended, probs = self.attention(self.attention_norm(x), layout, rotation, return_probs)
        x = x + attended
        return x + self.feed_forward(self.feed_forward_norm(x)), probs


class Encoder(nn.Module):
    """The layers, then the final norm."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.layers = nn.ModuleList(Layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = norm(config)

    def forward(self, x: torch.Tensor, layout: Padded | Unpadded,
                rotations: dict[str, tuple[torch.Tensor, torch.Tensor]], output_hidden_states: bool = False,
                output_attentions: bool = False) -> tuple[torch.Tensor, list | None, list | None]:
        """x in the layout's shape -> (normed last layer's x, L + 1 hidden states [B, T, H]: the embeddings,
        then each layer's output, the last one normed, as transformers reports them; L maps [B, N, T, T])."""
        hidden_states = [layout.leave(x)] if output_hidden_states else None
        attentions = [] if output_attentions else None
        for layer in self.layers:
            x, probs = layer(x, layout, rotations[layer.kind], output_attentions)
            if hidden_states is not None:
                hidden_states.append(layout.leave(x))
            if attentions is not None:
                attentions.append(probs)
        x = self.norm(x)
        if hidden_states is not None:
            hidden_states[-1] = layout.leave(x)
        return x, hidden_states, attentions


class ModernBertPretrainedModel(BertPretrainedModel):
    """Base of the ModernBERT models: saving and loading as BERT's (`BertPretrainedModel`), ModernBERT's
    initialisation; a task model with `config.freeze_encoder` keeps its encoder fixed (no gradients, no
    dropout), as BERT's task models do."""

    config_class = ModernBertConfig

    def freeze(self) -> None:
        if self.config.freeze_encoder and hasattr(self, "bert"):
            self.bert.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        if self.config.freeze_encoder and hasattr(self, "bert"):
            self.bert.eval()
        return self

    def initialise(self, wanted: Callable[[str], bool]) -> None:
        """Truncated normal weights cut at `initializer_cutoff_factor` standard deviations, as the reference:
        σ = initializer_range for embeddings and input projections (QKV, GeGLU up), σ / sqrt(2L) for output
        projections and prediction heads, H^-1/2 for classifiers; zero biases, unit norms; for the parameters
        whose state-dict name is `wanted` (`init_weights`)."""
        config = self.config
        std = config.initializer_range
        stds = {"in": std, "out": std / math.sqrt(2.0 * config.num_hidden_layers),
                "final": config.hidden_size ** -0.5}
        names = {module: name for name, module in self.named_modules(prefix="")}

        def init(module: nn.Module, kind: str) -> None:
            at = f"{names[module]}." if names[module] else ""
            sigma = stds[kind]
            cutoff = config.initializer_cutoff_factor * sigma
            if wanted(at + "weight"):
                nn.init.trunc_normal_(module.weight, mean=0.0, std=sigma, a=-cutoff, b=cutoff)
            if getattr(module, "bias", None) is not None and wanted(at + "bias"):
                nn.init.zeros_(module.bias)

        for module in self.modules():
            if isinstance(module, nn.LayerNorm) and wanted(f"{names[module]}.weight"):
                nn.init.ones_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, Embeddings):
                init(module.word, "in")
            elif isinstance(module, SelfAttention):
                init(module.qkv, "in")
                init(module.output, "out")
            elif isinstance(module, FeedForward):
                init(module.up, "in")
                init(module.down, "out")
            elif isinstance(module, PredictionHead):
                init(module.dense, "out")
        classifier = getattr(self, "classifier", None)
        if isinstance(classifier, nn.Linear):
            init(classifier, "final")
        elif isinstance(classifier, ClassifierHead):  # the deeper classifier: its hidden layers read the head
            for layer in classifier.hidden:
                init(layer, "in")
            init(classifier.out, "final")


class ModernBertModel(ModernBertPretrainedModel):
    """The ModernBERT encoder: input ids -> hidden states [B, T, H] (no pooler: heads pool for themselves).

    `unpad` (default True) skips padding tokens in every matmul (`fast_paths.set_fast_paths` switches it);
    `check_values` (default True) checks the token ids against the vocabulary (`fast_paths.set_value_checks`).
    """

    check_values = True

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        self.unpad = True
        self.init_weights()

    def check_inputs(self, input_ids: torch.Tensor) -> None:
        """Turn the cryptic index errors of out-of-range inputs into messages that say what to do."""
        if input_ids.dim() != 2:
            raise InputError(f"input_ids must be [batch, tokens], got shape {tuple(input_ids.shape)}")
        tokens, limit = input_ids.shape[1], self.config.max_position_embeddings
        if tokens > limit:
            raise InputError(f"sequence of {tokens} tokens is longer than max_position_embeddings={limit}; "
                             "truncate it or split it into windows with a stride")
        if input_ids.numel() and self.check_values:
            low, high, vocab = int(input_ids.min()), int(input_ids.max()), self.config.vocab_size
            if low < 0 or high >= vocab:
                raise InputError(f"token id {low if low < 0 else high} is outside the vocabulary (size {vocab}); "
                                 "was the text encoded with this model's tokenizer.json?")

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                sequence_ids: torch.Tensor | None = None, compute_masked: bool = False) -> BertOutput:
        """Encode a batch (arguments in `BertModel.forward`'s order, so every caller of an encoder, the engine's
        row chunks among them, can call this).

        Args:
            input_ids: long [B, T]. attention_mask: [B, T], 1 for real tokens, 0 for padding (default all 1).
            token_type_ids: accepted from callers that build BERT's features, and unused: ModernBERT has no
                segments.
            position_ids: long [B, T] or [T] (default 0..T-1, restarting with every packed sequence).
            sequence_ids: long [B, T] for packed rows (`data.collate.pack_rows`), replacing attention_mask:
                k > 0 for the k-th sequence of its row, 0 for padding. Each sequence attends only to itself
                (a local layer's window stops at its ends) and its rotary positions start at 0: its outputs
                are those of the sequence alone in a row of its own.
            compute_masked: also compute the positions `attention_mask` hides from attention (no token attends
                to them, they attend to the real ones: ColBERT's query expansion); runs padded.
        """
        self.check_inputs(input_ids)
        batch, tokens = input_ids.shape
        if position_ids is None:  # packed rows: each sequence's rotations start at 0, as if it ran alone
            position_ids = torch.arange(tokens, device=input_ids.device) if sequence_ids is None \
                else packed_positions(sequence_ids)  # [T] or [B, T]
        # (packed rows: each sequence attends to itself, local layers within the window inside it)
        layout = choose_layout(attention_mask, sequence_ids, unpad=self.unpad and not compute_masked,
                               output_attentions=output_attentions)
        positions = position_ids.reshape(-1, tokens)  # [T], [1, T] or [B, T] -> [1 or B, T]: rows that share
        # positions share one table (made once, not per row), expanded to the batch without a copy when padded

        def tables(theta: float) -> tuple[torch.Tensor, torch.Tensor]:
            turns = rotary_tables(positions, self.config.head_size, theta)  # [1 or B, T, D] each
            return tuple(layout.enter(t.expand(batch, tokens, -1)) for t in turns)  # layout's [B, T, D] or [R, D]

        rotations = {GLOBAL_ATTENTION: tables(self.config.global_rope_theta),
                     LOCAL_ATTENTION: tables(self.config.local_rope_theta)}
        x = layout.enter(self.embeddings(input_ids))  # [B, T, H] -> layout's
        x, hidden_states, attentions = self.encoder(x, layout, rotations, output_hidden_states, output_attentions)
        x = hidden_states[-1] if hidden_states else layout.leave(x)  # -> [B, T, H]
        return BertOutput(last_hidden_state=x, pooled_output=None,
                          hidden_states=tuple(hidden_states) if hidden_states is not None else None,
                          attentions=tuple(attentions) if attentions is not None else None)


class PredictionHead(nn.Module):
    """Dense, activation, norm: before the MLM decoder and before every classifier. Its input is H wide, or
    `in_features` (a classifier's layer features: H times the number of chosen layers)."""

    def __init__(self, config: ModernBertConfig, in_features: int | None = None):
        super().__init__()
        self.dense = nn.Linear(in_features or config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = activation(config.classifier_activation)
        self.norm = norm(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))  # [..., H or H*k] -> [..., H]


@dataclass
class MaskedLmOutput(TaskOutput):
    """`TaskOutput` whose logits [B, T, V] (or [B, M, V] at `mlm_positions`) also read as `mlm_logits`, the
    name the pretraining family's fill-mask reads; ModernBERT has no next-sentence head.

    With `mlm_labels`: `loss` (the mean over labelled tokens) and the float sums the pretraining loop
    aggregates across micro-batches and ranks: mlm_loss_sum, mlm_correct, mlm_count (0-dim tensors)."""

    nsp_logits = None
    mlm_loss_sum: torch.Tensor | None = None
    mlm_correct: torch.Tensor | None = None
    mlm_count: torch.Tensor | None = None

    @property
    def mlm_logits(self) -> torch.Tensor:
        return self.logits


class ModernBertForMaskedLM(ModernBertPretrainedModel):
    """Encoder, prediction head, then a decoder tied to the word embeddings with its own bias: logits
    [B, T, V], or [B, M, V] at `mlm_positions` (long [B, M]: only the masked tokens go through the head). The
    decoder weight is the embedding matrix itself (saved once). With `mlm_labels` it is the model
    `bertforge pretrain --arch modernbert` trains (masked LM only: no next-sentence head)."""

    next_sentence = False  # no NSP head: a pretraining batch's `nsp_labels` are ignored

    encoder_prefix = "bert."
    head_prefixes = ("head.", "decoder_bias")

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.bert = ModernBertModel(config)
        self.head = PredictionHead(config)
        self.decoder_bias = nn.Parameter(torch.zeros(config.vocab_size)) if config.decoder_bias else None
        self.init_weights()
        self.freeze()

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, *, position_ids: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                mlm_positions: torch.Tensor | None = None, mlm_labels: torch.Tensor | None = None,
                nsp_labels: torch.Tensor | None = None, sequence_ids: torch.Tensor | None = None) -> MaskedLmOutput:
        """Args beyond the encoder's (a pretraining batch's, `data.collate.PretrainingBatch`):
            mlm_positions: long [B, M], indices into T of the tokens to predict (only they go through the head).
            mlm_labels: long [B, M] (or [B, T] without positions), original ids, IGNORE_INDEX where nothing is
                predicted.
            nsp_labels: accepted from pretraining batches and unused: ModernBERT has no next-sentence head.
        """
        out = self.bert(input_ids, None, attention_mask, position_ids=position_ids,
                        output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                        sequence_ids=sequence_ids)
        hidden = out.last_hidden_state  # [B, T, H]
        if mlm_positions is not None:
            index = mlm_positions.long()[..., None].expand(-1, -1, hidden.shape[-1])  # [B, M] -> [B, M, H]
            hidden = hidden.gather(1, index)  # [B, T, H] -> [B, M, H]
        logits = F.linear(self.head(hidden), self.bert.embeddings.word.weight, self.decoder_bias)  # [..., V]
        result = MaskedLmOutput(logits=logits, hidden_states=out.hidden_states, attentions=out.attentions)
        if mlm_labels is not None:
            result.mlm_loss_sum, result.mlm_correct, result.mlm_count = masked_lm_sums(logits, mlm_labels)
            result.loss = result.mlm_loss_sum / result.mlm_count.clamp(min=1.0)
        return result


def classifier_pool(config: ModernBertConfig, hidden: torch.Tensor, attention_mask: torch.Tensor | None
                    ) -> torch.Tensor:
    """What a sequence head scores, by `classifier_pooling`: [B, T, F] -> [B, F] (F: H, or H*k layer
    features), the first token ([CLS]: our rows are padded on the right, so it is also the first real one), or
    the mean over the real tokens."""
    if config.classifier_pooling == "cls":
        return hidden[:, 0]
    if attention_mask is None:
        return hidden.mean(dim=1)
    weights = attention_mask.to(hidden.dtype)[:, :, None]  # [B, T] -> [B, T, 1]
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1)


class ModernBertClassifier(ModernBertPretrainedModel):
    """What every ModernBERT classifier holds, as transformers' heads do: the encoder, the prediction head,
    dropout and a linear `classifier` of `classifier_width(config)` outputs (the subclasses say what they pool
    and how the scores are read); with `config.classifier_hidden_sizes` the classifier is BERT's deeper one
    (`heads.ClassifierHead`: hidden layers before the output, which transformers' classes do not have).

    With `config.feature_layers` (BERT's feature-based approach, usually with `freeze_encoder`) the token
    features are the chosen hidden states concatenated, [B, T, H*k] (`heads.token_features`: index 0 the
    embeddings, -1 the final-normed last layer, as `output_hidden_states` reports them), and the prediction
    head's dense layer reads H*k inputs; pooling, where a head pools, pools these features."""

    encoder_prefix = "bert."
    head_prefixes = ("head.", "classifier.")

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.bert = ModernBertModel(config)
        self.head = PredictionHead(config, feature_size(config))
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = build_classifier(config, config.hidden_size, self.classifier_width(config))
        self.init_weights()
        self.freeze()

    @staticmethod
    def classifier_width(config: ModernBertConfig) -> int:
        return config.num_labels

    def encode_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                        position_ids: torch.Tensor | None, output_hidden_states: bool = False,
                        output_attentions: bool = False) -> tuple[BertOutput, torch.Tensor]:
        """Run the encoder (without autograd when it is frozen) -> (its output, the token features the head
        reads: [B, T, H], or [B, T, H*k] with `config.feature_layers`)."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.config.freeze_encoder):
            out = self.bert(input_ids, None, attention_mask, position_ids=position_ids,
                            output_hidden_states=output_hidden_states or needs_hidden_states(self.config),
                            output_attentions=output_attentions)
        return out, token_features(self.config, out)

    def adopt_directory(self, folder: Path, stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Before its weights load (`checkpoint_format.load_model`): a masked LM's prediction head reads H, one
        on layer features H*k; from a directory without a classifier (a pretrained encoder) such a head starts
        fresh, as the classifier does. A stored classifier keeps its head: another width there is an error
        that names the fix (a fresh head). The head's names are transformers' as ours."""
        dense = stored.get("head.dense.weight")
        if dense is None or dense.shape[-1] == self.head.dense.in_features \
                or any(name.startswith("classifier.") for name in stored):
            return stored
        return {name: value for name, value in stored.items() if not name.startswith("head.")}


class ModernBertForSequenceClassification(ModernBertClassifier):
    """Pool ([CLS], or the mean of the real tokens: `classifier_pooling`), prediction head, dropout,
    classifier: logits [B, C]. A one-output model (a cross-encoder) also scores lists of pairs [B, L, T] ->
    logits [B, L], as BERT's does (`score_lists`: listwise reranking)."""

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, *, position_ids: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False) -> TaskOutput:
        if input_ids.dim() == 3:  # [B, L, T] -> [B, L] (position_ids, when given, [B, L, T])
            return score_lists(lambda ids, mask, positions: self.forward(
                ids, None, mask, position_ids=positions, output_hidden_states=output_hidden_states,
                output_attentions=output_attentions), self.config.num_labels, input_ids, attention_mask, position_ids)
        out, features = self.encode_features(input_ids, attention_mask, position_ids, output_hidden_states,
                                             output_attentions)
        pooled = self.head(classifier_pool(self.config, features, attention_mask))  # [B, T, H*k] -> [B, H]
        logits = self.classifier(self.dropout(pooled))  # [B, C]
        return TaskOutput(logits=logits, hidden_states=out.hidden_states, attentions=out.attentions)
