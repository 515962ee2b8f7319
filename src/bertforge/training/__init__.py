"""The one training loop and what it needs: config, optimizers, DDP, checkpoints, logging (row 4).

`bertforge.training.pretraining` (the pretraining entry point) is imported on its own, as it pulls in the
data pipeline.
"""

from bertforge.training.checkpoint import find_latest, load_training_state, save_checkpoint
from bertforge.training.config import TrainingConfig
from bertforge.training.loop import NonFiniteLossError, TrainResult, train
from bertforge.training.optim import Lamb, build_optimizer, parameter_groups
from bertforge.training.schedules import build_scheduler

__all__ = [
    "Lamb",
    "NonFiniteLossError",
    "TrainResult",
    "TrainingConfig",
    "build_optimizer",
    "build_scheduler",
    "find_latest",
    "load_training_state",
    "parameter_groups",
    "save_checkpoint",
    "train",
]
