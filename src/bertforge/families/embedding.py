"""Sentence embedding: any model's encoder, pooled over real tokens into one vector per text.

Owns: pooling (`pool`: "cls", "mean" or "max" over the tokens the attention mask marks real, the one home of
it), which encoder a model is embedded with (`encoder_of`: a bare `BertModel`, or a task model's `.bert`),
the per-call options (`pooling`, `normalize`, `layer`) and their checks, the features (one window per text,
truncated to it: a sentence vector of one window), the `embed` route's JSON (``{"embedding": [...]}``) and
the ONNX outputs of a bare encoder (its hidden states and pooled output; pooling stays outside the graph).

The model class is `BertModel`, and every bertforge model holds one (a task model at `.bert`), so every
model directory serves `embed`. Training (`EmbeddingTraining`, the family's `training`) fine-tunes a
`BertForSentenceEmbedding` with the contrastive objectives of `families.contrastive`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from bertforge.data.embedding import TextGroup, read_text_groups
from bertforge.data.finetuning import DataReport, Feature, FinetuneBatch
from bertforge.errors import ConfigError, InputError
from bertforge.families.base import Family, FamilyTraining, InputSettings, LossSettings, text_of
from bertforge.families.contrastive import ContrastiveLoss, ContrastiveObjective
from bertforge.interop.sentence_transformers import SentenceSettings, settings_files
from bertforge.metrics.embedding import normalize_rows, rank_documents, retrieval_scores, sts_scores
from bertforge.model.bert import BertModel, BertOutput
from bertforge.model.config import BertConfig
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.fast_paths import is_encoder
from bertforge.model.modernbert import ModernBertModel
from bertforge.tokenization.tokenizer import Tokenizer

# The `--format`s of embedding training files: their text columns (role order) and score column by default.
FORMAT_COLUMNS: dict[str, dict[str, Any]] = {
    "embedding-pairs": {"text_a_column": "anchor", "text_b_column": "positive"},
    "embedding-triplets": {"text_a_column": "anchor", "text_b_column": "positive", "negative_column": "negative"},
    "embedding-scored": {"text_a_column": "sentence1", "text_b_column": "sentence2", "label_column": "score"},
    # Triplets with a teacher's margin (MarginMSE distillation; `bertforge score-margins` writes them).
    "embedding-margins": {"text_a_column": "anchor", "text_b_column": "positive", "negative_column": "negative",
                          "label_column": "margin"},
    # An anchor's candidates (positive, negatives) with a teacher's score each (KL distillation; `bertforge
    # score-margins --output-format scores` writes them). More negatives: list the columns, comma-separated.
    "embedding-scores": {"text_a_column": "anchor", "text_b_column": "positive", "negative_column": "negative",
                         "label_column": "positive_score,negative_score"},
}
# What a dev evaluation reports: scored pairs their correlations, pairs and triplets a retrieval among the dev
# set's own positives (each anchor's positive is its one relevant text).
SCORED_METRICS = ("spearman_cosine", "pearson_cosine")
RANKING_METRICS = ("ndcg@10", "mrr@10", "accuracy@1", "recall@10")

# One pooling each (several join with "+", concatenated in this order, as sentence-transformers does).
POOLINGS = ("cls", "max", "mean", "mean_sqrt_len", "weightedmean", "lasttoken")


def listed(column: Any) -> list[Any]:
    """A reader column setting as a list: None none, "a,b" two names, anything else itself."""
    if column is None:
        return []
    return [c.strip() for c in column.split(",")] if isinstance(column, str) and "," in column else [column]


def group_columns(reader: Any) -> tuple[list[Any], list[Any]]:
    """(text columns in role order, score columns) of an embedding file's `ReaderSettings`: the negative and
    label settings may list several columns, comma-separated (several negatives; a score per candidate, which
    must then name one column per candidate after the anchor)."""
    texts = [c for c in (reader.text_a_column, reader.text_b_column) if c is not None] + listed(reader.negative_column)
    scores = listed(reader.label_column)
    if len(scores) > 1 and len(scores) != len(texts) - 1:
        raise ConfigError(f"{len(scores)} score columns {scores} for {len(texts) - 1} candidates {texts[1:]}: give "
                          "one score column per candidate (the positive's first), in the candidates' order, e.g. "
                          "--label positive_score,negative_score")
    return texts, scores


def check_pooling(pooling: Any) -> tuple[str, ...]:
    """The modes of a pooling name ("mean", "cls+mean"); InputError naming the bad part."""
    modes = tuple(pooling.split("+")) if isinstance(pooling, str) and pooling else ()
    if not modes or any(mode not in POOLINGS for mode in modes) or len(set(modes)) != len(modes):
        raise InputError(f"pooling must be one of {POOLINGS} (several joined by '+', e.g. 'cls+mean'), "
                         f"got {pooling!r}")
    return tuple(sorted(modes, key=POOLINGS.index))


def vector_width(hidden_size: int, pooling: str) -> int:
    """The length of the vectors a pooling gives: the hidden size per mode (modes joined by '+' concatenate)."""
    return hidden_size * len(check_pooling(pooling))


def pool_one(hidden: torch.Tensor, real: torch.Tensor, mode: str) -> torch.Tensor:
    """One pooling mode over real tokens: hidden [B, T, H], real [B, T, 1] bool -> [B, H]."""
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return hidden.masked_fill(~real, float("-inf")).max(1).values  # [B, T, H] -> [B, H]
    if mode == "lasttoken":
        last = (real.squeeze(-1).sum(1) - 1).clamp(min=0)  # [B]: rows are right-padded
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    weights = real.to(hidden.dtype)  # [B, T, 1]
    if mode == "weightedmean":
        # Token i (1-based) weighs i: later tokens have seen more of the text (SGPT's position weighting).
        weights = weights * torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=hidden.dtype)[:, None]
    total = (hidden * weights).sum(1)  # [B, H]
    count = weights.sum(1).clamp(min=1e-9)  # [B, 1]
    return total / (count.sqrt() if mode == "mean_sqrt_len" else count)


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """One vector per row from its real tokens (padding never counts); the one home of pooling.

    Args:
        hidden: [B, T, H] hidden states.
        attention_mask: [B, T], 1 = real token.
        pooling: "cls" (the [CLS] hidden state), "mean" (the average of every real token, specials included,
            as sentence-transformers does), "max" (the per-feature maximum), "mean_sqrt_len" (the sum over
            the square root of the length), "weightedmean" (token i weighs i), "lasttoken" (the last real
            token, [SEP] for BERT); several joined by "+" are concatenated.

    Returns:
        [B, H × number of modes], in the dtype of `hidden`.
    """
    real = attention_mask.bool()[..., None]  # [B, T, 1]
    vectors = [pool_one(hidden, real, mode) for mode in check_pooling(pooling)]
    return vectors[0] if len(vectors) == 1 else torch.cat(vectors, dim=-1)


def encoder_of(model: torch.nn.Module) -> BertModel:
    """The encoder that embeds for `model`: the model itself when it is a bare `BertModel`, else its `.bert`
    (a task model's encoder serves embed; its head is not run; an engine's `.bert` is its encoder, model-shaped)."""
    if is_encoder(model):  # a bare BertModel or ModernBertModel
        return model
    encoder = getattr(model, "bert", None)
    if not isinstance(encoder, torch.nn.Module):
        raise InputError(f"a {type(model).__name__} holds no BERT encoder to embed with")
    return encoder


@dataclass
class SentenceOutput(BertOutput):
    """`BertOutput` plus `embeddings` [B, C, D]: one pooled vector per text of each example."""

    embeddings: torch.Tensor | None = None


class SentenceEmbedding:
    """What makes an encoder a sentence-embedding model (mixed into `BertModel` and `ModernBertModel`): given texts
    grouped per example (input_ids [B, C, T]) it returns their sentence vectors (`SentenceOutput.embeddings`
    [B, C, D]); given rows [B, T] it is the plain encoder.

    It saves as the encoder's Hugging Face directory with the sentence-transformers modules beside it
    (`directory_files`), so sentence-transformers and text-embeddings-inference load it with the same pooling.
    Its sentence settings (`sentence`) and `rows_per_piece` come from the fine-tuning task
    (`EmbeddingTraining.prepare_model`). With `rows_per_piece`, training runs the texts in pieces of that many rows,
    each under activation checkpointing: a piece's activations are dropped after its forward and recomputed
    in the backward pass one piece at a time, so a batch of any size needs the memory of one piece while
    the loss still sees every text of the batch (the cached multiple-negatives loss; GradCache, Gao et al.
    2021, gets the same gradients the same way).
    """

    sentence: SentenceSettings
    rows_per_piece: int | None

    def start_sentences(self) -> None:
        self.sentence = SentenceSettings()
        self.rows_per_piece = None

    def directory_files(self) -> dict[str, str]:
        width = self.config.hidden_size * len(self.sentence.modes)
        return settings_files(self.sentence, width)

    def pooled_rows(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                    attention_mask: torch.Tensor) -> torch.Tensor:
        """Sentence vectors [N, D] of rows [N, T]."""
        hidden = super().forward(input_ids, token_type_ids, attention_mask).last_hidden_state.float()
        return pool(hidden, attention_mask, self.sentence.pooling)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, *args: Any, **kwargs: Any):
        if input_ids.dim() == 2:
            return super().forward(input_ids, token_type_ids, attention_mask, *args, **kwargs)
        batch, count, tokens = input_ids.shape
        ids = input_ids.reshape(batch * count, tokens)  # [B, C, T] -> [B*C, T]
        types = torch.zeros_like(ids) if token_type_ids is None else token_type_ids.reshape(ids.shape)
        mask = torch.ones_like(ids) if attention_mask is None else attention_mask.reshape(ids.shape)
        piece = self.rows_per_piece
        if piece is None or not (self.training and torch.is_grad_enabled()):
            vectors = self.pooled_rows(ids, types, mask)
        else:
            vectors = torch.cat([checkpoint(self.pooled_rows, ids[i:i + piece], types[i:i + piece],
                                            mask[i:i + piece], use_reentrant=False)
                                 for i in range(0, ids.shape[0], piece)])
        embeddings = vectors.view(batch, count, -1)  # [B*C, D] -> [B, C, D]
        return SentenceOutput(last_hidden_state=embeddings, pooled_output=None, embeddings=embeddings)


class BertForSentenceEmbedding(SentenceEmbedding, BertModel):
    """A `BertModel` that also pools (`SentenceEmbedding`); saved as a Hugging Face `BertModel` directory."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config, add_pooling_layer)
        self.start_sentences()


class ModernBertForSentenceEmbedding(SentenceEmbedding, ModernBertModel):
    """A `ModernBertModel` that also pools (`SentenceEmbedding`); saved as a Hugging Face `ModernBertModel`
    directory: what `finetune --format embedding-*` trains from a ModernBERT directory."""

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.start_sentences()


class EmbeddingTraining(FamilyTraining):
    """What fine-tuning asks of embedding: the `--format` columns, the training model (`BertForSentenceEmbedding`:
    the encoder that pools, saved with its sentence-transformers files), its contrastive objective and the
    task's pooling on it."""

    settings = frozenset({"head.loss", "head.scale", "head.symmetric", "head.mini_batch_size", "head.matryoshka_dims",
                          "head.teacher_temperature", "features.pooling", "features.normalize", "data.negative_column"})

    def format_reader(self, format_name: str) -> dict[str, Any]:
        return dict(FORMAT_COLUMNS[format_name])

    @property
    def trained_class(self) -> type[BertForSentenceEmbedding]:
        return BertForSentenceEmbedding

    def objective_for(self, config: BertConfig, loss: LossSettings | None = None) -> ContrastiveObjective:
        """The objective of the run's `ContrastiveLoss` (`loss.contrastive`; defaults without one); "auto"
        follows each batch (cosent when it has scores). `prepare_model` checks the loss against the data."""
        if loss is not None and (loss.class_weights is not None or loss.focal_gamma):
            raise ConfigError("class weights and focal loss apply to classification and tagging, not to embedding "
                              "training; remove head.class_weights / head.focal_gamma")
        settings = (loss.contrastive if loss is not None else None) or ContrastiveLoss()
        return ContrastiveObjective(settings)

    def prepare_model(self, model: torch.nn.Module, task: Any, loss: LossSettings | None) -> None:
        """The task's pooling and normalization, its window as the saved max_seq_length, and the cached loss's
        mini-batches, on the training model; the pooler (unused by the losses) is frozen so DDP does not wait
        for its gradients."""
        settings = (loss.contrastive if loss is not None else None) or ContrastiveLoss()
        texts, scores = group_columns(task.reader)
        settings.resolved(scored=bool(scores), texts=len(texts), candidate_scores=len(scores) > 1)
        sentence = replace(model.sentence, pooling=task.options["pooling"], normalize=task.options["normalize"],
                           max_seq_length=task.inputs.max_seq_length)
        if task.options["layer"] != -1:
            raise ConfigError("embedding training pools the last layer; remove features.layer")
        model.sentence, model.rows_per_piece = sentence, settings.rows_per_piece
        if getattr(model, "pooler", None) is not None:  # ModernBERT has none
            model.pooler.requires_grad_(False)


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
    long_inputs = True
    input_axes = {0: "batch", 1: "sequence"}
    # token_vectors: every token's vector of the layer instead of one pooled vector (TEI's /embed_all).
    options = {"pooling": "mean", "normalize": False, "layer": -1, "token_vectors": False}
    formats = dict.fromkeys(FORMAT_COLUMNS)
    training_hooks = EmbeddingTraining
    # A bare encoder exports what it computes; pooling a sentence vector happens outside the graph.
    export_outputs = {"last_hidden_state": {0: "batch", 1: "sequence"}, "pooled_output": {0: "batch"}}
    example_inputs = ["A man is eating food.", "A cat sits on the mat.", "The stock market fell sharply today."]

    # --- options ------------------------------------------------------------------------------------
    def validate_options(self, options: dict[str, Any]) -> None:
        check_pooling(options["pooling"])
        if not isinstance(options["normalize"], bool):
            raise InputError("normalize must be true or false")
        layer = options["layer"]
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise InputError(f"layer must be an integer (-1 = last), got {layer!r}")
        if not isinstance(options["token_vectors"], bool):
            raise InputError("token_vectors must be true or false")

    def check_options(self, options: Mapping[str, Any], config: BertConfig | None = None) -> dict[str, Any]:
        """`Family.check_options`, then the layer against the model's depth when the config is known."""
        merged = super().check_options(options, config)
        if config is not None:
            layers = config.num_hidden_layers
            layer = merged["layer"]
            if not -layers - 1 <= layer <= layers:
                raise InputError(f"layer must be an integer in [{-layers - 1}, {layers}] (-1 = last), got {layer!r}")
        return merged

    def directory_options(self, sentence: SentenceSettings | None) -> dict[str, Any]:
        """A sentence-transformers directory's pooling and normalization, as sentence-transformers uses them."""
        if sentence is None or sentence.splade is not None:  # a SparseEncoder's pooling is not a sentence vector's
            return {}
        return {"pooling": sentence.pooling, "normalize": sentence.normalize}

    # --- data files ---------------------------------------------------------------------------------
    def read(self, path, *, part, task, report, labelled=True) -> list[TextGroup]:
        """(anchor, positive[, negative]) groups, or scored pairs when the reader names a label (score) column."""
        reader = task.reader
        texts, scores = group_columns(reader)
        if len(texts) < 2:
            raise ConfigError(f"{task.name}: an embedding file needs two text columns: give --text-a and --text-b "
                              "(data.text_a_column / data.text_b_column)")
        score = (scores if len(scores) > 1 else scores[0] if scores else None) if labelled else None
        return read_text_groups(path, texts=texts, score=score,
                                header=reader.header, file_format=reader.file_format, on_invalid=reader.on_invalid,
                                report=report, id_column=reader.id_column)

    def metric_names(self, task, dev_examples=None) -> tuple[str, ...]:
        return self.metric_defaults(task.kind, task.reader)

    def metric_defaults(self, kind: str | None, reader: Any = None) -> tuple[str, ...]:
        """Scored pairs (the reader names a score column) report correlations; pairs and triplets, scored
        (margins) or not, retrieval."""
        scored = reader is not None and reader.label_column is not None and reader.negative_column is None
        return SCORED_METRICS if scored else RANKING_METRICS

    def labelled(self, examples: Sequence[Any]) -> bool:
        return all(isinstance(e, TextGroup) for e in examples)

    # --- inputs -------------------------------------------------------------------------------------
    def parse(self, item: Any) -> str:
        return text_of(item)

    def features(self, examples: Sequence[str | TextGroup], tokenizer: Tokenizer, settings: InputSettings, *,
                 config: BertConfig, report: DataReport | None = None, training: bool = False) -> list[Feature]:
        """One window per text, cut to `settings.max_seq_length` tokens (special tokens included); a training
        group's texts are the rows of one [C][T] feature, with its score as the label."""
        def window(text: str) -> tuple[list[int], list[int]]:
            encoding = tokenizer.encode(text, truncation="longest_first", max_length=settings.max_seq_length)
            return encoding.ids, encoding.type_ids

        features = []
        for index, example in enumerate(examples):
            if isinstance(example, TextGroup):
                rows = [window(text) for text in example.texts]
                label = list(example.score) if isinstance(example.score, tuple) else example.score
                features.append(Feature(index, [r[0] for r in rows], [r[1] for r in rows], label=label))
            else:
                features.append(Feature(index, *window(example)))
        return features

    # --- running ------------------------------------------------------------------------------------
    def forward(self, model: torch.nn.Module, batch: FinetuneBatch,
                options: Mapping[str, Any] | None = None) -> list[torch.Tensor]:
        """One float32 CPU vector [D] per row (or [C, D] per group of texts): the chosen layer of `model`'s
        encoder, pooled, maybe normalized. `options` are checked options (`check_options`); None: defaults."""
        options = self.options if options is None else options
        layer = options["layer"]
        ids, types, mask = batch.input_ids, batch.token_type_ids, batch.attention_mask
        grouped = ids.dim() == 3
        if grouped:  # [B, C, T] -> [B*C, T]
            ids, types, mask = (x.reshape(-1, x.shape[-1]) for x in (ids, types, mask))
        out = encoder_of(model)(ids, types, mask, output_hidden_states=layer != -1)
        # Pooling in fp32 whatever the autocast precision: sums over many tokens lose little then.
        hidden = (out.last_hidden_state if layer == -1 else out.hidden_states[layer]).float()  # [N, T, H]
        if options["token_vectors"] and not grouped:  # each row's real tokens, special ones included: [t, H]
            return [row[:length].cpu() for row, length in zip(hidden, mask.sum(1).tolist())]
        vectors = pool(hidden, mask, options["pooling"])  # [N, D]
        if options["normalize"]:
            vectors = F.normalize(vectors, dim=-1)
        if grouped:
            vectors = vectors.view(batch.input_ids.shape[0], batch.input_ids.shape[1], -1)  # [B, C, D]
        return list(vectors.cpu())

    # --- outputs ------------------------------------------------------------------------------------
    def decode(self, examples: Sequence[str | TextGroup], features: Sequence[Feature],
               outputs: Sequence[torch.Tensor], options: Mapping[str, Any], config: BertConfig,
               tokenizer: Tokenizer | None = None) -> list[dict[str, Any]]:
        """``{"embedding": [...]}`` per text (one window each, so outputs are in example order); a group's
        result is the cosine of its first text with each other one (``{"cosine": [...]}``) and its vectors."""
        results = []
        for example, vectors in zip(examples, outputs):
            if isinstance(example, TextGroup):
                cosine = F.cosine_similarity(vectors[:1], vectors[1:], dim=-1)
                results.append({"cosine": cosine.tolist(), "vectors": vectors})
            else:
                results.append({"embedding": vectors.tolist()})
        return results

    def record(self, example: TextGroup, result: dict[str, Any]) -> dict[str, Any]:
        return {"id": example.id, "texts": list(example.texts), "score": example.score, "cosine": result["cosine"]}

    def score(self, examples, results, config, **settings):
        """Scored pairs: Pearson and Spearman of the cosine against the scores. Pairs and triplets (margins or not): every
        anchor retrieves among all positives of the set (its own is the one relevant text; equal texts are
        one document), reported as nDCG@10, MRR@10, accuracy@1, recall@10."""
        vectors = np.stack([r["vectors"].numpy() for r in results])  # [N, C, D]
        if examples and examples[0].score is not None and len(examples[0].texts) == 2:
            return sts_scores(vectors[:, 0], vectors[:, 1], [e.score for e in examples]), {}, []
        documents: dict[str, int] = {}
        for index, example in enumerate(examples):
            documents.setdefault(example.texts[1], index)
        doc_ids = [f"d{i}" for i in documents.values()]
        corpus = vectors[list(documents.values()), 1]  # [M, D]
        queries = vectors[:, 0]
        scores = normalize_rows(queries) @ normalize_rows(corpus).T  # [N, M] cosines
        query_ids = [f"q{i}" for i in range(len(examples))]
        qrels = {q: {f"d{documents[e.texts[1]]}": 1.0} for q, e in zip(query_ids, examples)}
        ranked = rank_documents(scores, query_ids, doc_ids, 10)
        figures = retrieval_scores(ranked, qrels, k_values=(1, 10), mrr_at=(10,), ndcg_at=(10,), map_at=(10,))
        return {name: figures[name] for name in RANKING_METRICS}, {}, []


FAMILY = Embedding()
