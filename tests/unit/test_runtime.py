"""Device, precision, seeding and RNG capture."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch

from bertforge.errors import ConfigError
from bertforge.runtime import (
    autocast,
    capture_rng_state,
    precision_dtype,
    resolve_device,
    resolve_precision,
    restore_rng_state,
    set_seed,
)


def draws():
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_resolve_device_auto_and_explicit():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device(None).type == expected
    assert resolve_device("cpu") == torch.device("cpu")


def test_resolve_device_rejects_unknown_name():
    with pytest.raises(ConfigError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown when CUDA is absent")
def test_resolve_device_cuda_without_cuda_is_clear():
    with pytest.raises(ConfigError, match="CUDA is not available"):
        resolve_device("cuda")


def test_resolve_precision_auto_on_cpu_is_fp32():
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert resolve_precision("bf16", torch.device("cpu")) == "bf16"
    with pytest.raises(ConfigError, match="unknown precision"):
        resolve_precision("fp8", torch.device("cpu"))


def test_precision_dtype_maps_names():
    assert precision_dtype("fp32") is torch.float32
    assert precision_dtype("bf16") is torch.bfloat16
    assert precision_dtype("fp16") is torch.float16


def test_autocast_bf16_runs_matmuls_in_bf16_and_fp32_is_a_no_op():
    a = torch.randn(4, 4)
    with autocast(torch.device("cpu"), "bf16"):
        assert (a @ a).dtype is torch.bfloat16
    with autocast(torch.device("cpu"), "fp32"):
        assert (a @ a).dtype is torch.float32


def test_set_seed_repeats_every_generator():
    set_seed(7)
    first = draws()
    set_seed(7)
    assert draws() == first
    set_seed(8)
    assert draws() != first


def test_rng_state_round_trips_through_weights_only_save():
    set_seed(3)
    state = capture_rng_state()
    expected = draws()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    draws()
    restore_rng_state(torch.load(buffer, weights_only=True))
    assert draws() == expected
