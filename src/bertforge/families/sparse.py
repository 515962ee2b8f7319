"""Sparse (SPLADE) vectors: one weight per vocabulary term, from a masked-LM head (BERT's or ModernBERT's).

Owns: SPLADE pooling (`splade_pool`, the one home of it: log(1 + relu(MLM logit)) of every real token, then the
maximum (or sum) over the tokens the attention mask marks real), the models (`SparseEncoderModel`:
`BertForSparseEmbedding`, the encoder and BERT's `MlmHead`, and `ModernBertForSparseEmbedding`, ModernBERT's
encoder and masked-LM head, each saved as Hugging Face's masked LM of its encoder with sentence-transformers'
SparseEncoder modules beside it), the family (`SparseEmbedding`: the `embed-sparse` route, its options, its
features and decoding into ``{"indices": [...], "values": [...]}``, dev retrieval scoring; its training hooks
are `SparseEmbeddingTraining`) and top-k pruning of terms (`prune`).

Memory and work: the [rows, T, V] logits are the largest tensor (32 texts of 256 tokens are 1 GB in float32),
so they are made `LOGIT_BUDGET` floats at a time and reduced at once. With max pooling the reduction is taken
on the raw logits and log(1 + relu(.)) applied to the [rows, V] maxima: both are monotonic, so the result is the
same number. With max pooling over BERT's head the decoder's product and the maximum are one autograd step
(`MaxLogits`): each text's logits stop at its last real token (texts of like length are pieced together, so a
short query beside long paragraphs makes no logits for its padding), and the backward sends each active term's
gradient to its winning token only, a few hundred [H] rows per text instead of the [T, V] gradient through the
decoder (the same gradient as autograd's through the plain path, tested; `fast=False` is the plain path).

The training objective (in-batch negatives + FLOPS) is `families.sparse_objective`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertforge.data.embedding import TextGroup
from bertforge.data.finetuning import Feature, FinetuneBatch
from bertforge.errors import ConfigError, InputError
from bertforge.families.base import Family, LossSettings
from bertforge.families.embedding import Embedding, EmbeddingTraining, SentenceOutput
from bertforge.families.sparse_objective import SparseObjective, sparse_loss
from bertforge.interop.sentence_transformers import (
    SPLADE_ACTIVATIONS,
    SPLADE_STRATEGIES,
    SentenceSettings,
    sparse_settings_files,
)
from bertforge.metrics.sparse import SparseRows, sparse_retrieval_figures
from bertforge.model.bert import BertModel, BertPretrainedModel
from bertforge.model.config import BertConfig
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.heads import MlmHead
from bertforge.model.modernbert import ModernBertModel, ModernBertPretrainedModel, PredictionHead

# Floats of MLM logits made at once ([rows, T, V]); 2**25 is 128 MiB in float32.
LOGIT_BUDGET = 1 << 25
RANKING_METRICS = ("ndcg@10", "mrr@10", "accuracy@1", "recall@10", "query_terms", "document_terms")
FORMAT_COLUMNS: dict[str, dict[str, Any]] = {
    "sparse-pairs": {"text_a_column": "anchor", "text_b_column": "positive"},
    "sparse-triplets": {"text_a_column": "anchor", "text_b_column": "positive", "negative_column": "negative"},
}


def activate(x: torch.Tensor, activation: str) -> torch.Tensor:
    """log(1 + relu(x)), and a second log1p for "log1p_relu" (OpenSearch's variant)."""
    y = torch.log1p(torch.relu(x))
    return torch.log1p(y) if activation == "log1p_relu" else y


class MaxLogits(torch.autograd.Function):
    """The maximum over real tokens of `features @ weight.T + bias` ([B, T, H] -> [B, V] float32), at most
    `budget` logits at a time. Backward: the gradient autograd gives through the dense [B, T, V] logits, where every entry
    but each (row, term)'s winning token gets 0, computed from the winners of the terms with a gradient alone."""

    @staticmethod
    def forward(ctx, features, weight, bias, real, budget):
        batch, tokens = real.shape
        # Each text up to its last real token only, texts of like extent together, at most `budget` logits at
        # once: a short query batched with long paragraphs makes no logits for its padding (the decoder's
        # [T, V] product is most of a step's work).
        positions = torch.arange(1, tokens + 1, device=real.device)
        extents = (real * positions).amax(1).tolist()  # [B]: 1 + the last real position (0: no real token)
        order = sorted(range(batch), key=lambda i: -extents[i])
        values = features.new_empty((batch, weight.shape[0]), dtype=torch.float32)
        winners = torch.zeros((batch, weight.shape[0]), dtype=torch.long, device=features.device)
        start = 0
        while start < batch:
            extent = max(1, extents[order[start]])  # the longest of this piece (sorted longest first)
            stop = min(batch, start + max(1, budget // (extent * weight.shape[0])))
            rows = torch.tensor(order[start:stop], device=features.device)
            logits = F.linear(features[rows, :extent], weight, bias).float()  # [b, t, V]
            best = logits.masked_fill(~real[rows, :extent, None], float("-inf")).max(1)
            values[rows], winners[rows] = best.values, best.indices  # [b, V]: the token of each term's maximum
            start = stop
        ctx.save_for_backward(features, weight, winners)
        ctx.bias_dtype, ctx.budget = bias.dtype, budget
        return values

    @staticmethod
    def backward(ctx, grad):
        features, weight, winners = ctx.saved_tensors
        grad = grad.float()
        # Only the (text, term) pairs with a gradient matter: after log(1 + relu(.)) those are the text's active
        # terms (tens to hundreds of V), each sending its gradient to its winning token alone.
        rows, terms = torch.nonzero(grad, as_tuple=True)  # [K]
        positions = rows * features.shape[1] + winners[rows, terms]  # [K]: the winner in the [B x T] rows
        flat = features.reshape(-1, features.shape[-1])  # [B x T, H]
        decoder = weight.float()
        grad_features = torch.zeros(flat.shape, dtype=torch.float32, device=features.device)
        grad_weight = torch.zeros_like(decoder)
        step = max(1, ctx.budget // features.shape[-1])  # [k, H] pieces: as many floats as the forward's logits
        for start in range(0, positions.shape[0], step):
            piece = slice(start, start + step)
            scale = grad[rows[piece], terms[piece]][:, None]  # [k, 1]
            # d logit[t, v] / d features[t] = weight[v];  d logit[t, v] / d weight[v] = features[t]
            grad_features.index_add_(0, positions[piece], scale * decoder[terms[piece]])
            grad_weight.index_add_(0, terms[piece], scale * flat[positions[piece]].float())
        return (grad_features.view(features.shape).to(features.dtype), grad_weight.to(weight.dtype),
                grad.sum(0).to(ctx.bias_dtype), None, None)


def splade_pool(hidden: torch.Tensor, attention_mask: torch.Tensor, head: Any, *, pooling: str = "max",
                activation: str = "relu", budget: int = LOGIT_BUDGET, fast: bool = True) -> torch.Tensor:
    """SPLADE vectors [B, V] (float32) of hidden states [B, T, H]; `head(hidden [b, T, H]) -> logits [b, T, V]`
    with `head.width` = V (and, for `MaxLogits`, `head.decoder(hidden) -> (features, weight, bias)`).

    Padding never counts (a padded position cannot win the maximum or add to the sum); weights are >= 0 and
    most are exactly 0."""
    batch, tokens = hidden.shape[:2]
    real = attention_mask.bool()[..., None]  # [B, T, 1]
    rows = max(1, budget // max(1, tokens * head.width))
    if pooling == "max" and fast and hasattr(head, "decoder"):
        features, weight, bias = head.decoder(hidden)
        return activate(MaxLogits.apply(features, weight, bias, real[..., 0], budget), activation)
    pieces = []
    for start in range(0, batch, rows):
        logits = head(hidden[start:start + rows]).float()  # [b, T, V]
        mask = real[start:start + rows]
        if pooling == "max":
            # max commutes with the monotonic activation: reduce first (see the module docstring).
            pieces.append(activate(logits.masked_fill(~mask, float("-inf")).max(1).values, activation))
        else:
            pieces.append(activate(logits, activation).masked_fill(~mask, 0.0).sum(1))
    return torch.cat(pieces)  # [B, V]


def prune(weights: torch.Tensor, max_terms: int) -> torch.Tensor:
    """Keep each row's `max_terms` largest weights (0 or more than the non-zero ones: all), zero the rest."""
    if not max_terms or max_terms >= weights.shape[-1]:
        return weights
    values, columns = weights.topk(max_terms, dim=-1)
    return torch.zeros_like(weights).scatter_(-1, columns, values)


def nonzero_row(weights: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(term ids int32 ascending, weights float32) of the non-zero entries of one vector [V]."""
    columns = torch.nonzero(weights, as_tuple=True)[0]
    return columns.to(torch.int32).cpu().numpy(), weights[columns].float().cpu().numpy()


class _Head:
    """A model's masked-LM head bound to its tied decoder weight (`SpladeRows.mlm_decoder`), as `splade_pool`
    calls it."""

    def __init__(self, model: SpladeRows):
        self.model = model
        self.width = model.config.vocab_size

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(*self.decoder(hidden))  # [B, T, H] -> [B, T, V]

    def decoder(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the head's features [B, T, H] before its decoder, the decoder weight [V, H], its bias [V])."""
        return self.model.mlm_decoder(hidden)


class SpladeRows:
    """SPLADE vectors from a model's encoder (`bert`) and masked-LM head (`mlm_decoder`): what every masked LM
    gives. `BertForSparseEmbedding` and `ModernBertForSparseEmbedding` are such models; so are the pretraining
    family's BERT models, so that a plain masked-LM directory (SPLADE-tiny as shipped, `bert-base-uncased`) also
    serves `embed-sparse`, pooled by the maximum."""

    # The pooling and activation without a SparseEncoder directory's own (`SparseEncoderModel` sets those).
    sparse = SentenceSettings(similarity="dot", splade="max")
    fast_max = True  # `MaxLogits` for max pooling; False: the plain autograd path

    def mlm_decoder(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features [B, T, H] before the decoder, its weight [V, H], its bias [V]): BERT's `MlmHead` (`mlm`),
        transform, activation and norm, tied to the word embeddings."""
        mlm = self.mlm
        return mlm.norm(mlm.act(mlm.transform(hidden))), self.bert.embeddings.word.weight, mlm.bias

    def sparse_rows(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                    attention_mask: torch.Tensor, pooling: str | None = None,
                    activation: str | None = None) -> torch.Tensor:
        """SPLADE vectors [N, V] of rows [N, T] (the model's own pooling and activation unless given)."""
        hidden = self.bert(input_ids, token_type_ids, attention_mask).last_hidden_state  # [N, T, H]
        return splade_pool(hidden, attention_mask, _Head(self), pooling=pooling or self.sparse.splade or "max",
                           activation=activation or self.sparse.splade_activation, fast=self.fast_max)


class SparseEncoderModel(SpladeRows):
    """A masked LM pooled into SPLADE vectors over the vocabulary: `BertForSparseEmbedding` and
    `ModernBertForSparseEmbedding` are this with their encoder and head.

    Given rows (input_ids [B, T]) it returns `SentenceOutput.embeddings` [B, V]; given texts grouped per
    example ([B, C, T], training) [B, C, V]. `sparse` holds the directory's settings (SPLADE pooling,
    activation, window, prompts); it saves as its encoder's masked-LM directory with the SparseEncoder modules.
    """

    def start_sparse(self) -> None:
        self.sparse = SentenceSettings(similarity="dot", splade="max")
        self.fast_max = True

    def directory_files(self) -> dict[str, str]:
        return sparse_settings_files(self.sparse, self.config.vocab_size)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, **kwargs: Any) -> SentenceOutput:
        shape = input_ids.shape
        ids = input_ids.reshape(-1, shape[-1])  # [B, C, T] -> [B*C, T] (rows stay rows)
        types = torch.zeros_like(ids) if token_type_ids is None else token_type_ids.reshape(ids.shape)
        mask = torch.ones_like(ids) if attention_mask is None else attention_mask.reshape(ids.shape)
        vectors = self.sparse_rows(ids, types, mask).view(*shape[:-1], -1)  # [..., V]
        return SentenceOutput(last_hidden_state=vectors, pooled_output=None, embeddings=vectors)


class BertForSparseEmbedding(SparseEncoderModel, BertPretrainedModel):
    """BERT's encoder and masked-LM head (`MlmHead`) as a SPLADE model (`SparseEncoderModel`); saved as a
    Hugging Face `BertForMaskedLM` directory with the SparseEncoder modules."""

    encoder_prefix = "bert."
    head_prefixes = ("mlm.",)

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.mlm = MlmHead(config)
        self.start_sparse()
        self.init_weights()


class ModernBertForSparseEmbedding(SparseEncoderModel, ModernBertPretrainedModel):
    """ModernBERT's encoder and masked-LM head (its prediction head, then the decoder tied to the word
    embeddings with its own bias: `ModernBertForMaskedLM`'s, the same parameter names) as a SPLADE model
    (`SparseEncoderModel`); saved as a Hugging Face `ModernBertForMaskedLM` directory with the SparseEncoder
    modules. What a ModernBERT masked-LM directory loads as when sparse vectors are asked of it."""

    encoder_prefix = "bert."
    head_prefixes = ("head.", "decoder_bias")

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.bert = ModernBertModel(config)
        self.head = PredictionHead(config)
        self.decoder_bias = nn.Parameter(torch.zeros(config.vocab_size)) if config.decoder_bias else None
        self.start_sparse()
        self.init_weights()

    def mlm_decoder(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        weight = self.bert.embeddings.word.weight  # [V, H]
        bias = self.decoder_bias if self.decoder_bias is not None else weight.new_zeros(weight.shape[0])
        return self.head(hidden), weight, bias


@dataclass(frozen=True)
class SparseVector:
    """One text's sparse vector: term ids (int32, ascending) and their weights (float32, > 0)."""

    indices: np.ndarray
    values: np.ndarray


class SparseEmbeddingTraining(EmbeddingTraining):
    """What fine-tuning asks of sparse embedding: its `--format` columns, the training model, the in-batch
    negatives + FLOPS objective and the task's pooling and activation on the model."""

    settings = frozenset({"head.loss", "head.symmetric", "head.query_regularizer", "head.document_regularizer",
                          "head.regularizer_warmup", "data.negative_column"})

    def format_reader(self, format_name: str) -> dict[str, Any]:
        return dict(FORMAT_COLUMNS[format_name])

    @property
    def trained_class(self) -> type[BertForSparseEmbedding]:
        return BertForSparseEmbedding

    def objective_for(self, config: BertConfig, loss: LossSettings | None = None) -> SparseObjective:
        if loss is not None and (loss.class_weights is not None or loss.focal_gamma):
            raise ConfigError("class weights and focal loss apply to classification and tagging, not to sparse "
                              "training; remove head.class_weights / head.focal_gamma")
        return SparseObjective(sparse_loss(loss.contrastive if loss is not None else None))

    def prepare_model(self, model: torch.nn.Module, task: Any, loss: LossSettings | None) -> None:
        """The task's pooling, activation and window, saved in the trained model's SparseEncoder files."""
        sparse_loss(loss.contrastive if loss is not None else None)  # refuse unsupported settings early
        if task.options["max_terms"]:
            raise ConfigError("max_terms prunes vectors after training; remove it from the training run")
        model.sparse = replace(model.sparse, splade=task.options["pooling"], splade_activation=task.options["activation"],
                               max_seq_length=task.inputs.max_seq_length)


class SparseEmbedding(Embedding):
    """Sparse (SPLADE) vectors from a BERT with a masked-LM head: one weight per vocabulary term, most 0.

    Options: `pooling` over the tokens ("max", SPLADE v2 and later; "sum", the first SPLADE), `activation`
    ("relu": log(1 + relu(logit)); "log1p_relu": once more log1p), `max_terms` (keep the largest that many
    weights of each text; 0 keeps all), `tokens` (also give each term's vocabulary token). A text longer than the window is truncated to it. Scores between
    sparse vectors are dot products. The embedding family's text features and its reading of pairs and
    triplets are shared.
    """

    name = "sparse_embedding"
    aliases = ("sparse", "splade", "embed-sparse")
    model_class = BertForSparseEmbedding
    also_runs_on = (SpladeRows,)
    task = "embed-sparse"
    default_max_seq_length = 512
    long_inputs = True
    options = {"pooling": "max", "activation": "relu", "max_terms": 0, "tokens": False}
    formats = dict.fromkeys(FORMAT_COLUMNS)
    training_hooks = SparseEmbeddingTraining
    export_outputs = {"embeddings": {0: "batch"}}
    runs_as_graph = False  # the call's pooling and activation options run inside the model (`sparse_rows`)
    example_inputs = ["What is the capital of France?", "Paris is the capital and largest city of France."]

    # --- options ------------------------------------------------------------------------------------
    def validate_options(self, options: dict[str, Any]) -> None:
        if options["pooling"] not in SPLADE_STRATEGIES:
            raise InputError(f"pooling must be one of {SPLADE_STRATEGIES} for sparse vectors, got {options['pooling']!r}")
        if options["activation"] not in SPLADE_ACTIVATIONS:
            raise InputError(f"activation must be one of {SPLADE_ACTIVATIONS}, got {options['activation']!r}")
        terms = options["max_terms"]
        if isinstance(terms, bool) or not isinstance(terms, int) or terms < 0:
            raise InputError(f"max_terms must be an integer >= 0 (0 keeps every term), got {terms!r}")
        if not isinstance(options["tokens"], bool):
            raise InputError(f"tokens must be true or false, got {options['tokens']!r}")

    def check_options(self, options: Mapping[str, Any], config: BertConfig | None = None) -> dict[str, Any]:
        return Family.check_options(self, options, config)

    def directory_options(self, sentence: SentenceSettings | None) -> dict[str, Any]:
        """A SparseEncoder directory's pooling and activation, as sentence-transformers runs them."""
        if sentence is None or sentence.splade is None:
            return {}
        return {"pooling": sentence.splade, "activation": sentence.splade_activation}

    def metric_defaults(self, kind: str | None, reader: Any = None) -> tuple[str, ...]:
        return RANKING_METRICS

    def metric_names(self, task, dev_examples=None) -> tuple[str, ...]:
        return RANKING_METRICS

    def read(self, path, *, part, task, report, labelled=True) -> list[TextGroup]:
        if task.reader.label_column is not None:
            raise ConfigError(f"{task.name}: sparse training reads pairs or triplets, not scored pairs; remove "
                              "--label (data.label_column)")
        return super().read(path, part=part, task=task, report=report, labelled=labelled)

    # --- running ------------------------------------------------------------------------------------
    def forward(self, model: torch.nn.Module, batch: FinetuneBatch,
                options: Mapping[str, Any] | None = None) -> list[Any]:
        """One `SparseVector` per row (a list of them per group of texts): the model's SPLADE vector, pruned
        to `max_terms`."""
        options = self.options if options is None else options
        if not callable(getattr(model, "sparse_rows", None)):  # a BertForSparseEmbedding, or an engine running one
            raise InputError(f"sparse vectors need a model with a masked-LM head; this is a {type(model).__name__}")
        ids, types, mask = batch.input_ids, batch.token_type_ids, batch.attention_mask
        grouped = ids.dim() == 3
        if grouped:  # [B, C, T] -> [B*C, T]
            ids, types, mask = (x.reshape(-1, x.shape[-1]) for x in (ids, types, mask))
        weights = prune(model.sparse_rows(ids, types, mask, options["pooling"], options["activation"]),
                        options["max_terms"])  # [N, V]
        vectors = [SparseVector(*nonzero_row(row)) for row in weights]
        if grouped:
            count = batch.input_ids.shape[1]
            return [vectors[i:i + count] for i in range(0, len(vectors), count)]
        return vectors

    # --- outputs ------------------------------------------------------------------------------------
    def decode(self, examples: Sequence[str | TextGroup], features: Sequence[Feature], outputs: Sequence[Any],
               options: Mapping[str, Any], config: BertConfig, tokenizer: Any = None) -> list[dict[str, Any]]:
        """``{"indices": [...], "values": [...]}`` per text (term ids ascending, non-zero weights only; with the
        `tokens` option also `"tokens"`, each term's vocabulary entry); a training group's result holds its
        texts' vectors (`vectors`) for `score`."""
        results = []
        for example, output in zip(examples, outputs):
            if isinstance(example, TextGroup):
                results.append({"vectors": list(output)})
                continue
            result = {"indices": output.indices.tolist(), "values": output.values.tolist()}
            if options.get("tokens"):
                if tokenizer is None:
                    raise InputError("tokens: this call has no tokenizer to name the terms")
                result["tokens"] = tokenizer.convert_ids_to_tokens(result["indices"])
            results.append(result)
        return results

    def record(self, example: TextGroup, result: dict[str, Any]) -> dict[str, Any]:
        return {"id": example.id, "texts": list(example.texts),
                "terms": [len(v.indices) for v in result["vectors"]]}

    def score(self, examples, results, config, **settings):
        """Every dev anchor retrieves among all dev positives by dot product (its own is the one relevant text;
        equal texts are one document): nDCG@10, MRR@10, accuracy@1, recall@10, and the average number of
        non-zero terms of the queries and of the documents."""
        documents: dict[str, int] = {}
        for index, example in enumerate(examples):
            documents.setdefault(example.texts[1], index)
        queries = SparseRows.from_vectors([r["vectors"][0] for r in results], config.vocab_size)
        corpus = SparseRows.from_vectors([results[i]["vectors"][1] for i in documents.values()], config.vocab_size)
        query_ids = [f"q{i}" for i in range(len(examples))]
        qrels = {q: {f"d{documents[e.texts[1]]}": 1.0} for q, e in zip(query_ids, examples)}
        figures = sparse_retrieval_figures(queries, corpus, query_ids, [f"d{i}" for i in documents.values()], qrels)
        return {name: figures[name] for name in RANKING_METRICS}, {}, []


FAMILY = SparseEmbedding()
