"""Evaluation of fine-tuned models: run a model over features, decode, score (row 3).

For each task family an evaluator holds the examples and their features, runs the model in eval mode
without gradients, decodes the outputs back to what the data speaks — label names, word tags and entity
character spans, answer strings cut from the original context — and hands plain Python values to
`bertforge.metrics`. Decoding is pure functions over numbers, tested on their own:

- `aggregate_windows`: a long classification input's window logits, averaged per example.
- `decode_tags`: each word's tag from its first sub-token in its max-context window; `tag_entities` turns
  word tags into entities with character offsets into the sentence text.
- `decode_answers`: SQuAD n-best decoding across windows (start/end in the context, start token in its
  max-context window, end >= start, at most `max_answer_length` tokens), answer text cut from the context by
  character offsets; SQuAD v2.0's null answer wins when its score beats the best span by the threshold.

Every evaluator returns an `EvalResult`: metrics (floats, named as `bertforge.metrics` names them), one
prediction record per example (what `evaluate` writes as JSONL), and warnings (e.g. predictions collapsed
to one class).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from bertforge.data.choice import ChoiceExample
from bertforge.data.classification import ClassificationExample
from bertforge.data.conll import TaggingExample
from bertforge.data.finetuning import Feature, FeatureBatches
from bertforge.data.squad import QAExample
from bertforge.metrics.classification import compute_classification_metrics, prediction_collapse
from bertforge.metrics.sequence_labeling import entity_scores, get_entities, iobes_to_bio
from bertforge.metrics.squad import evaluate_squad
from bertforge.runtime import autocast


@dataclass
class EvalResult:
    """metrics: {name: value}; predictions: one JSON-ready record per example; warnings: plain sentences;
    details: extra structured results (per-type entity scores, n-best lists...)."""

    metrics: dict[str, float]
    predictions: list[dict]
    warnings: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)


# --- running the model ------------------------------------------------------------------------------------

@torch.no_grad()
def run_model(model: torch.nn.Module, features: Sequence[Feature], *, batch_size: int, pad_token_id: int,
              device: torch.device | str | None = None, precision: str = "fp32") -> dict[str, list[np.ndarray]]:
    """Forward every feature once, in eval mode without gradients.

    Returns:
        {"logits": [n] arrays} (classification/choice: [C]; tagging: [T_i, C] cut to each feature's length)
        or {"start_logits": [n] arrays [T_i], "end_logits": [n] arrays [T_i]} (QA), in feature order.
    """
    was_training = model.training
    model.eval()
    device = torch.device(device) if device is not None else next(model.parameters()).device
    outputs: dict[str, list[np.ndarray | None]] = {}
    try:
        for batch in FeatureBatches(features, batch_size, pad_token_id, shuffle=False):
            batch = batch.to(device)
            with autocast(device, precision):
                output = model(**batch.model_inputs())
            lengths = batch.attention_mask.sum(-1).tolist()
            names = ("start_logits", "end_logits") if hasattr(output, "start_logits") else ("logits",)
            for name in names:
                values = getattr(output, name).float().cpu().numpy()
                store = outputs.setdefault(name, [None] * len(features))
                for row, index in enumerate(batch.feature_index.tolist()):
                    value = values[row]
                    if name != "logits" or (value.ndim == 2 and batch.input_ids.dim() == 2):
                        value = value[: int(lengths[row])]
                    store[index] = value
    finally:
        model.train(was_training)
    return outputs


# --- decoding ---------------------------------------------------------------------------------------------

def aggregate_windows(features: Sequence[Feature], logits: Sequence[np.ndarray], num_examples: int) -> np.ndarray:
    """Mean of the window logits of each example: [num_examples, C] from per-feature [C] arrays."""
    width = len(logits[0])
    total = np.zeros((num_examples, width), dtype=np.float64)
    count = np.zeros(num_examples, dtype=np.int64)
    for feature, row in zip(features, logits):
        total[feature.example_index] += row
        count[feature.example_index] += 1
    if (count == 0).any():
        raise ValueError(f"{int((count == 0).sum())} examples have no feature; features and examples do not match")
    return total / count[:, None]


def decode_tags(examples: Sequence[TaggingExample], features: Sequence[Feature],
                token_predictions: Sequence[Sequence[int]], id2label: dict[int, str],
                tag_scheme: str = "BIO") -> list[list[str]]:
    """Word-level BIO tags from per-token predicted label ids.

    Args:
        examples: the sentences.
        features: their features (with `word_index`).
        token_predictions: per feature, [T_i] predicted label ids.
        id2label: label id -> tag (in `tag_scheme`).
        tag_scheme: "BIO" or "IOBES" (predicted IOBES is converted to BIO).

    Returns:
        Per sentence, one BIO tag per word ("O" for a word that got no token).
    """
    tags = [["O"] * len(example.words) for example in examples]
    for feature, predicted in zip(features, token_predictions):
        sentence = tags[feature.example_index]
        for position, word in enumerate(feature.word_index):
            if word is not None:
                sentence[word] = id2label[int(predicted[position])]
    if tag_scheme == "IOBES":
        tags = [iobes_to_bio(sentence) for sentence in tags]
    return tags


def tag_entities(example: TaggingExample, tags: Sequence[str]) -> list[dict]:
    """Entities of one sentence as {"type", "start", "end", "text"}: character offsets (end exclusive) into
    `example.text`, read from BIO tags with the conlleval rules."""
    spans = example.word_spans()
    text = example.text
    entities = []
    for entity in get_entities(list(tags), "BIO"):
        start, end = spans[entity.start][0], spans[entity.end][1]
        entities.append({"type": entity.type, "start": start, "end": end, "text": text[start:end]})
    return entities


@dataclass
class SpanCandidate:
    text: str
    score: float
    start: int  # character offsets in the context, end exclusive
    end: int
    start_logit: float
    end_logit: float


def _top(values: np.ndarray, k: int) -> list[int]:
    return np.argsort(-values, kind="stable")[:k].tolist()


def decode_answers(
    examples: Sequence[QAExample],
    features: Sequence[Feature],
    start_logits: Sequence[np.ndarray],
    end_logits: Sequence[np.ndarray],
    *,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    version_2_with_negative: bool = False,
    null_score_diff_threshold: float = 0.0,
) -> tuple[dict[str, str], dict[str, list[SpanCandidate]], dict[str, float]]:
    """Answer text per question from window logits (Google's `write_predictions`, on character offsets).

    Args:
        examples: the questions.
        features: their windows (offsets and max-context flags).
        start_logits, end_logits: per feature, [T_i] scores.
        n_best_size: start and end candidates per window, and candidates kept per question.
        max_answer_length: longest answer in tokens.
        version_2_with_negative: allow "no answer" (SQuAD v2.0).
        null_score_diff_threshold: predict "" when null score - best span score exceeds this.

    Returns:
        (predictions {qid: text}, n-best {qid: candidates, best first}, null-score margins {qid: null - best}).
    """
    by_example: dict[int, list[int]] = {}
    for index, feature in enumerate(features):
        by_example.setdefault(feature.example_index, []).append(index)
    predictions: dict[str, str] = {}
    nbest: dict[str, list[SpanCandidate]] = {}
    margins: dict[str, float] = {}
    for example_index, example in enumerate(examples):
        candidates: list[tuple[float, int, int, int]] = []
        null_score = float("inf")
        for index in by_example.get(example_index, []):
            feature = features[index]
            starts, ends = start_logits[index], end_logits[index]
            null_score = min(null_score, float(starts[0] + ends[0]))
            offsets, max_context = feature.offsets, feature.max_context
            limit = len(offsets)
            for s in _top(starts, n_best_size):
                if s >= limit or offsets[s] is None or not max_context[s]:
                    continue
                for e in _top(ends, n_best_size):
                    if e >= limit or offsets[e] is None or e < s or e - s + 1 > max_answer_length:
                        continue
                    candidates.append((float(starts[s] + ends[e]), index, s, e))
        candidates.sort(key=lambda c: -c[0])
        kept: list[SpanCandidate] = []
        seen: set[str] = set()
        for score, index, s, e in candidates:
            offsets = features[index].offsets
            begin, end = offsets[s][0], offsets[e][1]
            text = example.context[begin:end]
            if text in seen:
                continue
            seen.add(text)
            kept.append(SpanCandidate(text, score, begin, end, float(start_logits[index][s]),
                                      float(end_logits[index][e])))
            if len(kept) >= n_best_size:
                break
        best = kept[0] if kept else None
        answer = best.text if best else ""
        if version_2_with_negative:
            margin = null_score - (best.score if best else float("-inf"))
            margins[example.qid] = margin
            if margin > null_score_diff_threshold:
                answer = ""
        predictions[example.qid] = answer
        nbest[example.qid] = kept
    return predictions, nbest, margins


# --- evaluators -------------------------------------------------------------------------------------------

class Evaluator:
    """Base: holds examples and features; `__call__(model)` runs, decodes and scores.

    Args:
        examples, features: the evaluation data (features built from these examples).
        batch_size: features per forward pass.
        pad_token_id: the tokenizer's [PAD] id.
        device, precision: where and how to run (default: the model's device, fp32).
    """

    def __init__(self, examples: Sequence, features: Sequence[Feature], *, batch_size: int, pad_token_id: int,
                 device: torch.device | str | None = None, precision: str = "fp32"):
        self.examples = list(examples)
        self.features = list(features)
        self.batch_size = batch_size
        self.pad_token_id = pad_token_id
        self.device = device
        self.precision = precision
        self.labelled = True

    def run(self, model: torch.nn.Module) -> dict[str, list[np.ndarray]]:
        return run_model(model, self.features, batch_size=self.batch_size, pad_token_id=self.pad_token_id,
                         device=self.device, precision=self.precision)

    def __call__(self, model: torch.nn.Module) -> EvalResult:
        raise NotImplementedError


class ClassificationEvaluator(Evaluator):
    """Sequence classification or regression; windows averaged per example.

    Args (beyond Evaluator's):
        label_names: names by id (classification); ignored for regression.
        regression: scores instead of classes.
        metric_names: names for `compute_classification_metrics` (None: its defaults).
    """

    def __init__(self, examples: Sequence[ClassificationExample], features: Sequence[Feature], *,
                 label_names: Sequence[str] | None, regression: bool = False,
                 metric_names: Sequence[str] | None = None, **kwargs):
        super().__init__(examples, features, **kwargs)
        self.label_names = list(label_names or [])
        self.regression = regression
        self.metric_names = metric_names
        self.labelled = all(e.label is not None for e in self.examples)

    def __call__(self, model: torch.nn.Module) -> EvalResult:
        logits = aggregate_windows(self.features, self.run(model)["logits"], len(self.examples))
        records, warnings = [], []
        windows = np.bincount([f.example_index for f in self.features], minlength=len(self.examples))
        if self.regression:
            predicted = logits[:, 0].tolist()
            for example, value, count in zip(self.examples, predicted, windows):
                records.append({"text_a": example.text_a, "text_b": example.text_b, "label": example.label,
                                "prediction": value, "windows": int(count)})
            metrics = {}
            if self.labelled:
                gold = [float(e.label) for e in self.examples]
                metrics = compute_classification_metrics(predicted, gold, "regression", self.metric_names)
            return EvalResult(metrics, records)
        shifted = logits - logits.max(axis=1, keepdims=True)
        probabilities = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
        predicted_ids = logits.argmax(axis=1).tolist()
        for example, pid, probs, count in zip(self.examples, predicted_ids, probabilities, windows):
            records.append({"text_a": example.text_a, "text_b": example.text_b, "label": example.label,
                            "prediction": self.label_names[pid] if self.label_names else pid,
                            "probabilities": [round(float(p), 6) for p in probs], "windows": int(count)})
        metrics = {}
        if self.labelled:
            index = {name: i for i, name in enumerate(self.label_names)}
            gold = [index[e.label] for e in self.examples]
            positive = 1 if len(self.label_names) == 2 else None
            metrics = compute_classification_metrics(predicted_ids, gold, "classification", self.metric_names,
                                                     **({"positive_label": positive} if positive is not None else {}))
        collapse = prediction_collapse(predicted_ids)
        if collapse:
            warnings.append(collapse)
        return EvalResult(metrics, records, warnings)


class TaggingEvaluator(Evaluator):
    """NER: word tags from max-context windows, entity-level precision/recall/F1 (conlleval rules).

    Args (beyond Evaluator's):
        id2label: label id -> tag in `tag_scheme`.
        tag_scheme: "BIO" or "IOBES".
    """

    def __init__(self, examples: Sequence[TaggingExample], features: Sequence[Feature], *, id2label: dict[int, str],
                 tag_scheme: str = "BIO", **kwargs):
        super().__init__(examples, features, **kwargs)
        self.id2label = dict(id2label)
        self.tag_scheme = tag_scheme
        self.labelled = all(e.tags is not None for e in self.examples)

    def __call__(self, model: torch.nn.Module) -> EvalResult:
        token_predictions = [row.argmax(-1) for row in self.run(model)["logits"]]
        tags = decode_tags(self.examples, self.features, token_predictions, self.id2label, self.tag_scheme)
        records = []
        for example, predicted in zip(self.examples, tags):
            record = {"text": example.text, "words": example.words, "tags": predicted,
                      "entities": tag_entities(example, predicted)}
            if example.tags is not None:
                record["gold"] = example.tags
            records.append(record)
        metrics, details, warnings = {}, {}, []
        if self.labelled:
            scores = entity_scores([e.tags for e in self.examples], tags, "BIO")
            metrics = {"f1": scores["f1"], "precision": scores["precision"], "recall": scores["recall"]}
            details = {"per_type": scores["per_type"], "support": scores["support"], "predicted": scores["predicted"]}
            if scores["predicted"] == 0:
                warnings.append(f"no entity predicted in {len(self.examples)} sentences: the model tags everything "
                                "'O' (too few steps, or a learning rate too high or too low)")
        return EvalResult(metrics, records, warnings, details)


class QuestionAnsweringEvaluator(Evaluator):
    """Extractive QA: n-best decoding across windows, official SQuAD EM/F1 (zh: CMRC character-level).

    Args (beyond Evaluator's):
        language: "en", "zh" or "auto" (detected from the gold answers).
        n_best_size, max_answer_length, version_2_with_negative, null_score_diff_threshold: see
            `decode_answers`.
    """

    def __init__(self, examples: Sequence[QAExample], features: Sequence[Feature], *, language: str = "auto",
                 n_best_size: int = 20, max_answer_length: int = 30, version_2_with_negative: bool = False,
                 null_score_diff_threshold: float = 0.0, **kwargs):
        super().__init__(examples, features, **kwargs)
        self.language = language
        self.n_best_size = n_best_size
        self.max_answer_length = max_answer_length
        self.version_2_with_negative = version_2_with_negative
        self.null_score_diff_threshold = null_score_diff_threshold
        self.labelled = all(e.answers or e.is_impossible for e in self.examples)

    def __call__(self, model: torch.nn.Module) -> EvalResult:
        outputs = self.run(model)
        predictions, nbest, margins = decode_answers(
            self.examples, self.features, outputs["start_logits"], outputs["end_logits"],
            n_best_size=self.n_best_size, max_answer_length=self.max_answer_length,
            version_2_with_negative=self.version_2_with_negative,
            null_score_diff_threshold=self.null_score_diff_threshold)
        records = []
        for example in self.examples:
            record = {"id": example.qid, "question": example.question, "prediction": predictions[example.qid],
                      "answers": example.answers,
                      "nbest": [{"text": c.text, "score": round(c.score, 4), "start": c.start, "end": c.end}
                                for c in nbest[example.qid][:5]]}
            if example.qid in margins:
                record["null_margin"] = round(margins[example.qid], 4)
            records.append(record)
        metrics = {}
        if self.labelled:
            gold = {e.qid: e.answers for e in self.examples}
            version = "2.0" if self.version_2_with_negative else "1.1"
            scores = evaluate_squad(predictions, gold, language=self.language, version=version)
            metrics = {k: float(v) for k, v in scores.items() if k not in ("total", "missing")}
        warnings = []
        if predictions and len(set(predictions.values())) == 1:
            warnings.append(f"every one of {len(predictions)} questions got the same answer "
                            f"{next(iter(predictions.values()))!r}: training has not taken hold")
        return EvalResult(metrics, records, warnings)


class ChoiceEvaluator(Evaluator):
    """Multiple choice: accuracy of the highest-scoring choice."""

    def __init__(self, examples: Sequence[ChoiceExample], features: Sequence[Feature], **kwargs):
        super().__init__(examples, features, **kwargs)
        self.labelled = all(e.label is not None for e in self.examples)

    def __call__(self, model: torch.nn.Module) -> EvalResult:
        logits = aggregate_windows(self.features, self.run(model)["logits"], len(self.examples))
        predicted = logits.argmax(axis=1).tolist()
        records = [{"context": e.context, "endings": e.endings, "label": e.label, "prediction": p,
                    "scores": [round(float(v), 4) for v in row]}
                   for e, p, row in zip(self.examples, predicted, logits)]
        metrics = {}
        if self.labelled:
            metrics = compute_classification_metrics(predicted, [e.label for e in self.examples], "classification",
                                                     ["accuracy"])
        warnings = [w for w in [prediction_collapse(predicted)] if w]
        return EvalResult(metrics, records, warnings)
