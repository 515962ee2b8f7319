"""The evaluation layer (row 4): `runner` runs features through a model and a family's decoder and scorer
(the one path from features to answers); `streaming` does it for inputs still to tokenize, tokenizing the next
batches while the model runs; `saved_model` scores a saved model directory on a data file."""

from bertforge.evaluation.runner import EvalResult, Evaluation, example_id, run_features
from bertforge.evaluation.streaming import run_streamed

__all__ = ["EvalResult", "Evaluation", "example_id", "run_features", "run_streamed"]
