"""Sequence classification: single sentences and pairs, single-label, multi-label or regression.

Owns: the model (`BertForSequenceClassification`: pooled [CLS] -> dropout -> classifier), its objective
(cross-entropy, BCE or MSE by `config.problem_type`, one function used by the model's `forward(labels=...)`
and by the training loop; single-label training may weigh classes or use focal loss, see `LossSettings`),
features (``[CLS] A [SEP] (B [SEP])``, long inputs windowed), decoding (the mean of an example's window
logits, then softmax / sigmoid / the raw value), metrics and the pipeline's JSON. Examples and their file
readers are in `data.classification`.

Multi-label: a row has any number of labels; the head has one sigmoid per label and decides each label
with a threshold. Fine-tuning tunes the thresholds on dev (`calibrate`: one for all labels or one per
label) and stores them in the model's config (`label_thresholds`), so evaluate, predict and the server
decide with the same thresholds; a per-call `threshold` option overrides them.

Long inputs: an input longer than `max_seq_length` is split into windows over its longer segment
(`tokenization.windows`; the shorter segment is kept whole, or cut to half the room, counted in the
report). Training trains on every window with the example's label; every consumer (evaluation,
predict, pipelines, server) averages the windows' *logits* and then turns the mean into probabilities.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertforge.data.classification import ClassificationExample, check_labels, label_list, read_classification
from bertforge.data.finetuning import DataReport, Feature
from bertforge.errors import CheckpointError, ConfigError, DataError, InputError
from bertforge.families.base import (
    MULTI_LABEL,
    REGRESSION,
    SINGLE_LABEL,
    Family,
    FamilyTraining,
    FineTuningModel,
    InputSettings,
    LossSettings,
    Objective,
    check_number,
    check_text,
    label_loss,
    mean_loss,
    softmax,
    symmetric_kl,
    text_of,
)
from bertforge.metrics.classification import (
    CLASSIFICATION_METRICS,
    MULTI_LABEL_METRICS,
    REGRESSION_METRICS,
    compute_classification_metrics,
    multi_label_metrics,
    per_class_scores,
    prediction_collapse,
    regression_collapse,
    tune_thresholds,
)
from bertforge.model.config import BertConfig
from bertforge.model.heads import TaskOutput, build_classifier, feature_size, score_lists, sequence_features
from bertforge.tokenization.pairs import pair_windows
from bertforge.tokenization.tokenizer import Tokenizer


def problem_type(config: BertConfig, labels: torch.Tensor | None = None) -> str:
    """`config.problem_type`, or when unset the one Hugging Face infers: one output means regression
    (a checkpoint with `num_labels: 1` and no problem type must not train on a constant-zero loss),
    float labels over several outputs mean multi-label, anything else single-label."""
    if config.problem_type is not None:
        return config.problem_type
    if config.num_labels == 1:
        return REGRESSION
    if labels is not None and labels.is_floating_point():
        return MULTI_LABEL
    return SINGLE_LABEL


def objective(logits: torch.Tensor, labels: torch.Tensor, kind: str,
              loss: LossSettings | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The training objective as {term: (sum, count)}: logits [B, C], labels [B] (or [B, C] multi-label).

    Counts are examples (label entries for multi-label), so the mean is the usual per-example loss
    however a step is split into micro-batches and ranks. `loss` (single-label only) adds class weights
    and/or the focal factor.
    """
    logits = logits.float()
    if kind == REGRESSION:
        return {"mse": (((logits.squeeze(-1) - labels.float()) ** 2).sum(), logits.new_tensor(float(labels.shape[0])))}
    if kind == MULTI_LABEL:
        loss = F.binary_cross_entropy_with_logits(logits, labels.float(), reduction="sum")
        return {"bce": (loss, logits.new_tensor(float(labels.numel())))}
    total, count = label_loss(logits, labels, loss)
    return {"cross_entropy": (total, count)}


class BertForSequenceClassification(FineTuningModel):
    """Pooled [CLS] -> dropout -> classifier; `config.problem_type` picks the objective."""

    head_prefixes = ("classifier.",)

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.dropout = nn.Dropout(config.head_dropout)
        self.classifier = build_classifier(config, feature_size(config), config.num_labels)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                output_attentions: bool = False, output_hidden_states: bool = False) -> TaskOutput:
        if input_ids.dim() == 3:  # lists of pairs (listwise reranking): one output per pair, [B, L, T] -> [B, L]
            return score_lists(lambda *rows: self.forward(*rows, None, output_attentions, output_hidden_states),
                               self.config.num_labels, input_ids, token_type_ids, attention_mask, labels=labels)
        out = self.encode(input_ids, token_type_ids, attention_mask, output_attentions, output_hidden_states)
        logits = self.classifier(self.dropout(sequence_features(self.config, out)))  # [B, C]
        loss = None
        if labels is not None:
            loss = mean_loss(objective(logits, labels, problem_type(self.config, labels)))
        return TaskOutput(logits, loss, out.hidden_states, out.attentions)

    def initial_loss_reference(self) -> torch.Tensor:
        """log(C): the loss of a uniform guess, a sanity bound for the first steps."""
        return torch.log(torch.tensor(float(self.config.num_labels)))


class ClassificationObjective(Objective):
    """The loop's view of one classifier: `objective` for its problem type, plus a running accuracy and
    R-Drop's consistency term."""

    def __init__(self, kind: str, loss: LossSettings | None = None):
        self.kind, self.loss = kind, loss
        self.term = {REGRESSION: "mse", MULTI_LABEL: "bce"}.get(kind, "cross_entropy")

    def counts(self, batch) -> dict[str, torch.Tensor]:
        """Examples in the batch (label entries for multi-label), known before the forward pass."""
        labels = batch.labels
        return {self.term: torch.tensor(float(labels.numel() if self.kind == MULTI_LABEL else labels.shape[0]))}

    def loss_terms(self, output: TaskOutput, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return objective(output.logits, batch.labels, self.kind, self.loss)

    def consistency(self, output_a: TaskOutput, output_b: TaskOutput, batch) -> torch.Tensor:
        """How far two dropout passes disagree, summed over what the loss counts: the symmetric KL of the
        class distributions per example; of each label's Bernoulli per label entry (multi-label); the
        squared difference of the two values (regression)."""
        a, b = output_a.logits.float(), output_b.logits.float()
        if self.kind == REGRESSION:
            return ((a - b) ** 2).sum()
        if self.kind == MULTI_LABEL:  # each label a two-way softmax over (0, logit)
            zeros = torch.zeros_like(a)
            return symmetric_kl(torch.stack([zeros, a], -1).flatten(0, 1), torch.stack([zeros, b], -1).flatten(0, 1))
        return symmetric_kl(a, b)

    def metrics(self, output: TaskOutput, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        logits = output.logits.detach().float()
        labels = batch.labels
        count = logits.new_tensor(float(labels.shape[0]))
        if self.kind == REGRESSION:
            return {"abs_error": ((logits.squeeze(-1) - labels.float()).abs().sum(), count)}
        if self.kind == MULTI_LABEL:
            correct = ((logits > 0) == (labels > 0.5)).float().sum()
            return {"label_accuracy": (correct, logits.new_tensor(float(labels.numel())))}
        return {"accuracy": ((logits.argmax(-1) == labels).float().sum(), count)}


def build_features(examples: Sequence[ClassificationExample], tokenizer: Tokenizer, settings: InputSettings, *,
                   label2id: Mapping[str, int] | None = None, regression: bool = False,
                   report: DataReport | None = None) -> list[Feature]:
    """Tokenise examples into features, windowing every input longer than `settings.max_seq_length`.

    Args:
        examples: the examples.
        tokenizer: the model's tokenizer.
        settings: window length and doc stride.
        label2id: label name -> id (classification); labels must be known (`data.classification.check_labels`).
        regression: labels are float scores.
        report: gets `features`, `windowed_inputs`, `truncated_shorter_segment`.
    """
    report = report if report is not None else DataReport()
    post = tokenizer.post_processor
    features: list[Feature] = []
    for index, example in enumerate(examples):
        a = tokenizer.encode(example.text_a, add_special_tokens=False).ids
        b = None if example.text_b is None else tokenizer.encode(example.text_b, add_special_tokens=False).ids
        label: int | float | list[float] | None = None
        if isinstance(example.label, tuple):  # multi-label: one 0/1 target per label
            label = [0.0] * len(label2id)
            for name in example.label:
                label[label2id[name]] = 1.0
        elif example.label is not None:
            label = float(example.label) if regression else label2id[example.label]
        # Windows over the longer segment; the shorter is kept whole, or cut to half the budget.
        pair = pair_windows(a, b, post, settings.max_seq_length, long="longer", doc_stride=settings.doc_stride)
        if pair.short_cut:
            report.note("truncated_shorter_segment", example.source)
        if len(pair.windows) > 1:
            report.note("windowed_inputs", example.source)
        features += [Feature(index, w.ids, w.type_ids, label=label, window=w.index) for w in pair.windows]
    report.note("features", amount=len(features))
    return features


def mean_window_logits(features: Sequence[Feature], logits: Sequence[np.ndarray], num_examples: int) -> np.ndarray:
    """Mean of the window logits of each example: [num_examples, C] from per-feature [C] arrays."""
    width = len(logits[0])
    total = np.zeros((num_examples, width), dtype=np.float64)
    count = np.zeros(num_examples, dtype=np.int64)
    for feature, row in zip(features, logits):
        total[feature.example_index] += np.asarray(row, dtype=np.float64)
        count[feature.example_index] += 1
    if (count == 0).any():
        raise ValueError(f"{int((count == 0).sum())} examples have no feature; features and examples do not match")
    return total / count[:, None]


# What a regression task reports first (its evaluations can report every name of REGRESSION_METRICS).
REGRESSION_DEFAULTS = ("pearson", "spearman")


class ClassificationTraining(FamilyTraining):
    """What fine-tuning asks of classification: the run's labels and head by problem kind, class weights from
    the data, the settings each kind honours and its objective."""

    settings = frozenset({"head.class_weights", "head.balanced_class_weights", "head.focal_gamma", "head.thresholds",
                          "data.multi_label", "data.label_separator"})

    def format_reader(self, format_name):
        return {"text_a_column": "text_a", "label_column": "label",
                **({"text_b_column": "text_b"} if format_name == "pair" else {})}

    def label_names(self, examples, given, settings, kind=None):
        return None if kind == REGRESSION else list(given or label_list(examples))

    def head_config(self, label_names, kind=None):
        if kind == REGRESSION:
            return {"problem_type": REGRESSION, "id2label": None, "label2id": None}
        return {"problem_type": kind or SINGLE_LABEL, "id2label": dict(enumerate(label_names)),
                "label2id": None, "label_thresholds": None}

    def label_counts(self, examples, label_names, settings) -> list[int]:
        """Training examples per label (label-name order), for class weights computed from the data."""
        index = {name: i for i, name in enumerate(label_names)}
        counts = [0] * len(label_names)
        for example in examples:
            for name in example.label if isinstance(example.label, tuple) else (example.label,):
                if name is not None:
                    counts[index[name]] += 1
        return counts

    def run_settings(self, kind):
        """Class weights and focal loss weigh single-label cross-entropy; thresholds and the label separator
        are multi-label's; regression has none of them."""
        if kind == SINGLE_LABEL:
            return frozenset({"head.class_weights", "head.balanced_class_weights", "head.focal_gamma"})
        if kind == MULTI_LABEL:
            return frozenset({"head.thresholds", "data.multi_label", "data.label_separator"})
        return frozenset()

    def objective_for(self, config: BertConfig, loss: LossSettings | None = None) -> ClassificationObjective:
        self.refuse_contrastive(loss)
        kind = problem_type(config)
        if loss is not None and not loss.plain:
            if kind != SINGLE_LABEL:
                raise ConfigError(f"class weights and focal loss apply to single-label classification; this model is "
                                  f"{kind.replace('_', ' ')}: remove head.class_weights / head.focal_gamma")
            loss.check_labels(config.num_labels)
        return ClassificationObjective(kind, loss)


class Classification(Family):
    """Single sentences and pairs: labels (single or multi) or a regression value."""

    name = "classification"
    aliases = ("sequence_classification", "classify", "regression", "pair", "text")
    model_class = BertForSequenceClassification
    task = "classify"
    # threshold (multi-label): None = the model's tuned `label_thresholds` (0.5 without them).
    options = {"threshold": None}
    kinds = (SINGLE_LABEL, MULTI_LABEL, REGRESSION)
    formats = {"classification": SINGLE_LABEL, "pair": SINGLE_LABEL, "multilabel": MULTI_LABEL,
               "regression": REGRESSION}
    training_hooks = ClassificationTraining
    export_outputs = {"logits": {0: "batch"}}
    example_inputs = ["This film was a delight from start to finish.",
                    {"text": "A man is playing a guitar.", "text_pair": "Someone is making music."},
                    "The service was slow and the food arrived cold."]

    def read(self, path, *, part, task, report, labelled=True):
        reader = task.reader
        return read_classification(path, text_a=reader.text_a_column, text_b=reader.text_b_column,
                                   label=reader.label_column if labelled else None, header=reader.header,
                                   regression=task.kind == REGRESSION, file_format=reader.file_format,
                                   on_invalid=reader.on_invalid, report=report, multi_label=task.kind == MULTI_LABEL,
                                   label_separator=reader.label_separator or ",", id_column=reader.id_column)

    def metric_defaults(self, kind, reader=None):
        return REGRESSION_DEFAULTS if kind == REGRESSION else MULTI_LABEL_METRICS if kind == MULTI_LABEL \
            else self.default_metrics

    def metric_names(self, task, dev_examples=None):
        # Any name of `metrics.classification` can be computed when asked (`requested_metrics`).
        return REGRESSION_METRICS if task.kind == REGRESSION else MULTI_LABEL_METRICS if task.kind == MULTI_LABEL \
            else CLASSIFICATION_METRICS

    def requested_metrics(self, task, chosen, config):
        names = list(task.metrics) if task.kind == REGRESSION or tuple(task.metrics) != ("accuracy",) else None
        if chosen is None or task.kind == MULTI_LABEL:
            return names
        if names is None:  # compute_classification_metrics' defaults, binary or not
            binary = len(getattr(config, "label_names", None) or []) == 2
            names = ["accuracy", "f1", "precision", "recall", "mcc"] if binary else ["accuracy", "macro_f1", "mcc"]
            if chosen in names:
                return None
        return names if chosen in names else [*names, chosen]

    def check_labels(self, examples, label_names, settings, origin="training"):
        if label_names is not None:
            check_labels(examples, {name: i for i, name in enumerate(label_names)}, origin)

    def check_model(self, config: BertConfig) -> None:
        if problem_type(config) != REGRESSION and not config.id2label:
            raise CheckpointError("the model's config.json has no id2label (label names); add them, e.g. "
                                  "\"id2label\": {\"0\": \"negative\", \"1\": \"positive\"}")

    def validate_options(self, options):
        if options["threshold"] is not None:
            check_number(options, "threshold", 0, 1)

    def parse(self, item: Any) -> ClassificationExample:
        if isinstance(item, str):
            return ClassificationExample(check_text(item, "text"), None, None, "input")
        if isinstance(item, list | tuple):
            if not 1 <= len(item) <= 2:
                raise InputError(f"a list input must be [text] or [text, text_pair], got {len(item)} elements")
            pair = check_text(item[1], "text_pair") if len(item) == 2 else None
            return ClassificationExample(check_text(item[0], "text"), pair, None, "input")
        if isinstance(item, Mapping):
            pair = item.get("text_pair")
            return ClassificationExample(text_of(item), None if pair is None else check_text(pair, "text_pair"),
                                         None, "input")
        raise InputError(f"expected a string, [text, text_pair] or {{\"text\": ..., \"text_pair\": ...}}, "
                         f"got {type(item).__name__}")

    def windowed_texts(self, example):
        # The longer segment is windowed (`build_features`): its tokens are at least either segment's.
        return [max((t for t in (example.text_a, example.text_b) if t is not None), key=len)]

    def features(self, examples, tokenizer, settings, *, config, report=None, training=False):
        kind = problem_type(config)
        return build_features(examples, tokenizer, settings, label2id=config.label2id if kind != REGRESSION else None,
                              regression=kind == REGRESSION, report=report)

    def decode(self, examples, features, outputs, options, config, tokenizer=None):
        logits = mean_window_logits(features, outputs, len(examples))  # [N, C]
        windows = np.bincount([f.example_index for f in features], minlength=len(examples))
        kind = problem_type(config)
        results = []
        if kind == REGRESSION:
            return [{"value": float(row[0]), "windows": int(n)} for row, n in zip(logits, windows)]
        names = config.label_names
        scores = 1 / (1 + np.exp(-logits)) if kind == MULTI_LABEL else softmax(logits)
        thresholds = decision_thresholds(config, options.get("threshold"))
        for row, n in zip(scores, windows):
            by_label = {name: float(s) for name, s in zip(names, row)}
            if kind == MULTI_LABEL:
                results.append({"labels": [k for k, s, t in zip(names, row, thresholds) if s >= t],
                                "scores": by_label, "windows": int(n)})
            else:
                best = int(row.argmax())
                results.append({"label": names[best], "score": float(row[best]), "scores": by_label,
                                "windows": int(n)})
        return results

    def record(self, example, result):
        gold = list(example.label) if isinstance(example.label, tuple) else example.label
        return {"text_a": example.text_a, "text_b": example.text_b, "gold": gold, **result}

    def calibrate(self, examples, results, config, mode):
        """Multi-label: thresholds tuned on these (dev) results, one for all labels (`mode` "global") or one
        per label ("per_label"), as config changes; other problem types have nothing to tune ({})."""
        if problem_type(config) != MULTI_LABEL or mode is None:
            return {}
        scores, gold = multi_label_arrays(examples, results, config.label_names)
        return {"label_thresholds": tune_thresholds(scores, gold, per_label=mode == "per_label")}

    def score(self, examples, results, config, *, metric_names=None, **_):
        kind = problem_type(config)
        if kind == REGRESSION:
            predicted = [r["value"] for r in results]
            gold = [float(e.label) for e in examples]
            warnings = [w for w in [regression_collapse(predicted, gold)] if w]
            return compute_classification_metrics(predicted, gold, "regression", metric_names), {}, warnings
        names = config.label_names
        if kind == MULTI_LABEL:
            decided = [[name in set(r["labels"]) for name in names] for r in results]
            _, gold = multi_label_arrays(examples, results, names)
            metrics, per_label = multi_label_metrics(decided, gold, names)
            if metric_names is not None:
                metrics = {k: metrics[k] for k in metric_names if k in metrics} or metrics
            warnings = []
            if not any(any(row) for row in decided):
                warnings.append(f"no label assigned to any of {len(examples)} examples: every score is below its "
                                "threshold (too few steps, or thresholds too high)")
            return metrics, {"per_label": per_label, "thresholds": decision_thresholds(config, None)}, warnings
        index = {name: i for i, name in enumerate(names)}
        predicted = [index[r["label"]] for r in results]
        gold = [index[e.label] for e in examples]
        extra = {"positive_label": 1} if len(index) == 2 else {}
        metrics = compute_classification_metrics(predicted, gold, "classification", metric_names, **extra)
        predicted_names, gold_names = [names[p] for p in predicted], [names[g] for g in gold]
        warnings = [w for w in [prediction_collapse(predicted_names, gold_names)] if w]
        # Per-class recall shows a rare class the model ignores behind a good accuracy.
        details = {"per_class": per_class_scores(predicted_names, gold_names, names)}
        return metrics, details, warnings


def decision_thresholds(config: BertConfig, override: float | None) -> list[float]:
    """One threshold per label: the call's `threshold` option, else the model's tuned `label_thresholds`
    (one for all labels, or one each), else 0.5."""
    count = config.num_labels
    if override is not None:
        return [float(override)] * count
    stored = config.label_thresholds or [0.5]
    if len(stored) == 1:
        return stored * count
    if len(stored) != count:
        raise CheckpointError(f"the model's config.json has {len(stored)} label_thresholds for {count} labels; give "
                              "one threshold or one per label")
    return list(stored)


def multi_label_arrays(examples, results, names) -> tuple[list[list[float]], list[list[bool]]]:
    """(scores [N][C], gold [N][C]) of multi-label results against their examples' labels, in `names` order."""
    if any(not isinstance(e.label, tuple) for e in examples):
        raise DataError("multi-label scoring needs every example's labels as a list; the data was read as "
                        "single-label (set data.multi_label, or --format multilabel)")
    scores = [[r["scores"][name] for name in names] for r in results]
    gold = [[name in e.label for name in names] for e in examples]
    return scores, gold


FAMILY = Classification()
