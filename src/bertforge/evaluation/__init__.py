"""The evaluation layer (row 4): `runner` runs features through a model and a family's decoder and scorer
(the one path from features to answers); `saved_model` scores a saved model directory on a data file."""

from bertforge.evaluation.runner import EvalResult, Evaluation, example_id, run_features

__all__ = ["EvalResult", "Evaluation", "example_id", "run_features"]
