"""Sentence embedding: any model's encoder, pooled over real tokens into one vector per text.

Owns: pooling (`pool`: "cls", "mean" or "max" over the tokens the attention mask marks real, the one home of
it), which encoder a model is embedded with (`encoder_of`: a bare `BertModel`, or a task model's `.bert`),
the per-call options (`pooling`, `normalize`, `layer`) and their checks, the features (one window per text,
truncated to it: a sentence vector of one window), the `embed` route's JSON (``{"embedding": [...]}``) and
the ONNX outputs of a bare encoder (its hidden states and pooled output; pooling stays outside the graph).

The model class is `BertModel`, and every bertforge model holds one (a task model at `.bert`), so every
model directory serves `embed`. There is no training objective yet: the family is not among the
fine-tuning families of `families.registry`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from bertforge.data.finetuning import DataReport, Feature, FinetuneBatch
from bertforge.errors import InputError
from bertforge.families.base import Family, InputSettings, text_of
from bertforge.model.bert import BertModel
from bertforge.model.config import BertConfig
from bertforge.tokenization.tokenizer import Tokenizer

POOLINGS = ("cls", "mean", "max")


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """One vector per row from its real tokens (padding never counts).

    Args:
        hidden: [B, T, H] hidden states.
        attention_mask: [B, T], 1 = real token.
        pooling: "cls" (the [CLS] hidden state), "mean" (the average of every real token, specials included,
            as sentence-transformers does) or "max" (the per-feature maximum).

    Returns:
        [B, H], in the dtype of `hidden`.
    """
    real = attention_mask.bool()[..., None]  # [B, T, 1]
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "mean":
        return (hidden * real).sum(1) / real.sum(1).clamp(min=1)  # [B, T, H] -> [B, H]
    if pooling == "max":
        return hidden.masked_fill(~real, float("-inf")).max(1).values  # [B, T, H] -> [B, H]
    raise InputError(f"pooling must be one of {POOLINGS}, got {pooling!r}")


def encoder_of(model: torch.nn.Module) -> BertModel:
    """The encoder that embeds for `model`: the model itself when it is a bare `BertModel`, else its `.bert`
    (a task model's encoder serves embed; its head is not run)."""
    if isinstance(model, BertModel):
        return model
    encoder = getattr(model, "bert", None)
    if not isinstance(encoder, BertModel):
        raise InputError(f"a {type(model).__name__} holds no BERT encoder to embed with")
    return encoder


class Embedding(Family):
    """Sentence vectors from any model's encoder.

    Pooling over real tokens only (padding never counts): "cls" (the [CLS] hidden state), "mean" (average of
    every real token, specials included, as sentence-transformers does) or "max" (per-feature maximum);
    `layer` picks the hidden state (-1 last, 0 embeddings); `normalize` scales vectors to unit length.
    A text longer than the window is truncated to it (a sentence vector of one window).
    Raw pretrained BERT vectors are poorly calibrated for cosine similarity (all pairs score high); compare
    ranks, or use a model trained for sentence embeddings (e.g. all-MiniLM-L6-v2) — see docs/serving.md.
    """

    name = "embedding"
    aliases = ("embed", "embeddings", "sentence embedding")
    model_class = BertModel
    task = "embed"
    # BERT's whole window (released checkpoints have 512 positions); the pipelines cap it at the model's limit.
    default_max_seq_length = 512
    input_axes = {0: "batch", 1: "sequence"}
    options = {"pooling": "mean", "normalize": False, "layer": -1}
    # A bare encoder exports what it computes; pooling a sentence vector happens outside the graph.
    export_outputs = {"last_hidden_state": {0: "batch", 1: "sequence"}, "pooled_output": {0: "batch"}}
    example_inputs = ["A man is eating food.", "A cat sits on the mat.", "The stock market fell sharply today."]

    # --- options ------------------------------------------------------------------------------------
    def validate_options(self, options: dict[str, Any]) -> None:
        if options["pooling"] not in POOLINGS:
            raise InputError(f"pooling must be one of {POOLINGS}, got {options['pooling']!r}")
        if not isinstance(options["normalize"], bool):
            raise InputError("normalize must be true or false")
        layer = options["layer"]
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise InputError(f"layer must be an integer (-1 = last), got {layer!r}")

    def check_options(self, options: Mapping[str, Any], config: BertConfig | None = None) -> dict[str, Any]:
        """`Family.check_options`, then the layer against the model's depth when the config is known."""
        merged = super().check_options(options, config)
        if config is not None:
            layers = config.num_hidden_layers
            layer = merged["layer"]
            if not -layers - 1 <= layer <= layers:
                raise InputError(f"layer must be an integer in [{-layers - 1}, {layers}] (-1 = last), got {layer!r}")
        return merged

    # --- inputs -------------------------------------------------------------------------------------
    def parse(self, item: Any) -> str:
        return text_of(item)

    def features(self, examples: Sequence[str], tokenizer: Tokenizer, settings: InputSettings, *,
                 config: BertConfig, report: DataReport | None = None, training: bool = False) -> list[Feature]:
        """One window per text, cut to `settings.max_seq_length` tokens (special tokens included)."""
        features = []
        for index, text in enumerate(examples):
            encoding = tokenizer.encode(text, truncation="longest_first", max_length=settings.max_seq_length)
            features.append(Feature(index, encoding.ids, encoding.type_ids))
        return features

    # --- running ------------------------------------------------------------------------------------
    def forward(self, model: torch.nn.Module, batch: FinetuneBatch,
                options: Mapping[str, Any] | None = None) -> list[torch.Tensor]:
        """One float32 CPU vector [H] per row: the chosen layer of `model`'s encoder, pooled, maybe normalized.

        `options` are checked options (`check_options`); None runs with the defaults.
        """
        options = self.options if options is None else options
        layer = options["layer"]
        out = encoder_of(model)(batch.input_ids, batch.token_type_ids, batch.attention_mask,
                                output_hidden_states=layer != -1)
        # Pooling in fp32 whatever the autocast precision: sums over many tokens lose little then.
        hidden = (out.last_hidden_state if layer == -1 else out.hidden_states[layer]).float()  # [B, T, H]
        vectors = pool(hidden, batch.attention_mask, options["pooling"])  # [B, H]
        if options["normalize"]:
            vectors = F.normalize(vectors, dim=-1)
        return list(vectors.cpu())

    # --- outputs ------------------------------------------------------------------------------------
    def decode(self, examples: Sequence[str], features: Sequence[Feature], outputs: Sequence[torch.Tensor],
               options: Mapping[str, Any], config: BertConfig, tokenizer: Tokenizer | None = None
               ) -> list[dict[str, Any]]:
        """``{"embedding": [...]}`` per text (one window each, so outputs are in example order)."""
        return [{"embedding": vector.tolist()} for vector in outputs]


FAMILY = Embedding()
