"""Evaluation metrics on plain Python values: classification/regression, SQuAD-style QA, and NER entities.

Row 0 of the layering: nothing here imports torch or any other bertforge component besides `errors`.
Task evaluation decodes model outputs to labels, answer strings or tag sequences and hands them here.
"""

from bertforge.metrics.classification import (
    accuracy,
    compute_classification_metrics,
    matthews_corrcoef,
    pearson,
    precision_recall_f1,
    prediction_collapse,
    spearman,
)
from bertforge.metrics.question_answering import (
    evaluate_squad,
    normalize_answer,
    score_answer,
    squad_gold_answers,
)
from bertforge.metrics.tagging import (
    Entity,
    TagProblem,
    bio_to_iobes,
    check_bio,
    check_tags,
    entity_scores,
    get_entities,
    iobes_to_bio,
)

# Metrics where a smaller value is better (a run's best checkpoint minimises them).
LOWER_IS_BETTER = frozenset({"mse", "invalid_span_share"})

__all__ = [
    "LOWER_IS_BETTER",
    "Entity",
    "TagProblem",
    "accuracy",
    "bio_to_iobes",
    "check_bio",
    "check_tags",
    "compute_classification_metrics",
    "entity_scores",
    "evaluate_squad",
    "get_entities",
    "iobes_to_bio",
    "matthews_corrcoef",
    "normalize_answer",
    "pearson",
    "precision_recall_f1",
    "prediction_collapse",
    "score_answer",
    "spearman",
    "squad_gold_answers",
]
