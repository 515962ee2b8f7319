"""Reranking with a cross-encoder: a query and candidate texts in, the candidates ordered by relevance out.

A cross-encoder is a sentence-pair classifier (`BertForSequenceClassification`) that reads the query and one
candidate together, ``[CLS] query [SEP] text [SEP]``, and scores their relevance with one output (the
cross-encoders of sentence-transformers and text-embeddings-inference: `num_labels` 1, relevance =
sigmoid(logit)) or two labels (relevance = the probability of the last one, "relevant", or of the label
`scoring_by` names: `serve --rerank-label`). Fine-tune one
pointwise, as a pair classifier (`--format pair`, labels 0/1) or a one-output regressor (`--format
regression`, scores 0/1), or listwise on a query's list of documents (`--format rerank-lists`, this family's
training: ListNet, `listnet_loss`).

Owns: the `rerank` route's input (``{"query": ..., "texts": [...]}``), its features (one window per candidate,
the candidate cut to fit: the pair windows of `tokenization.pairs`, long segment second), the relevance rule
above and the route's JSON (``{"results": [{"index", "score", "logit"}...]}``, best first), and listwise
training: the ListNet objective, its features (one [C][T] feature per list) and the lists' figures (nDCG@10,
MRR@10 of each list ranked by the model). Bi-encoder top-k lists are reranked with it in
`evaluation.embedding.evaluate_retrieval(..., rerank=...)`.

ListNet (Cao et al., 2007), as sentence-transformers' `ListNetLoss` defines it: the cross-entropy between the
softmax of a list's labels and the softmax of the model's logits over its documents, averaged over lists. It
was chosen over LambdaLoss for its single definition with no weighting scheme or NDCG truncation to choose, and
because it needs nothing but a softmax over the list (LambdaLoss ranks better in sentence-transformers' MS MARCO
runs; it can join this family as a second objective over the same features).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from bertforge.data.finetuning import DataReport, Feature
from bertforge.data.reranking import RerankQuery, read_rerank_lists
from bertforge.errors import CheckpointError, InputError
from bertforge.families.base import (
    REGRESSION,
    Family,
    FamilyTraining,
    InputSettings,
    LossSettings,
    Objective,
    check_number,
    check_text,
)
from bertforge.families.classification import BertForSequenceClassification
from bertforge.metrics.embedding import retrieval_scores
from bertforge.model.config import BertConfig
from bertforge.tokenization.pairs import pair_windows
from bertforge.tokenization.tokenizer import Tokenizer

# How many candidates one request may rank (each is one model input).
MAX_CANDIDATES = 1000


def relevance(logits: np.ndarray, relevant: int = -1) -> np.ndarray:
    """Relevance in [0, 1] of logits [N, C]: sigmoid of the one output, or the probability of label `relevant`
    (the last by default)."""
    logits = logits.astype(np.float64)
    if logits.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-logits[:, 0]))
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted[:, relevant] / shifted.sum(axis=1)


# What a list evaluation reports (each list ranked by the model, its labels the relevance).
LIST_METRICS = ("ndcg@10", "mrr@10")


def listnet_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed ListNet loss, correct count) of lists: -sum_i softmax(labels)_i · log softmax(logits)_i per list.

    logits, labels [B, C]; a list shorter than C has NaN labels in its padding, which takes no part in either
    softmax. Correct: the model's best document is one of the highest labelled.
    """
    real = ~labels.isnan()
    logits = logits.float().masked_fill(~real, float("-inf"))
    target = torch.softmax(labels.float().masked_fill(~real, float("-inf")), dim=-1)
    terms = torch.where(real, target * torch.log_softmax(logits, dim=-1), torch.zeros_like(target))
    best = labels.nan_to_num(float("-inf")).amax(-1)
    chosen = labels.gather(1, logits.argmax(-1, keepdim=True)).squeeze(1)
    return -terms.sum(), (chosen == best).float().sum()


class ListNetObjective(Objective):
    """The training loop's view of a cross-encoder trained on lists (`BertForSequenceClassification` given
    [B, C, T] inputs scores each document: logits [B, C]): ListNet per list; accuracy is the lists whose best
    scored document has the highest label."""

    def counts(self, batch) -> dict[str, torch.Tensor]:
        return {"listnet": torch.tensor(float(batch.input_ids.shape[0]))}

    def loss_terms(self, output, batch):
        loss, _ = listnet_loss(output.logits, batch.labels)
        return {"listnet": (loss, loss.new_tensor(float(batch.input_ids.shape[0])))}

    def metrics(self, output, batch):
        _, correct = listnet_loss(output.logits.detach(), batch.labels)
        return {"accuracy": (correct, correct.new_tensor(float(batch.input_ids.shape[0])))}


class RerankingTraining(FamilyTraining):
    """What fine-tuning asks of listwise reranking: the file's keys, a one-output head (a cross-encoder that
    `rerank`, sentence-transformers' `CrossEncoder` and text-embeddings-inference read) and ListNet."""

    def format_reader(self, format_name: str) -> dict[str, Any]:
        return {"text_a_column": "query", "text_b_column": "docs", "label_column": "labels"}

    def head_config(self, label_names, kind=None) -> dict[str, Any]:
        return {"problem_type": REGRESSION, "id2label": None, "label2id": None}

    def objective_for(self, config: BertConfig, loss: LossSettings | None = None) -> ListNetObjective:
        self.refuse_loss_settings(loss)
        return ListNetObjective()


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
    formats = {"rerank-lists": None}
    training_hooks = RerankingTraining
    default_metrics = LIST_METRICS
    # A cross-encoder from elsewhere (no fine-tuning record of this family) reads pairs as long as its position
    # table allows, as sentence-transformers' CrossEncoder and text-embeddings-inference read them: 512 for BERT,
    # a ModernBERT's own length (8,192) past that, since candidates are passages (`long_inputs`).
    served_max_seq_length = 512
    long_inputs = True

    def __init__(self, relevant: int = -1):
        super().__init__()
        self.relevant = relevant  # the label whose probability is the relevance (two-label models)

    def check_model(self, config: BertConfig) -> None:
        if config.num_labels not in (1, 2):
            raise CheckpointError(f"reranking needs a pair classifier with one output or two labels (relevant last); "
                                  f"this one has {config.num_labels} labels")

    def scoring_by(self, label: str, config: BertConfig) -> Reranking:
        """This family scoring relevance as the probability of `label` (a name of the model's labels, or its
        index): a two-label pair classifier whose positive label is not the last (`serve --rerank-label`)."""
        self.check_model(config)
        names = {str(name): int(index) for index, name in (config.id2label or {}).items()}
        if config.num_labels != 2:
            raise CheckpointError("a rerank label is chosen among two labels; this model has one output, whose "
                                  "sigmoid is the relevance: leave the label out")
        index = names.get(label, int(label) if label.isdigit() and int(label) < 2 else None)
        if index is None:
            raise CheckpointError(f"the rerank label {label!r} is not one of this model's labels "
                                  f"{sorted(names) or [0, 1]}; name the label that means relevant")
        return Reranking(relevant=index)

    def serves_by_default(self, config: BertConfig) -> bool:
        """A one-output classifier is a cross-encoder; a two-label one may be any binary classifier (sentiment),
        so it reranks only when asked (`load_pipeline(dir, "rerank")`, `serve --rerank-label LABEL`)."""
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

    def read(self, path, *, part, task, report, labelled=True) -> list[RerankQuery]:
        reader = task.reader
        return read_rerank_lists(path, query_column=reader.text_a_column, docs_column=reader.text_b_column,
                                 labels_column=reader.label_column if labelled else None,
                                 file_format=reader.file_format, on_invalid=reader.on_invalid, report=report)

    def metric_names(self, task, dev_examples=None) -> tuple[str, ...]:
        return LIST_METRICS

    def labelled(self, examples: Sequence[Any]) -> bool:
        return all(isinstance(e, RerankQuery) and e.labels is not None for e in examples)

    def features(self, examples: Sequence[RerankQuery], tokenizer: Tokenizer, settings: InputSettings, *,
                 config: BertConfig, report: DataReport | None = None, training: bool = False) -> list[Feature]:
        """One ``[CLS] query [SEP] text [SEP]`` window per candidate (`Feature.window` = its index), the
        candidate cut to the room the query leaves; for training, a list's windows are the rows of one [C][T]
        feature with its labels (ListNet scores the list at once)."""
        post = tokenizer.post_processor
        features = []
        for index, example in enumerate(examples):
            query = tokenizer.encode(example.query, add_special_tokens=False).ids
            rows = []
            for position, text in enumerate(example.texts):
                ids = tokenizer.encode(text, add_special_tokens=False).ids
                first = pair_windows(query, ids, post, settings.max_seq_length, long="second",
                                     doc_stride=settings.doc_stride).windows[0]
                rows.append(Feature(index, first.ids, first.type_ids, window=position))
            if training:
                features.append(Feature(index, [r.input_ids for r in rows], [r.token_type_ids for r in rows],
                                        label=list(example.labels)))
            else:
                features += rows
        return features

    def decode(self, examples: Sequence[RerankQuery], features: Sequence[Feature], outputs: Sequence[Any],
               options: Mapping[str, Any], config: BertConfig, tokenizer: Tokenizer | None = None
               ) -> list[dict[str, Any]]:
        logits = np.stack([np.asarray(o, dtype=np.float64) for o in outputs]) if outputs else np.zeros((0, 1))
        relevant = self.relevant if logits.shape[1] > 1 else -1
        scores = relevance(logits, relevant)
        grouped: list[list[tuple[int, float, float]]] = [[] for _ in examples]
        for feature, score, row in zip(features, scores, logits):
            grouped[feature.example_index].append((feature.window, float(score), float(row[relevant])))
        results = []
        for example, ranked in zip(examples, grouped):
            ranked.sort(key=lambda item: (-item[1], item[0]))  # best first; ties in input order
            kept = ranked[: options["top_n"]] if options["top_n"] else ranked
            results.append({"results": [{"index": i, "score": s, "logit": raw,  # the relevant output's logit
                                         **({"text": example.texts[i]} if options["return_text"] else {})}
                                        for i, s, raw in kept]})
        return results


    def score(self, examples, results, config, **settings):
        """Each list ranked by the model against its labels (relevant: label > 0, graded by the label):
        nDCG@10 and MRR@10 averaged over the lists."""
        ranked = {str(q): [str(item["index"]) for item in result["results"]] for q, result in enumerate(results)}
        qrels = {str(q): {str(i): label for i, label in enumerate(example.labels) if label > 0}
                 for q, example in enumerate(examples)}
        figures = retrieval_scores(ranked, qrels, k_values=(10,), mrr_at=(10,), ndcg_at=(10,), map_at=(10,),
                                   graded=True)
        return {name: figures[name] for name in LIST_METRICS}, {}, []

    def record(self, example: RerankQuery, result: dict[str, Any]) -> dict[str, Any]:
        return {"id": example.id, "query": example.query, "texts": list(example.texts),
                "labels": None if example.labels is None else list(example.labels), **result}


FAMILY = Reranking()
