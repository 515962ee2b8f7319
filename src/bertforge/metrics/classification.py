"""Sequence-level classification and regression metrics (GLUE-style), in plain Python.

Owns accuracy, precision/recall/F1 (binary for one positive label, and macro over classes), Matthews
correlation (the multi-class form, which reduces to the textbook binary MCC), Pearson and Spearman
correlation (Spearman with average ranks for ties), the named-metric entry point
`compute_classification_metrics` used by evaluation, `prediction_collapse` / `regression_collapse`,
which spot a model that predicts one class (for regression, one value) for everything or, against
balanced labels, nearly everything, per-class scores, multi-label metrics (micro/macro F1) and the tuning
of multi-label decision thresholds.

Inputs are any sequences (lists, tuples, numpy arrays) of hashable labels or of numbers; nothing here
imports torch. Undefined ratios (a class never predicted, a constant input to a correlation) are 0.0,
never NaN, so that best-checkpoint selection and JSON logs stay well defined; this matches scikit-learn's
`zero_division=0` and its MCC convention.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence

import numpy as np

from bertforge.errors import ConfigError, InputError

CLASSIFICATION_METRICS = ("accuracy", "f1", "precision", "recall", "macro_f1", "macro_precision",
                          "macro_recall", "mcc")
REGRESSION_METRICS = ("pearson", "spearman", "mse")


def _paired(predictions: Iterable, labels: Iterable) -> tuple[list, list]:
    """Materialise both inputs as lists and check they line up.

    Raises:
        InputError: if the lengths differ or there are no examples.
    """
    predictions = list(predictions)
    labels = list(labels)
    if len(predictions) != len(labels):
        raise InputError(
            f"got {len(predictions)} predictions for {len(labels)} labels; pass one prediction per example"
        )
    if not predictions:
        raise InputError("got no predictions and no labels; a metric needs at least one example")
    return predictions, labels


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0


def _f1_from(precision: float, recall: float) -> float:
    return _ratio(2 * precision * recall, precision + recall)


def accuracy(predictions: Sequence[Hashable], labels: Sequence[Hashable]) -> float:
    """Fraction of examples whose prediction equals the label.

    Args:
        predictions: [n] predicted classes.
        labels: [n] gold classes.

    Returns:
        A float in [0, 1].
    """
    predictions, labels = _paired(predictions, labels)
    return sum(p == y for p, y in zip(predictions, labels)) / len(labels)


def precision_recall_f1(
    predictions: Sequence[Hashable],
    labels: Sequence[Hashable],
    average: str = "binary",
    positive_label: Hashable = 1,
) -> tuple[float, float, float]:
    """Precision, recall and F1.

    Args:
        predictions: [n] predicted classes.
        labels: [n] gold classes.
        average: "binary" scores `positive_label` against everything else (one-vs-rest when there are more
            than two classes); "macro" is the unweighted mean of the per-class scores over every class that
            occurs in `labels` or `predictions` (scikit-learn's `average="macro"`).
        positive_label: the class "binary" scores.

    Returns:
        (precision, recall, f1), each in [0, 1]; a zero denominator gives 0.0.

    Raises:
        ConfigError: if `average` is not "binary" or "macro".
    """
    predictions, labels = _paired(predictions, labels)
    if average == "binary":
        return _class_scores(predictions, labels, positive_label)
    if average == "macro":
        classes = sorted(set(labels) | set(predictions), key=repr)
        per_class = [_class_scores(predictions, labels, c) for c in classes]
        return tuple(sum(scores[i] for scores in per_class) / len(per_class) for i in range(3))
    raise ConfigError(f"average={average!r} is not supported; use 'binary' or 'macro'")


def _class_scores(predictions: list, labels: list, positive: Hashable) -> tuple[float, float, float]:
    true_positives = sum(p == positive and y == positive for p, y in zip(predictions, labels))
    precision = _ratio(true_positives, sum(p == positive for p in predictions))
    recall = _ratio(true_positives, sum(y == positive for y in labels))
    return precision, recall, _f1_from(precision, recall)


def matthews_corrcoef(predictions: Sequence[Hashable], labels: Sequence[Hashable]) -> float:
    """Matthews correlation coefficient (the GLUE CoLA metric), for any number of classes.

    Uses the multi-class form (Gorodkin 2004), which for two classes equals
    (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)):

        MCC = (c*s - sum_k p_k*t_k) / sqrt((s^2 - sum_k p_k^2) * (s^2 - sum_k t_k^2))

    with s examples, c correct, p_k predictions of class k and t_k gold examples of class k.

    Args:
        predictions: [n] predicted classes.
        labels: [n] gold classes.

    Returns:
        A float in [-1, 1]; 0.0 when either side holds a single class (the formula is 0/0 there).
    """
    predictions, labels = _paired(predictions, labels)
    total = len(labels)
    correct = sum(p == y for p, y in zip(predictions, labels))
    predicted_counts = Counter(predictions)
    true_counts = Counter(labels)
    covariance = correct * total - sum(predicted_counts[k] * true_counts[k] for k in true_counts)
    predicted_spread = total * total - sum(n * n for n in predicted_counts.values())
    true_spread = total * total - sum(n * n for n in true_counts.values())
    # Integer arithmetic up to here keeps the result exact for large n; only the square root is float.
    return _ratio(covariance, math.sqrt(predicted_spread) * math.sqrt(true_spread))


def pearson(predictions: Sequence[float], labels: Sequence[float]) -> float:
    """Pearson correlation of two equally long sequences of numbers.

    Args:
        predictions: [n] predicted scores.
        labels: [n] gold scores.

    Returns:
        A float in [-1, 1]; 0.0 when either side is constant (the correlation is undefined there).
    """
    predictions, labels = _paired(predictions, labels)
    xs = [float(x) for x in predictions]
    ys = [float(y) for y in labels]
    mean_x = math.fsum(xs) / len(xs)
    mean_y = math.fsum(ys) / len(ys)
    dx = [x - mean_x for x in xs]
    dy = [y - mean_y for y in ys]
    covariance = math.fsum(a * b for a, b in zip(dx, dy))
    spread = math.sqrt(math.fsum(a * a for a in dx)) * math.sqrt(math.fsum(b * b for b in dy))
    # Clamp: rounding can push a perfect correlation a hair past 1.
    return max(-1.0, min(1.0, _ratio(covariance, spread)))


def average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, where tied values share the mean of the ranks they span.

    Example: [10, 20, 20, 30] -> [1.0, 2.5, 2.5, 4.0].

    Args:
        values: [n] numbers.

    Returns:
        [n] ranks as floats.
    """
    values = [float(v) for v in values]
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        # Positions start..end (0-based) hold ranks start+1..end+1; their mean is the shared rank.
        shared = (start + end) / 2 + 1
        for position in range(start, end + 1):
            ranks[order[position]] = shared
        start = end + 1
    return ranks


def spearman(predictions: Sequence[float], labels: Sequence[float]) -> float:
    """Spearman rank correlation: Pearson correlation of the average ranks (ties share their mean rank).

    Args:
        predictions: [n] predicted scores.
        labels: [n] gold scores.

    Returns:
        A float in [-1, 1]; 0.0 when either side is constant.
    """
    predictions, labels = _paired(predictions, labels)
    return pearson(average_ranks(predictions), average_ranks(labels))


def mean_squared_error(predictions: Sequence[float], labels: Sequence[float]) -> float:
    """Mean of the squared differences.

    Args:
        predictions: [n] predicted scores.
        labels: [n] gold scores.
    """
    predictions, labels = _paired(predictions, labels)
    return math.fsum((float(p) - float(y)) ** 2 for p, y in zip(predictions, labels)) / len(labels)


def _is_binary(predictions: list, labels: list) -> bool:
    return set(predictions) | set(labels) <= {0, 1}


def compute_classification_metrics(
    predictions: Sequence,
    labels: Sequence,
    kind: str = "classification",
    metric_names: Sequence[str] | None = None,
    positive_label: Hashable = 1,
) -> dict[str, float]:
    """Compute a set of named metrics, for logging and for choosing the best checkpoint.

    Names for kind "classification": accuracy, f1, precision, recall (binary, for `positive_label`),
    macro_f1, macro_precision, macro_recall, mcc. Names for kind "regression": pearson, spearman, mse.

    By default a classification run reports accuracy, f1, precision, recall and mcc when every label and
    prediction is 0 or 1, and accuracy, macro_f1 and mcc otherwise; a regression run reports pearson and
    spearman (the STS-B pair).

    Args:
        predictions: [n] predicted class ids (classification) or scores (regression).
        labels: [n] gold class ids or scores.
        kind: "classification" or "regression".
        metric_names: the names to compute, in the order wanted; None picks the defaults above.
        positive_label: the class the binary metrics score.

    Returns:
        {name: value} in the order of `metric_names`, e.g. {"accuracy": 0.9, "f1": 0.88, ...}.

    Raises:
        ConfigError: for an unknown kind or metric name.
        InputError: if the lengths differ or there are no examples.
    """
    predictions, labels = _paired(predictions, labels)
    if kind == "classification":
        known = CLASSIFICATION_METRICS
        if metric_names is None:
            metric_names = (
                ("accuracy", "f1", "precision", "recall", "mcc")
                if _is_binary(predictions, labels)
                else ("accuracy", "macro_f1", "mcc")
            )
    elif kind == "regression":
        known = REGRESSION_METRICS
        if metric_names is None:
            metric_names = ("pearson", "spearman")
    else:
        raise ConfigError(f"kind={kind!r} is not a metric kind; use 'classification' or 'regression'")
    unknown = [name for name in metric_names if name not in known]
    if unknown:
        raise ConfigError(
            f"unknown {kind} metric(s) {unknown}; choose from {list(known)}"
        )

    results: dict[str, float] = {}
    binary: tuple[float, float, float] | None = None
    macro: tuple[float, float, float] | None = None
    for name in metric_names:
        if name == "accuracy":
            results[name] = accuracy(predictions, labels)
        elif name in ("precision", "recall", "f1"):
            if binary is None:
                binary = precision_recall_f1(predictions, labels, "binary", positive_label)
            results[name] = binary[("precision", "recall", "f1").index(name)]
        elif name in ("macro_precision", "macro_recall", "macro_f1"):
            if macro is None:
                macro = precision_recall_f1(predictions, labels, "macro")
            results[name] = macro[("macro_precision", "macro_recall", "macro_f1").index(name)]
        elif name == "mcc":
            results[name] = matthews_corrcoef(predictions, labels)
        elif name == "pearson":
            results[name] = pearson(predictions, labels)
        elif name == "spearman":
            results[name] = spearman(predictions, labels)
        elif name == "mse":
            results[name] = mean_squared_error(predictions, labels)
    return results


# Near collapse: one class takes at least this share of the predictions while the gold labels hold it at
# least NEAR_COLLAPSE_EXCESS less often. ChnSentiCorp fine-tuned badly: 0.63 accuracy, MCC ~0, nearly every
# prediction one class with balanced labels; at least one other prediction kept the all-same check quiet.
NEAR_COLLAPSE_SHARE = 0.9
NEAR_COLLAPSE_EXCESS = 0.2
# Fewer predictions than this cannot tell a near collapse from a few unlucky examples.
NEAR_COLLAPSE_MIN_EXAMPLES = 10


def prediction_collapse(predictions: Sequence[Hashable], labels: Sequence[Hashable] | None = None) -> str | None:
    """Warn when a classifier predicts the same class for every example, or (given the gold labels) for
    nearly every example while the labels are much more balanced.

    A collapsed model still scores the majority-class accuracy, which can look plausible in a log;
    its MCC and macro F1 give it away, and this message says so in words.

    Args:
        predictions: [n] predicted classes.
        labels: [n] gold classes, optional. With them, a near collapse is also reported: one class is at least
            `NEAR_COLLAPSE_SHARE` of the predictions and at least `NEAR_COLLAPSE_EXCESS` more than its share of
            the labels (at least `NEAR_COLLAPSE_MIN_EXAMPLES` predictions).

    Returns:
        A one-line warning, or None when there are at least two distinct predictions and no near collapse (or
        fewer than two predictions, where collapse cannot be told apart from chance).
    """
    predictions = list(predictions)
    if len(predictions) < 2:
        return None
    causes = "(usual causes: learning rate too high, too few training steps, or very imbalanced labels)"
    (top, count), *others = Counter(predictions).most_common()
    if not others:
        return f"all {len(predictions)} predictions are class {top!r}: the model has collapsed to one class {causes}"
    if labels is None or len(predictions) < NEAR_COLLAPSE_MIN_EXAMPLES:
        return None
    labels = list(labels)
    share = count / len(predictions)
    gold_share = sum(label == top for label in labels) / max(len(labels), 1)
    if share < NEAR_COLLAPSE_SHARE or share - gold_share < NEAR_COLLAPSE_EXCESS:
        return None
    return (f"{count} of {len(predictions)} predictions ({100 * share:.0f}%) are class {top!r}, which is "
            f"{100 * gold_share:.0f}% of the labels: the model has nearly collapsed to one class (MCC "
            f"{matthews_corrcoef(predictions, labels):.3f}) {causes}")


# A regression model has collapsed when its predictions spread less than this fraction of the gold scores'
# spread (STS-B gold: std 1.5 on 0-5; a collapsed model: std 0.005).
REGRESSION_COLLAPSE_RATIO = 0.05


def regression_collapse(predictions: Sequence[float], labels: Sequence[float] | None = None,
                        ratio: float = REGRESSION_COLLAPSE_RATIO) -> str | None:
    """Warn when a regression model predicts (nearly) the same value for every example.

    Its Pearson and Spearman correlations may still be computed from the tiny variations left, and its MSE
    is the gold variance; this message says in words what happened.

    Args:
        predictions: [n] predicted values.
        labels: [n] gold values; the spread of the predictions is compared with theirs.
        ratio: collapsed when std(predictions) < ratio * std(labels). Without labels (or constant labels)
            only predictions that are all equal count as collapsed.

    Returns:
        A one-line warning, or None (also for fewer than two predictions).
    """
    values = [float(v) for v in predictions]
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    spread = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    gold = [float(v) for v in labels] if labels is not None else []
    gold_spread = 0.0
    if len(gold) >= 2:
        gold_mean = sum(gold) / len(gold)
        gold_spread = math.sqrt(sum((v - gold_mean) ** 2 for v in gold) / len(gold))
    if gold_spread > 0:
        if spread >= ratio * gold_spread:
            return None
        against = f" against the gold scores' std {gold_spread:.3g}"
    elif spread > 0:
        return None
    else:
        against = ""
    return (
        f"all {len(values)} predictions are close to {mean:.4g} (std {spread:.3g}{against}): the model has "
        "collapsed to a constant (usual causes: learning rate too high, too few training steps, or unscaled "
        "targets)"
    )


# --- per class and multi-label ------------------------------------------------------------------------------

MULTI_LABEL_METRICS = ("micro_f1", "micro_precision", "micro_recall", "macro_f1", "subset_accuracy")
# Candidate thresholds of `tune_thresholds`: a fixed grid, so tuning is deterministic and does not overfit
# to the exact scores of a small dev set.
THRESHOLD_GRID = tuple(round(0.01 * i, 2) for i in range(1, 100))


def per_class_scores(predictions: Sequence[Hashable], labels: Sequence[Hashable],
                     names: Sequence[Hashable]) -> dict[str, dict[str, float]]:
    """Precision, recall, F1 and support of every class in `names` (one-vs-rest), for evaluation reports:
    the per-class recall is what shows a model that ignores a rare class behind a good accuracy."""
    predictions, labels = _paired(predictions, labels)
    scores = {}
    for name in names:
        precision, recall, f1 = _class_scores(predictions, labels, name)
        scores[str(name)] = {"precision": precision, "recall": recall, "f1": f1,
                             "support": sum(y == name for y in labels)}
    return scores


def _binary_counts(predicted, gold):
    """True positives, predicted positives and gold positives per label: three [C] arrays."""
    predicted, gold = np.asarray(predicted, dtype=bool), np.asarray(gold, dtype=bool)
    return (predicted & gold).sum(0), predicted.sum(0), gold.sum(0)


def multi_label_metrics(predicted: Sequence[Sequence[bool]], gold: Sequence[Sequence[bool]],
                        names: Sequence[str]) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Metrics of multi-label decisions [N][C] (True = label assigned) against gold [N][C].

    Returns:
        ({micro_f1, micro_precision, micro_recall, macro_f1, subset_accuracy}, {label: {precision, recall,
        f1, support}}). Micro pools every (example, label) decision; macro averages the per-label F1 over
        all labels (a label with no gold and no predicted positive scores 0, as scikit-learn's zero_division=0).
    """
    predicted, gold = _paired(predicted, gold)
    true_pos, pred_pos, gold_pos = _binary_counts(predicted, gold)
    per_label = {}
    for i, name in enumerate(names):
        precision, recall = _ratio(true_pos[i], pred_pos[i]), _ratio(true_pos[i], gold_pos[i])
        per_label[str(name)] = {"precision": float(precision), "recall": float(recall),
                                "f1": float(_f1_from(precision, recall)), "support": int(gold_pos[i])}
    micro_p, micro_r = _ratio(true_pos.sum(), pred_pos.sum()), _ratio(true_pos.sum(), gold_pos.sum())
    exact = sum(list(map(bool, p)) == list(map(bool, g)) for p, g in zip(predicted, gold))
    metrics = {"micro_f1": float(_f1_from(micro_p, micro_r)), "micro_precision": float(micro_p),
               "micro_recall": float(micro_r),
               "macro_f1": sum(s["f1"] for s in per_label.values()) / max(len(per_label), 1),
               "subset_accuracy": exact / len(gold)}
    return metrics, per_label


def tune_thresholds(scores: Sequence[Sequence[float]], gold: Sequence[Sequence[bool]],
                    per_label: bool = False) -> list[float]:
    """Decision thresholds for multi-label scores [N][C] (probabilities) that maximise F1 on (dev) data.

    Global (`per_label` False): one threshold, the grid value with the best micro F1; per label: each label's
    own best F1. Ties go to the value closest to 0.5, so a flat optimum keeps the usual default.

    Returns:
        [threshold] (global) or one per label.
    """
    scores, gold = _paired(scores, gold)
    scores, gold = np.asarray(scores, dtype=np.float64), np.asarray(gold, dtype=bool)
    grid = np.asarray(THRESHOLD_GRID)
    decided = scores[None, :, :] >= grid[:, None, None]  # [G, N, C]
    true_pos = (decided & gold[None]).sum(1)  # [G, C]
    pred_pos = decided.sum(1)
    gold_pos = gold.sum(0)[None, :]
    if per_label:
        f1 = np.where(pred_pos + gold_pos > 0, 2 * true_pos / np.maximum(pred_pos + gold_pos, 1), 0.0)  # [G, C]
    else:
        tp, pp, gp = true_pos.sum(1), pred_pos.sum(1), gold_pos.sum()
        f1 = np.where(pp + gp > 0, 2 * tp / np.maximum(pp + gp, 1), 0.0)[:, None]  # [G, 1]
    # Highest F1 first, then nearest to 0.5: lexsort's last key is the primary one.
    closeness = np.abs(grid - 0.5)
    best = [int(np.lexsort((closeness, -f1[:, c]))[0]) for c in range(f1.shape[1])]
    return [float(grid[b]) for b in best]
