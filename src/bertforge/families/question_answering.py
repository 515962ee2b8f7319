"""Extractive question answering: the answer is a span of the context.

Owns: the models (`BertForQuestionAnswering` and `ModernBertForQuestionAnswering`: a start and an end score
per token, padding never an answer: `span_output`), their objective (the mean of the start and end
cross-entropies per window), features (Google's `run_squad.py`), n-best decoding across windows, SQuAD / CMRC
metrics and the pipeline's JSON. Questions and their file reader are in `data.question_answering`.

Features: ``[CLS] question [SEP] context window [SEP]``, on character offsets rather than whitespace words.
The question is cut to `max_query_length` tokens (and to half a window, so the context always has room);
the context is cut into windows of the room left after it, `doc_stride` tokens apart
(`tokenization.windows`). A window that does not hold the whole answer (or an unanswerable question) is
trained to point at [CLS] (index 0). Each window records the character span of every context token and
whether it is the token's max-context window.

Decoding (Google's `write_predictions`): per window the `n_best_size` best starts and ends; a span must
start at a context token of its max-context window, end at or after its start, and be at most
`max_answer_length` long; spans are ranked by start + end logit over all windows and the text is cut from
the context by character offsets, widened to whole words: a span that starts or ends inside a word (the
sub-tokens "clast ##s" of "clasts", answer "clast") covers that whole word. A word here is the tokenizer's
pre-tokenized word (whitespace split, then punctuation split, each CJK character a word of its own), so
punctuation attached to a word is not pulled in ("clasts," answers "clasts") and Chinese answers are
unchanged. Google's run_squad maps its spans to whitespace tokens of the context and projects the
tokenized prediction back onto them with `get_final_text`; the pieces it keeps are whole WordPiece tokens,
and it strips punctuation the prediction did not cover, as here; unlike here, a prediction that ends inside
a word ("clast") stays cut there, because `get_final_text` finds "clast" inside "clasts". Answers that are
identical after widening count once in the n-best list. Its score is the probability start x end within
its window. With
`version_2_with_negative` (SQuAD v2.0) the answer is empty when the smallest [CLS] score over the windows beats
the best span by `null_score_diff_threshold`.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertforge.data.finetuning import DataReport, Feature
from bertforge.data.question_answering import QAExample, article_split, count_articles, read_squad
from bertforge.errors import InputError
from bertforge.families.base import (
    Family,
    FamilyTraining,
    FineTuningModel,
    InputSettings,
    LossSettings,
    Objective,
    check_number,
    check_text,
    mean_loss,
    softmax,
)
from bertforge.metrics.question_answering import evaluate_squad
from bertforge.model.bert import BertOutput, IndexableOutput
from bertforge.model.config import BertConfig
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.heads import feature_size, token_features
from bertforge.model.modernbert import ModernBertClassifier
from bertforge.tokenization.normalizer import Normalizer
from bertforge.tokenization.pairs import pair_windows
from bertforge.tokenization.pretokenizer import PreTokenizer
from bertforge.tokenization.tokenizer import Tokenizer
from bertforge.tokenization.windows import max_context_windows


@dataclass
class QuestionAnsweringOutput(IndexableOutput):
    """start_logits, end_logits: [B, T] (padding at the dtype's minimum); loss: mean of the start and end
    cross-entropies per window. `outputs[0]` is the loss when there is one (transformers' order)."""

    tuple_fields = ("loss", "start_logits", "end_logits", "hidden_states", "attentions")

    start_logits: torch.Tensor
    end_logits: torch.Tensor
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def objective(start_logits: torch.Tensor, end_logits: torch.Tensor, start_positions: torch.Tensor,
              end_positions: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(start + end cross-entropy) / 2 summed over windows, with the count of windows that have a target.

    A window without the answer targets index 0 ([CLS]), as the feature builder sets it; a position beyond
    the window is ignored rather than crashing, and the window does not count (as Hugging Face's mean over
    the positions it keeps).
    """
    tokens = start_logits.shape[1]
    start = start_positions.long().clamp(0, tokens)
    end = end_positions.long().clamp(0, tokens)
    loss = (F.cross_entropy(start_logits.float(), start, ignore_index=tokens, reduction="sum")
            + F.cross_entropy(end_logits.float(), end, ignore_index=tokens, reduction="sum")) / 2
    return {"span_cross_entropy": (loss, (start < tokens).sum().float())}


def span_output(logits: torch.Tensor, attention_mask: torch.Tensor | None, start_positions: torch.Tensor | None,
                end_positions: torch.Tensor | None, out: BertOutput) -> QuestionAnsweringOutput:
    """A span head's answer from its scores [B, T, 2] (start, end per token) and its encoder's output `out`:
    padding masked, the loss when both positions are given. Every span head ends here, BERT's and ModernBERT's."""
    if attention_mask is not None:
        # Padding is never an answer position. Masking it keeps the loss independent of the layout: the
        # padded path gives padding whatever its hidden states score, the padding-free path a zero vector
        # (logit = bias), and with padding inside the softmax the two trained different models.
        logits = logits.masked_fill((attention_mask == 0)[..., None], torch.finfo(logits.dtype).min)
    start_logits, end_logits = logits[..., 0], logits[..., 1]  # [B, T] each
    loss = None
    if start_positions is not None and end_positions is not None:
        loss = mean_loss(objective(start_logits, end_logits, start_positions, end_positions))
    return QuestionAnsweringOutput(start_logits, end_logits, loss, out.hidden_states, out.attentions)


class BertForQuestionAnswering(FineTuningModel):
    head_prefixes = ("qa_outputs.",)

    def __init__(self, config: BertConfig):
        super().__init__(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(feature_size(config), 2)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, start_positions=None,
                end_positions=None, output_attentions: bool = False,
                output_hidden_states: bool = False) -> QuestionAnsweringOutput:
        out = self.encode(input_ids, token_type_ids, attention_mask, output_attentions, output_hidden_states)
        logits = self.qa_outputs(token_features(self.config, out))  # [B, T, 2]
        return span_output(logits, attention_mask, start_positions, end_positions, out)


class ModernBertForQuestionAnswering(ModernBertClassifier):
    """ModernBERT's span head, as transformers' (so the directory loads there): prediction head, dropout, and a
    classifier of two scores per token (start, end) -> start and end logits [B, T] each, padding masked and the
    loss as `BertForQuestionAnswering`'s (`span_output`)."""

    @staticmethod
    def classifier_width(config: ModernBertConfig) -> int:
        return 2  # start, end

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None, output_attentions: bool = False,
                output_hidden_states: bool = False, *,
                position_ids: torch.Tensor | None = None) -> QuestionAnsweringOutput:
        """Arguments in `BertForQuestionAnswering.forward`'s order; token_type_ids are unused (no segments)."""
        out, features = self.encode_features(input_ids, attention_mask, position_ids, output_hidden_states,
                                             output_attentions)
        logits = self.classifier(self.dropout(self.head(features)))  # [B, T, H*k] -> [B, T, H] -> [B, T, 2]
        return span_output(logits, attention_mask, start_positions, end_positions, out)


# The default step between context windows when `doc_stride` is unset (Google's run_squad), at most half
# the room.
DEFAULT_DOC_STRIDE = 128


def build_features(examples: Sequence[QAExample], tokenizer: Tokenizer, settings: InputSettings, *,
                   training: bool = False, report: DataReport | None = None) -> list[Feature]:
    """Windowed QA features (see the module docstring).

    Args:
        examples: the questions.
        tokenizer: the model's tokenizer.
        settings: `max_seq_length` (tokens per feature including [CLS] and two [SEP]), `doc_stride` (step
            between window starts over the context; None = 128 or half the room), `max_query_length`.
        training: set start/end positions; answerable examples without a located answer are left out
            (their count is in the reader's report).
        report: gets `features`, `windowed_inputs`, `truncated_questions`, `answers_unmappable`.
    """
    report = report if report is not None else DataReport()
    post = tokenizer.post_processor
    features: list[Feature] = []
    for index, example in enumerate(examples):
        question = tokenizer.encode(example.question, add_special_tokens=False).ids
        encoding = tokenizer.encode(example.context, add_special_tokens=False)
        ids, offsets = encoding.ids, encoding.offsets
        # The question is always cut to max_query_length (and half the budget); the context is windowed.
        pair = pair_windows(question, ids, post, settings.max_seq_length, long="second",
                            doc_stride=settings.doc_stride, stride_limit=DEFAULT_DOC_STRIDE,
                            short_limit=settings.max_query_length, second_offsets=offsets)
        if pair.short_cut:
            report.note("truncated_questions", example.source)
        token_start = token_end = None
        if training and not example.is_impossible:
            if example.answer_start is None:
                continue
            char_start = example.answer_start
            char_end = char_start + len(example.answer_text)
            token_start = bisect.bisect_right([end for _, end in offsets], char_start)  # first token ending after
            token_end = bisect.bisect_left([start for start, _ in offsets], char_end) - 1  # last starting before
            if token_start >= len(ids) or token_end < token_start:
                report.note("answers_unmappable", example.source)
                continue
        if len(pair.windows) > 1:
            report.note("windowed_inputs", example.source)
        best = max_context_windows(pair.spans, len(ids))
        for w in pair.windows:
            start, end, head = w.start, w.start + w.size, w.long_at  # head: [CLS] question [SEP]
            max_context = [False] * head + [best[i] == w.index for i in range(start, end)] + [False]
            feature = Feature(index, w.ids, w.type_ids, offsets=w.offsets, max_context=max_context, window=w.index)
            if training:
                if example.is_impossible or not (start <= token_start and token_end < end):
                    feature.start_position = feature.end_position = 0
                else:
                    feature.start_position = head + token_start - start
                    feature.end_position = head + token_end - start
            features.append(feature)
    report.note("features", amount=len(features))
    return features


# Every EVAL_EVERY-th article of a QA file forms the eval split of tasks that ship only one file.
EVAL_EVERY = 4


def _top(values: np.ndarray, k: int) -> list[int]:
    return np.argsort(-values, kind="stable")[:k].tolist()


# Word boundaries when the decoder is given no tokenizer: Google's defaults (CJK characters are words).
_DEFAULT_WORDS = PreTokenizer(Normalizer(), tokenize_chinese_chars=True)


class WordBounds:
    """The pre-tokenized words of one context, to widen a character span to whole words."""

    def __init__(self, context: str, tokenizer: Tokenizer | None = None):
        words = tokenizer.pre_tokenize(context) if tokenizer is not None else _DEFAULT_WORDS.pre_tokenize(context)
        self.starts = [start for _, start, _ in words]
        self.ends = [end for _, _, end in words]

    def widen(self, begin: int, end: int) -> tuple[int, int]:
        """(begin, end) moved out to the start and end of the words they fall inside (end exclusive)."""
        first = bisect.bisect_right(self.starts, begin) - 1
        if first >= 0 and self.ends[first] > begin:
            begin = self.starts[first]
        last = bisect.bisect_right(self.starts, end - 1) - 1
        if last >= 0 and self.ends[last] >= end:
            end = self.ends[last]
        return begin, end


def decode_answers(examples: Sequence[QAExample], features: Sequence[Feature],
                   outputs: Sequence[tuple[np.ndarray, np.ndarray]], *, n_best_size: int = 20,
                   max_answer_length: int = 30, version_2_with_negative: bool = False,
                   null_score_diff_threshold: float = 0.0, whole_words: bool = True,
                   tokenizer: Tokenizer | None = None) -> list[dict[str, Any]]:
    """One answer per question from its windows' (start, end) logits; see the module docstring.

    Args:
        whole_words: widen every span to the whole words it touches (False: the sub-tokens' characters,
            which can cut a word, kept for comparison in `benchmarks/qa_word_boundaries.py`).
        tokenizer: the model's tokenizer, whose pre-tokenized words are the words (None: Google's default
            pre-tokenization, CJK characters as words).

    Returns:
        Per question {"answer", "start", "end" (character offsets, end exclusive; None for no answer),
        "probability" (p(start) * p(end) of the answer's window, or of [CLS] for no answer), "logit_score"
        (start logit + end logit, what candidates are ranked by), "nbest" (up to 5 candidates, best first, each
        with its "text", "start", "end", "probability" and "logit_score"), and with `version_2_with_negative`
        "null_margin" (null logit score - best span logit score)}. One name, one meaning: a probability is
        always "probability", a logit sum always "logit_score".
    """
    by_example: dict[int, list[int]] = {}
    for index, feature in enumerate(features):
        by_example.setdefault(feature.example_index, []).append(index)
    results = []
    bounds: dict[str, WordBounds] = {}  # several questions share one context
    for example_index, example in enumerate(examples):
        words = None
        if whole_words:
            words = bounds.get(example.context)
            if words is None:
                words = bounds[example.context] = WordBounds(example.context, tokenizer)
        candidates: list[tuple[float, int, int, int]] = []
        probabilities: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # per window, computed once
        null_score, null_probability = float("inf"), 0.0
        for index in by_example.get(example_index, []):
            feature = features[index]
            starts, ends = (np.asarray(x, dtype=np.float64) for x in outputs[index])
            probabilities[index] = softmax(starts), softmax(ends)
            if float(starts[0] + ends[0]) < null_score:
                null_score = float(starts[0] + ends[0])
                null_probability = float(probabilities[index][0][0] * probabilities[index][1][0])
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
        kept: list[dict[str, Any]] = []
        seen: set[str] = set()
        for score, index, s, e in candidates:
            offsets = features[index].offsets
            begin, end = offsets[s][0], offsets[e][1]
            if words is not None:
                begin, end = words.widen(begin, end)
            text = example.context[begin:end]
            if text in seen:
                continue
            seen.add(text)
            start_probs, end_probs = probabilities[index]
            kept.append({"text": text, "start": begin, "end": end, "probability": float(start_probs[s] * end_probs[e]),
                         "logit_score": score})
            if len(kept) >= n_best_size:
                break
        results.append(answer_record(kept, null_score, null_probability, version_2_with_negative,
                                     null_score_diff_threshold))
    return results


def answer_record(kept: Sequence[dict[str, Any]], null_score: float, null_probability: float,
                  version_2_with_negative: bool, null_score_diff_threshold: float) -> dict[str, Any]:
    """A question's result from its ranked candidates (best first) and its no-answer scores (see
    `decode_answers`)."""
    best = kept[0] if kept else None
    no_answer = {"answer": "", "start": None, "end": None, "probability": null_probability,
                 "logit_score": null_score if null_score != float("inf") else None}
    result: dict[str, Any] = dict(no_answer)
    if best is not None:
        result = {"answer": best["text"], "start": best["start"], "end": best["end"],
                  "probability": best["probability"], "logit_score": best["logit_score"]}
    if version_2_with_negative:
        margin = null_score - (best["logit_score"] if best else float("-inf"))
        result["null_margin"] = margin
        if margin > null_score_diff_threshold:
            result.update(no_answer)
    result["nbest"] = [{"text": c["text"], "start": c["start"], "end": c["end"], "probability": c["probability"],
                        "logit_score": c["logit_score"]} for c in kept[:5]]
    return result


class SpanObjective(Objective):
    """The training loop's view of a QA model: cross-entropy of the answer's start and end positions."""

    def counts(self, batch) -> dict[str, torch.Tensor]:
        """Windows in the batch whose target lies inside the window (the feature builder's always do)."""
        return {"span_cross_entropy": (batch.start_positions < batch.input_ids.shape[-1]).sum().float()}

    def loss_terms(self, output, batch):
        return objective(output.start_logits, output.end_logits, batch.start_positions, batch.end_positions)

    def metrics(self, output, batch):
        start = output.start_logits.detach().argmax(-1) == batch.start_positions
        end = output.end_logits.detach().argmax(-1) == batch.end_positions
        return {"span_accuracy": ((start & end).sum().float(), output.start_logits.new_tensor(float(start.shape[0])))}


class QuestionAnsweringTraining(FamilyTraining):
    """What fine-tuning asks of question answering: the settings it honours and the span objective."""

    settings = frozenset({"features.max_query_length", "features.max_answer_length", "features.n_best_size",
                          "features.version_2_with_negative", "features.null_score_diff_threshold"})

    def objective_for(self, config: BertConfig, loss: LossSettings | None = None) -> SpanObjective:
        self.refuse_loss_settings(loss)
        return SpanObjective()


class QuestionAnswering(Family):
    """Extractive answers from contexts of any length."""

    name = "question_answering"
    aliases = ("qa", "squad", "answer", "extractive_qa")
    model_class = BertForQuestionAnswering
    task = "answer"
    default_max_seq_length = 384
    long_inputs = True
    default_language = "auto"
    options = {"max_answer_length": 30, "version_2_with_negative": False, "null_score_diff_threshold": 0.0, "n_best_size": 20}
    export_outputs = {"start_logits": {0: "batch", 1: "sequence"}, "end_logits": {0: "batch", 1: "sequence"}}
    example_inputs = [{"question": "Where does Ana live?", "context": "Ana lives in Lisbon and works in Porto."},
                    {"question": "When was the bridge opened?",
                     "context": "The bridge, designed by a local engineer, was opened in 1932 after six years."}]

    default_metrics = ("f1", "exact_match")

    formats = {"qa": None}
    training_hooks = QuestionAnsweringTraining

    def read(self, path, *, part, task, report, labelled=True):
        articles = None
        if part is not None:
            # A task without a train file: every EVAL_EVERY-th article is eval, the others train.
            train_ids, eval_ids = article_split(count_articles(path), EVAL_EVERY)
            articles = eval_ids if part == "eval" else train_ids
        return read_squad(path, articles=articles, labelled=labelled, on_invalid=task.reader.on_invalid,
                          report=report)

    def validate_options(self, options):
        check_number(options, "max_answer_length", 1, 512, integer=True)
        check_number(options, "n_best_size", 1, 100, integer=True)
        if not isinstance(options["version_2_with_negative"], bool):
            raise InputError("version_2_with_negative must be true or false")
        check_number(options, "null_score_diff_threshold")

    def labelled(self, examples):
        return all(e.answers or e.is_impossible for e in examples)

    def options_for_data(self, options, examples):
        return {**options, "version_2_with_negative": bool(options["version_2_with_negative"]) or any(
            e.is_impossible for e in examples)}

    def metric_names(self, task, dev_examples=None):
        """exact_match and f1; with SQuAD v2.0 (`version_2_with_negative`, or any dev set when none is given)
        also HasAns_/NoAns_ exact and f1 for the groups the dev set has."""
        names: tuple[str, ...] = ("exact_match", "f1")
        if dev_examples is None or task.options.get("version_2_with_negative"):
            groups = {bool(getattr(e, "is_impossible", False)) for e in dev_examples or ()} or {False, True}
            names += tuple(f"{group}_{kind}" for group, flag in (("HasAns", False), ("NoAns", True)) if flag in groups
                           for kind in ("exact", "f1"))
        return names

    def parse(self, item: Any) -> QAExample:
        if isinstance(item, list | tuple) and len(item) == 2:
            item = {"question": item[0], "context": item[1]}
        if not isinstance(item, Mapping):
            raise InputError(f"expected an object {{\"question\": ..., \"context\": ...}}, got {type(item).__name__}")
        missing = [k for k in ("question", "context") if k not in item]
        if missing:
            raise InputError(f"missing field(s) {missing}; send {{\"question\": ..., \"context\": ...}}")
        return QAExample(str(item.get("id", "input")), check_text(item["question"], "question"),
                         check_text(item["context"], "context"), [], None, None)

    def windowed_texts(self, example):
        return [example.context]  # the question is cut to max_query_length; the context is windowed

    def features(self, examples, tokenizer, settings, *, config, report=None, training=False):
        return build_features(examples, tokenizer, settings, training=training, report=report)

    def forward(self, model, batch, options=None):
        out = model(**batch.model_inputs())
        start, end = out.start_logits.float().cpu(), out.end_logits.float().cpu()  # [B, T] each
        lengths = batch.attention_mask.sum(-1).tolist()
        return [(start[row, :int(n)], end[row, :int(n)]) for row, n in enumerate(lengths)]

    def decode(self, examples, features, outputs, options, config, tokenizer=None):
        return decode_answers(examples, features, outputs,
                              n_best_size=options["n_best_size"], max_answer_length=options["max_answer_length"],
                              version_2_with_negative=options["version_2_with_negative"], null_score_diff_threshold=options["null_score_diff_threshold"],
                              tokenizer=tokenizer)

    def record(self, example, result):
        return {"id": example.qid, "question": example.question, "answers": example.answers,
                "prediction": result["answer"], **result}

    def score(self, examples, results, config, *, language="auto", options=None, **_):
        version_2 = bool((options or {}).get("version_2_with_negative"))
        predictions = {e.qid: r["answer"] for e, r in zip(examples, results)}
        gold = {e.qid: e.answers for e in examples}
        scores = evaluate_squad(predictions, gold, language=language, version="2.0" if version_2 else "1.1")
        metrics = {k: float(v) for k, v in scores.items() if k not in ("total", "missing")}
        warnings = []
        if predictions and len(set(predictions.values())) == 1:
            warnings.append(f"every one of {len(predictions)} questions got the same answer "
                            f"{next(iter(predictions.values()))!r}: training has not taken hold")
        return metrics, {}, warnings


FAMILY = QuestionAnswering()
