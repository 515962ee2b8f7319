"""TrainingConfig: validation messages and the length/warmup arithmetic."""

from __future__ import annotations

import pytest

from bertforge.errors import ConfigError
from bertforge.training.config import TrainingConfig


@pytest.mark.parametrize("field, value, message", [
    ("lr", 0.0, "training.lr=0.0 is invalid: use a positive learning rate"),
    ("optimizer", "sgd", "use one of ('adamw', 'lamb')"),
    ("batch_size", 0, "training.batch_size=0 is invalid: use an integer >= 1"),
    ("grad_accumulation", 1.5, "training.grad_accumulation=1.5"),
    ("warmup_ratio", 1.0, "use a fraction in [0, 1)"),
    ("betas", [0.9], "give two numbers in [0, 1)"),
    ("precision", "half", "use one of ('auto', 'fp32', 'bf16', 'fp16')"),
    ("schedule", "cosine", "use one of ('linear', 'constant', 'wsd', 'one-cycle')"),
    ("max_grad_norm", -1.0, "or 0 to disable clipping"),
])
def test_training_config_rejects_bad_values_naming_field_and_fix(field, value, message):
    with pytest.raises(ConfigError) as info:
        TrainingConfig(**{field: value})
    assert message in str(info.value)


def test_training_config_needs_a_length():
    with pytest.raises(ConfigError, match="set steps > 0 or epochs > 0"):
        TrainingConfig(steps=0, epochs=0)


def test_training_config_defaults_follow_bert():
    config = TrainingConfig()
    assert (config.weight_decay, config.eps, config.max_grad_norm, config.optimizer) == (0.01, 1e-6, 1.0, "adamw")


def test_total_steps_prefers_steps_over_epochs():
    assert TrainingConfig(steps=7, epochs=3).total_steps(100) == 7
    assert TrainingConfig(steps=7).total_steps(None) == 7


def test_total_steps_from_epochs_counts_optimizer_steps():
    assert TrainingConfig(epochs=2, grad_accumulation=4).total_steps(10) == 5
    assert TrainingConfig(epochs=0.5).total_steps(9) == 5


def test_total_steps_from_epochs_needs_a_length():
    with pytest.raises(ConfigError, match="set training.steps instead"):
        TrainingConfig(epochs=1).total_steps(None)


def test_resolved_warmup_steps_win_over_ratio():
    assert TrainingConfig(warmup_ratio=0.1).resolved_warmup(1000) == 100
    assert TrainingConfig(warmup_steps=30, warmup_ratio=0.1).resolved_warmup(1000) == 30
    assert TrainingConfig(warmup_steps=30).resolved_warmup(10) == 10
