"""Multiple choice (SWAG style): every choice is encoded with the context, one score per choice.

Owns: the models (`BertForMultipleChoice` and `ModernBertForMultipleChoice`: inputs [B, C, T], each choice's
row pooled and scored, softmax over C), their objective (cross-entropy over the choices), features, decoding,
accuracy and the pipeline's JSON. Questions and their file reader are in `data.multiple_choice`.

Features: one ``[CLS] context [SEP] start + ending [SEP]`` row per choice. A long context is windowed like
every other family's long segment (`tokenization.windows`), the same windows for every choice, so a window
is one [C, T] input; the endings are kept whole (or cut to half the room, counted as `truncated_inputs`).
Training trains on every window with the question's label; decoding averages the windows' choice logits,
as classification does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.data.finetuning import DataReport, Feature
from bertforge.data.multiple_choice import ChoiceExample, read_choice
from bertforge.errors import DataError, InputError
from bertforge.families.base import (
    Family,
    FamilyTraining,
    FineTuningModel,
    InputSettings,
    LossSettings,
    Objective,
    check_text,
    mean_loss,
    softmax,
)
from bertforge.families.classification import mean_window_logits
from bertforge.metrics.classification import compute_classification_metrics, prediction_collapse
from bertforge.model.bert import BertOutput
from bertforge.model.config import BertConfig
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.heads import TaskOutput, build_classifier, feature_size, sequence_features
from bertforge.model.modernbert import ModernBertClassifier, classifier_pool
from bertforge.tokenization.pairs import pair_windows
from bertforge.tokenization.tokenizer import Tokenizer


def objective(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Cross-entropy over the C choices summed over questions, with the question count: logits [B, C]."""
    logits = logits.float()
    return {"cross_entropy": (F.cross_entropy(logits, labels.long(), reduction="sum"),
                              logits.new_tensor(float(logits.shape[0])))}


def flat_choices(x: torch.Tensor | None) -> torch.Tensor | None:
    """A choice batch's rows as one batch: [B, C, T] -> [B*C, T] (None stays None)."""
    return None if x is None else x.flatten(0, 1)


def choice_output(scores: torch.Tensor, choices: int, labels: torch.Tensor | None, out: BertOutput) -> TaskOutput:
    """A choice head's answer from one score per row [B*C, 1] and its encoder's output `out`: logits [B, C],
    the loss when labels are given. Every choice head ends here, BERT's and ModernBERT's."""
    logits = scores.view(-1, choices)  # [B*C, 1] -> [B, C]
    loss = None if labels is None else mean_loss(objective(logits, labels))
    return TaskOutput(logits, loss, out.hidden_states, out.attentions)


class BertForMultipleChoice(FineTuningModel):
    """Inputs [B, C, T] are flattened to [B*C, T]; each pooled [CLS] scores one choice; softmax over C."""

    head_prefixes = ("classifier.",)

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.dropout = nn.Dropout(config.head_dropout)
        self.classifier = build_classifier(config, feature_size(config), 1)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                output_attentions: bool = False, output_hidden_states: bool = False) -> TaskOutput:
        out = self.encode(flat_choices(input_ids), flat_choices(token_type_ids), flat_choices(attention_mask),
                          output_attentions, output_hidden_states)
        scores = self.classifier(self.dropout(sequence_features(self.config, out)))  # [B*C, 1]
        return choice_output(scores, input_ids.shape[1], labels, out)


class ModernBertForMultipleChoice(ModernBertClassifier):
    """ModernBERT's choice head, as transformers' (so the directory loads there): inputs [B, C, T] flattened to
    [B*C, T], each row pooled (`classifier_pooling`: [CLS] or the mean of its real tokens), prediction head,
    dropout, one score per row -> logits [B, C]; softmax over C."""

    @staticmethod
    def classifier_width(config: ModernBertConfig) -> int:
        return 1  # one score a choice

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                output_attentions: bool = False, output_hidden_states: bool = False, *,
                position_ids: torch.Tensor | None = None) -> TaskOutput:
        """Arguments in `BertForMultipleChoice.forward`'s order; token_type_ids are unused (no segments);
        position_ids, when given, are [B, C, T]."""
        mask = flat_choices(attention_mask)  # [B*C, T]
        out, features = self.encode_features(flat_choices(input_ids), mask, flat_choices(position_ids),
                                             output_hidden_states, output_attentions)
        pooled = self.head(classifier_pool(self.config, features, mask))  # [B*C, T, H*k] -> [B*C, H]
        scores = self.classifier(self.dropout(pooled))  # [B*C, 1]
        return choice_output(scores, input_ids.shape[1], labels, out)


def build_features(examples: Sequence[ChoiceExample], tokenizer: Tokenizer, settings: InputSettings, *,
                   report: DataReport | None = None) -> list[Feature]:
    """One [C][T] feature per context window of each question (see the module docstring).

    Raises:
        DataError: questions with different numbers of choices (a batch needs one C).
    """
    report = report if report is not None else DataReport()
    post = tokenizer.post_processor
    features = []
    count = None
    for index, example in enumerate(examples):
        if count is None:
            count = len(example.endings)
        elif len(example.endings) != count:
            path, _, line = example.source.rpartition(":")
            raise DataError(f"{len(example.endings)} choices where earlier questions have {count} (questions run "
                            "together need the same number of endings)", path or None,
                            int(line) if line.isdigit() else None)
        context = tokenizer.encode(example.context, add_special_tokens=False).ids
        endings = [tokenizer.encode(f"{example.start} {ending}".strip(), add_special_tokens=False).ids
                   for ending in example.endings]
        # Every ending is budgeted at the longest one, so all choices get the same context windows.
        longest = max(map(len, endings))
        choices = [pair_windows(context, ending, post, settings.max_seq_length, long="first",
                                doc_stride=settings.doc_stride, short_length=longest) for ending in endings]
        if any(choice.short_cut for choice in choices):
            report.note("truncated_inputs", example.source)
        if len(choices[0].windows) > 1:
            report.note("windowed_inputs", example.source)
        for rows in zip(*(choice.windows for choice in choices)):
            features.append(Feature(index, [row.ids for row in rows], [row.type_ids for row in rows],
                                    label=example.label, window=rows[0].index))
    report.note("features", amount=len(features))
    return features


class ChoiceObjective(Objective):
    """The training loop's view of a multiple-choice model: cross-entropy over each question's choices."""

    def counts(self, batch) -> dict[str, torch.Tensor]:
        """Questions in the batch."""
        return {"cross_entropy": torch.tensor(float(batch.labels.shape[0]))}

    def loss_terms(self, output, batch):
        return objective(output.logits, batch.labels)

    def metrics(self, output, batch):
        logits = output.logits.detach()
        return {"accuracy": ((logits.argmax(-1) == batch.labels).float().sum(),
                             logits.new_tensor(float(logits.shape[0])))}


class MultipleChoiceTraining(FamilyTraining):
    """What fine-tuning asks of multiple choice: the settings it honours and the choice objective."""

    settings = frozenset({"data.context_column", "data.start_column", "data.ending_columns"})

    def objective_for(self, config: BertConfig, loss: LossSettings | None = None) -> ChoiceObjective:
        self.refuse_loss_settings(loss)
        return ChoiceObjective()


class MultipleChoice(Family):
    """The right ending among several."""

    name = "multiple_choice"
    aliases = ("choice", "choose", "swag")
    model_class = BertForMultipleChoice
    task = "choose"
    options: dict[str, Any] = {}
    export_outputs = {"logits": {0: "batch", 1: "choices"}}
    input_axes = {0: "batch", 1: "choices", 2: "sequence"}
    example_inputs = [{"context": "She opened the umbrella.", "endings": ["It was raining.", "It was sunny."]}]

    formats = {"choice": None}
    training_hooks = MultipleChoiceTraining

    def read(self, path, *, part, task, report, labelled=True):
        reader = task.reader
        return read_choice(path, context_column=reader.context_column, start_column=reader.start_column,
                           ending_columns=reader.ending_columns, label_column="label" if labelled else None,
                           file_format=reader.file_format, on_invalid=reader.on_invalid, report=report)

    def parse(self, item: Any) -> ChoiceExample:
        if not isinstance(item, Mapping):
            raise InputError(f"expected an object {{\"context\": ..., \"endings\": [...]}}, got {type(item).__name__}")
        missing = [k for k in ("context", "endings") if k not in item]
        if missing:
            raise InputError(f"missing field(s) {missing}; send {{\"context\": ..., \"endings\": [...]}}")
        endings = item["endings"]
        if not isinstance(endings, list) or len(endings) < 2:
            raise InputError("endings must be a list of at least two strings")
        start = item.get("start", "")
        if not isinstance(start, str):
            raise InputError("start must be a string")
        return ChoiceExample(check_text(item["context"], "context"), start,
                             [check_text(e, f"endings[{i}]") for i, e in enumerate(endings)], None, "input")

    def features(self, examples, tokenizer, settings, *, config, report=None, training=False):
        return build_features(examples, tokenizer, settings, report=report)

    def decode(self, examples, features, outputs, options, config, tokenizer=None):
        logits = mean_window_logits(features, outputs, len(examples))  # [N, C]
        probabilities = softmax(logits)
        return [{"choice": int(row.argmax()), "score": float(p[int(row.argmax())]),
                 "scores": [float(v) for v in p], "logits": [float(v) for v in row]}
                for row, p in zip(logits, probabilities)]

    def record(self, example, result):
        return {"context": example.context, "endings": example.endings, "gold": example.label,
                "prediction": result["choice"], **result}

    def score(self, examples, results, config, **_):
        predicted = [r["choice"] for r in results]
        gold = [e.label for e in examples]
        metrics = compute_classification_metrics(predicted, gold, "classification", ["accuracy"])
        return metrics, {}, [w for w in [prediction_collapse(predicted, gold)] if w]


FAMILY = MultipleChoice()
