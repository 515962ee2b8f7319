"""Reranking with a cross-encoder: a query and candidate texts in, the candidates ordered by relevance out.

A cross-encoder is a sentence-pair classifier (`BertForSequenceClassification`) that reads the query and one
candidate together, ``[CLS] query [SEP] text [SEP]``, and scores their relevance with one output (the
cross-encoders of sentence-transformers and text-embeddings-inference: `num_labels` 1, relevance =
sigmoid(logit)) or two labels (relevance = the probability of the last one, "relevant"). Fine-tune one as a
pair classifier (`--format pair`, labels 0/1) or a one-output regressor (`--format regression`, scores 0/1).

Owns: the `rerank` route's input (``{"query": ..., "texts": [...]}``), its features (one window per candidate,
the candidate cut to fit: the pair windows of `tokenization.pairs`, long segment second), the relevance rule
above and the route's JSON (``{"results": [{"index", "score", "logit"}...]}``, best first). Bi-encoder top-k
lists are reranked with it in `evaluation.embedding.evaluate_retrieval(..., rerank=...)`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bertforge.data.finetuning import DataReport, Feature
from bertforge.errors import CheckpointError, InputError
from bertforge.families.base import Family, InputSettings, check_number, check_text
from bertforge.families.classification import BertForSequenceClassification
from bertforge.model.config import BertConfig
from bertforge.tokenization.pairs import pair_windows
from bertforge.tokenization.tokenizer import Tokenizer

# How many candidates one request may rank (each is one model input).
MAX_CANDIDATES = 1000


@dataclass(frozen=True)
class RerankQuery:
    """One query and its candidate texts."""

    query: str
    texts: tuple[str, ...]


def relevance(logits: np.ndarray) -> np.ndarray:
    """Relevance in [0, 1] of logits [N, C]: sigmoid of the one output, or the last label's probability."""
    logits = logits.astype(np.float64)
    if logits.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-logits[:, 0]))
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted[:, -1] / shifted.sum(axis=1)


class Reranking(Family):
    """A query's candidates ordered by a cross-encoder's relevance: ``{"query": ..., "texts": [...]}`` ->
    ``{"results": [{"index": i, "score": relevance in [0, 1], "logit": raw output}, ...]}``, best first
    (`top_n` keeps the first n; `return_text` adds each text)."""

    name = "reranking"
    aliases = ("rerank", "cross-encoder")
    model_class = BertForSequenceClassification
    task = "rerank"
    options = {"top_n": None, "return_text": False}
    example_inputs = [{"query": "What is the capital of France?",
                       "texts": ["Paris is the capital of France.", "Berlin is in Germany.", "France is in Europe."]}]

    def check_model(self, config: BertConfig) -> None:
        if config.num_labels not in (1, 2):
            raise CheckpointError(f"reranking needs a pair classifier with one output or two labels (relevant last); "
                                  f"this one has {config.num_labels} labels")

    def serves_by_default(self, config: BertConfig) -> bool:
        """A one-output classifier is a cross-encoder; a two-label one may be any binary classifier (sentiment),
        so it reranks only when asked (`load_pipeline(dir, "rerank")`, `serve --tasks rerank`)."""
        return config.num_labels == 1

    def validate_options(self, options: dict[str, Any]) -> None:
        if options["top_n"] is not None:
            check_number(options, "top_n", 1, None, integer=True)
        if not isinstance(options["return_text"], bool):
            raise InputError("return_text must be true or false")

    def parse(self, item: Any) -> RerankQuery:
        if not isinstance(item, Mapping) or "query" not in item or "texts" not in item:
            raise InputError('expected an object {"query": "...", "texts": ["...", ...]}')
        unknown = sorted(set(item) - {"query", "texts"})
        if unknown:
            raise InputError(f"unknown field(s) {unknown}; an input has query and texts")
        texts = item["texts"]
        if not isinstance(texts, list) or not texts:
            raise InputError("texts must be a non-empty list of strings")
        if len(texts) > MAX_CANDIDATES:
            raise InputError(f"{len(texts)} texts to rank; at most {MAX_CANDIDATES} per query")
        return RerankQuery(check_text(item["query"], "query"),
                           tuple(check_text(t, f"texts[{i}]") for i, t in enumerate(texts)))

    def features(self, examples: Sequence[RerankQuery], tokenizer: Tokenizer, settings: InputSettings, *,
                 config: BertConfig, report: DataReport | None = None, training: bool = False) -> list[Feature]:
        """One ``[CLS] query [SEP] text [SEP]`` window per candidate (`Feature.window` = its index), the
        candidate cut to the room the query leaves."""
        post = tokenizer.post_processor
        features = []
        for index, example in enumerate(examples):
            query = tokenizer.encode(example.query, add_special_tokens=False).ids
            for position, text in enumerate(example.texts):
                ids = tokenizer.encode(text, add_special_tokens=False).ids
                first = pair_windows(query, ids, post, settings.max_seq_length, long="second",
                                     doc_stride=settings.doc_stride).windows[0]
                features.append(Feature(index, first.ids, first.type_ids, window=position))
        return features

    def decode(self, examples: Sequence[RerankQuery], features: Sequence[Feature], outputs: Sequence[Any],
               options: Mapping[str, Any], config: BertConfig, tokenizer: Tokenizer | None = None
               ) -> list[dict[str, Any]]:
        logits = np.stack([np.asarray(o, dtype=np.float64) for o in outputs]) if outputs else np.zeros((0, 1))
        scores = relevance(logits)
        grouped: list[list[tuple[int, float, float]]] = [[] for _ in examples]
        for feature, score, row in zip(features, scores, logits):
            grouped[feature.example_index].append((feature.window, float(score), float(row[-1])))
        results = []
        for example, ranked in zip(examples, grouped):
            ranked.sort(key=lambda item: (-item[1], item[0]))  # best first; ties in input order
            kept = ranked[: options["top_n"]] if options["top_n"] else ranked
            results.append({"results": [{"index": i, "score": s, "logit": raw,  # the relevant output's logit
                                         **({"text": example.texts[i]} if options["return_text"] else {})}
                                        for i, s, raw in kept]})
        return results


FAMILY = Reranking()
