"""Tests for bertforge.metrics.classification against hand-computed values (and scipy/sklearn when present)."""

from __future__ import annotations

import math
import random

import pytest

from bertforge.errors import ConfigError, InputError
from bertforge.metrics.classification import (
    accuracy,
    average_ranks,
    compute_classification_metrics,
    matthews_corrcoef,
    mean_squared_error,
    pearson,
    precision_recall_f1,
    prediction_collapse,
    regression_collapse,
    spearman,
)

TOLERANCE = 1e-12

# TP = 2 (positions 0, 3), FP = 1 (1), FN = 1 (4), TN = 2 (2, 5).
BINARY_PREDICTIONS = [1, 1, 0, 1, 0, 0]
BINARY_LABELS = [1, 0, 0, 1, 1, 0]


def test_accuracy_counts_matches():
    assert accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    assert accuracy(["a", "b"], ["a", "b"]) == 1.0


def test_precision_recall_f1_binary_hand_computed():
    precision, recall, f1 = precision_recall_f1(BINARY_PREDICTIONS, BINARY_LABELS)
    assert precision == pytest.approx(2 / 3, abs=TOLERANCE)
    assert recall == pytest.approx(2 / 3, abs=TOLERANCE)
    assert f1 == pytest.approx(2 / 3, abs=TOLERANCE)


def test_precision_recall_f1_binary_positive_label_is_respected():
    # Scoring class 0 instead: TP = 2 (2, 5), FP = 1 (4), FN = 1 (1).
    precision, recall, f1 = precision_recall_f1(BINARY_PREDICTIONS, BINARY_LABELS, positive_label=0)
    assert (precision, recall) == (pytest.approx(2 / 3), pytest.approx(2 / 3))
    # Never predicting the positive class: precision and F1 are 0, not NaN.
    assert precision_recall_f1([0, 0], [1, 0]) == (0.0, 0.0, 0.0)


def test_precision_recall_f1_macro_hand_computed():
    predictions = [0, 1, 2, 2, 1, 0]
    labels = [0, 1, 1, 2, 2, 2]
    # class 0: P 1/2 R 1/1 F 2/3; class 1: P 1/2 R 1/2 F 1/2; class 2: P 1/2 R 1/3 F 2/5.
    precision, recall, f1 = precision_recall_f1(predictions, labels, average="macro")
    assert precision == pytest.approx(1 / 2, abs=TOLERANCE)
    assert recall == pytest.approx((1 + 1 / 2 + 1 / 3) / 3, abs=TOLERANCE)
    assert f1 == pytest.approx((2 / 3 + 1 / 2 + 2 / 5) / 3, abs=TOLERANCE)


def test_precision_recall_f1_rejects_unknown_average():
    with pytest.raises(ConfigError, match="average"):
        precision_recall_f1([1], [1], average="weighted")


def test_matthews_corrcoef_binary_hand_computed():
    # (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (4 - 1) / sqrt(3*3*3*3) = 1/3.
    assert matthews_corrcoef(BINARY_PREDICTIONS, BINARY_LABELS) == pytest.approx(1 / 3, abs=TOLERANCE)


def test_matthews_corrcoef_multiclass_hand_computed():
    # s = 4, c = 2, sum p_k t_k = 2*1 + 1*2 + 1*1 = 5: (2*4 - 5) / sqrt((16 - 6) * (16 - 6)) = 0.3.
    assert matthews_corrcoef([0, 1, 2, 0], [0, 1, 1, 2]) == pytest.approx(0.3, abs=TOLERANCE)


def test_matthews_corrcoef_extremes():
    assert matthews_corrcoef([0, 1, 1, 0], [0, 1, 1, 0]) == pytest.approx(1.0)
    assert matthews_corrcoef([1, 0, 0, 1], [0, 1, 1, 0]) == pytest.approx(-1.0)
    # A collapsed model (one predicted class) has no correlation: 0, not NaN.
    assert matthews_corrcoef([1, 1, 1, 1], [0, 1, 1, 0]) == 0.0


def test_pearson_hand_computed():
    # dx = (-1, 0, 1), dy = (-4/3, -1/3, 5/3): r = 3 / (sqrt(2) * sqrt(42/9)) = 9 / sqrt(84).
    assert pearson([1, 2, 3], [1, 2, 4]) == pytest.approx(9 / math.sqrt(84), abs=TOLERANCE)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert pearson([2, 2, 2], [1, 2, 3]) == 0.0


def test_average_ranks_share_the_mean_rank_for_ties():
    assert average_ranks([10, 20, 20, 30]) == [1.0, 2.5, 2.5, 4.0]
    assert average_ranks([3, 1, 3, 3]) == [3.0, 1.0, 3.0, 3.0]


def test_spearman_with_ties_hand_computed():
    # ranks x = (1, 2.5, 2.5, 4), y = (1, 3, 2, 4): r = 4.5 / sqrt(4.5 * 5).
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(22.5), abs=TOLERANCE)
    # Monotone but not linear: Spearman is exactly 1, Pearson is not.
    assert spearman([1, 2, 3, 4], [1, 4, 9, 100]) == pytest.approx(1.0)


def test_correlations_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(0)
    for _ in range(20):
        n = rng.randint(3, 60)
        # Small integer ranges force many ties.
        xs = [rng.randint(0, 5) for _ in range(n)]
        ys = [rng.randint(0, 5) + rng.random() * (rng.random() < 0.5) for _ in range(n)]
        if len(set(xs)) < 2 or len(set(ys)) < 2:
            continue
        assert spearman(xs, ys) == pytest.approx(stats.spearmanr(xs, ys).statistic, abs=1e-9)
        assert pearson(xs, ys) == pytest.approx(stats.pearsonr(xs, ys).statistic, abs=1e-9)


def test_classification_scores_match_sklearn():
    sk_metrics = pytest.importorskip("sklearn.metrics")
    rng = random.Random(1)
    for num_classes in (2, 3, 5):
        labels = [rng.randrange(num_classes) for _ in range(200)]
        predictions = [y if rng.random() < 0.6 else rng.randrange(num_classes) for y in labels]
        assert matthews_corrcoef(predictions, labels) == pytest.approx(
            sk_metrics.matthews_corrcoef(labels, predictions), abs=1e-9)
        macro = precision_recall_f1(predictions, labels, average="macro")
        assert macro == pytest.approx(
            sk_metrics.precision_recall_fscore_support(labels, predictions, average="macro")[:3], abs=1e-9)
        binary = precision_recall_f1(predictions, labels, positive_label=1)
        assert binary[2] == pytest.approx(
            sk_metrics.f1_score(labels, predictions, labels=[1], average="macro"), abs=1e-9)


def test_mean_squared_error_hand_computed():
    assert mean_squared_error([1.0, 2.0], [2.0, 4.0]) == pytest.approx(2.5)


def test_compute_classification_metrics_binary_defaults():
    results = compute_classification_metrics(BINARY_PREDICTIONS, BINARY_LABELS)
    assert list(results) == ["accuracy", "f1", "precision", "recall", "mcc"]
    assert results["accuracy"] == pytest.approx(4 / 6)
    assert results["f1"] == pytest.approx(2 / 3)
    assert results["mcc"] == pytest.approx(1 / 3)


def test_compute_classification_metrics_multiclass_defaults():
    results = compute_classification_metrics([0, 1, 2, 0], [0, 1, 1, 2])
    assert list(results) == ["accuracy", "macro_f1", "mcc"]
    assert results["mcc"] == pytest.approx(0.3)


def test_compute_classification_metrics_named_and_regression():
    results = compute_classification_metrics([0, 1, 2, 0], [0, 1, 1, 2], metric_names=["mcc", "accuracy"])
    assert list(results) == ["mcc", "accuracy"]
    regression = compute_classification_metrics([1, 2, 2, 3], [1, 3, 2, 4], kind="regression")
    assert list(regression) == ["pearson", "spearman"]
    assert regression["spearman"] == pytest.approx(4.5 / math.sqrt(22.5))


def test_compute_classification_metrics_rejects_bad_names_and_inputs():
    with pytest.raises(ConfigError, match="pearson"):
        compute_classification_metrics([1], [1], metric_names=["pearson"])
    with pytest.raises(ConfigError, match="kind"):
        compute_classification_metrics([1], [1], kind="ranking")
    with pytest.raises(InputError, match="3 predictions for 2 labels"):
        compute_classification_metrics([1, 0, 1], [1, 0])
    with pytest.raises(InputError, match="no predictions"):
        accuracy([], [])


def test_metrics_accept_numpy_arrays():
    np = pytest.importorskip("numpy")
    results = compute_classification_metrics(np.array(BINARY_PREDICTIONS), np.array(BINARY_LABELS))
    assert results["mcc"] == pytest.approx(1 / 3)
    assert spearman(np.array([1.0, 2.0, 2.0, 3.0]), np.array([1, 3, 2, 4])) == pytest.approx(
        4.5 / math.sqrt(22.5))


def test_prediction_collapse_warns_only_for_one_class():
    message = prediction_collapse([1, 1, 1])
    assert message is not None and "all 3 predictions are class 1" in message
    assert prediction_collapse([1, 0, 1]) is None
    assert prediction_collapse([1]) is None
    assert prediction_collapse([]) is None


def test_prediction_collapse_warns_for_a_near_collapse_against_balanced_labels():
    # ChnSentiCorp's case: nearly every prediction one class, balanced labels, one other prediction present.
    predictions = [1] * 95 + [0] * 5
    message = prediction_collapse(predictions, [1] * 50 + [0] * 50)
    assert message is not None and "95 of 100 predictions (95%) are class 1, which is 50% of the labels" in message
    assert "nearly collapsed to one class" in message and "MCC 0.229" in message
    assert prediction_collapse(predictions, [1] * 80 + [0] * 20) is None  # the labels lean that way too
    assert prediction_collapse([1] * 85 + [0] * 15, [0, 1] * 50) is None  # 85%: below the 90% share
    assert prediction_collapse(predictions) is None  # without labels, only a complete collapse is told
    assert prediction_collapse([1] * 8 + [0], [0, 1] * 4 + [0]) is None  # too few examples to tell
    assert "all 4 predictions are class 1" in prediction_collapse([1] * 4, [0, 1, 0, 1])


def test_regression_collapse_warns_for_a_constant_prediction():
    rng = random.Random(0)
    gold = [rng.uniform(0, 5) for _ in range(200)]  # STS-B-like scores, std about 1.4
    collapsed = [2.5 + rng.gauss(0, 0.005) for _ in gold]
    message = regression_collapse(collapsed, gold)
    assert message is not None and "all 200 predictions are close to 2.5" in message
    assert "collapsed to a constant" in message
    assert regression_collapse([g + rng.gauss(0, 0.5) for g in gold], gold) is None
    assert regression_collapse([1.0, 1.0, 1.0]) is not None  # no gold: only exactly equal values
    assert regression_collapse([1.0, 1.1, 0.9]) is None
    assert regression_collapse([3.0]) is None and regression_collapse([]) is None


def test_regression_collapse_reported_by_the_classification_family_score():
    from bertforge.data.classification import ClassificationExample
    from bertforge.families.classification import FAMILY
    from bertforge.model.config import BertConfig

    config = BertConfig(problem_type="regression")
    rng = random.Random(1)
    examples = [ClassificationExample(f"s{i}", None, rng.uniform(0, 5), f"dev:{i}") for i in range(50)]
    results = [{"value": 3.1 + rng.gauss(0, 0.005), "windows": 1} for _ in examples]
    metrics, _, warnings = FAMILY.score(examples, results, config)
    assert "pearson" in metrics and len(warnings) == 1 and "collapsed to a constant" in warnings[0]
    spread = [{"value": float(e.label) + rng.gauss(0, 0.3), "windows": 1} for e in examples]
    assert FAMILY.score(examples, spread, config)[2] == []



def test_near_collapse_reported_by_the_classification_family_score():
    from bertforge.data.classification import ClassificationExample
    from bertforge.families.classification import FAMILY
    from bertforge.model.config import BertConfig

    config = BertConfig(id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})
    examples = [ClassificationExample(f"s{i}", None, ("neg", "pos")[i % 2], f"dev:{i}") for i in range(40)]
    results = [{"label": "pos" if i < 38 else "neg", "windows": 1} for i in range(40)]
    warnings = FAMILY.score(examples, results, config)[2]
    assert len(warnings) == 1 and "38 of 40 predictions (95%) are class 'pos'" in warnings[0]
    healthy = [{"label": e.label, "windows": 1} for e in examples]
    assert FAMILY.score(examples, healthy, config)[2] == []


def test_metrics_do_not_import_torch():
    import subprocess
    import sys

    code = "import sys, bertforge.metrics; assert 'torch' not in sys.modules, 'metrics imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)
