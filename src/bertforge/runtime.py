"""Where and how tensors run: device choice, precision (dtype + autocast), seeding and RNG state capture.

Precision names are written here once: `PRECISIONS` (`fp32`, `bf16`, `fp16`, `int8`, and `auto`) for the commands
that run a model, `TRAINING_PRECISIONS` (without the quantized ones) for the commands that train, and each
path's default (`DEFAULT_PRECISION` for inference, `DEFAULT_TRAINING_PRECISION` for training).
`choose_precision` is the one rule that turns a requested name into a concrete one for every path (training,
`evaluate`, `predict`, the pipelines, `embed`, the server): `auto` is bf16 on a CUDA device that supports bf16
(Ampere or newer) and fp32 everywhere else, CPUs included, with no probe, so the same model on the same machine
runs at the same precision whichever command loads it. bf16 and fp16 run under autocast, so parameters,
LayerNorm, softmax and the losses stay in fp32 while the matrix products run in half precision; fp16
additionally needs a loss scaler (the training loop owns it). int8 is an inference precision on the CPU: the
encoder's linear layers are quantized (`engine.int8`, chosen by `engine.build.build_engine`) and everything else
runs in fp32, so its autocast is a no-op. How far bf16 and int8 results may move from fp32 ones is stated in
docs/cpu_inference.md. How a model is prepared to run at a precision is `bertforge.engine`'s.

`release_freed_memory` hands the heap memory this process has freed back to the operating system (a
long-running server calls it when idle).

`capture_rng_state` / `restore_rng_state` cover every generator a training step draws from (Python,
NumPy, torch CPU, all CUDA devices), in a form `torch.load(weights_only=True)` reads back, so a resumed
run draws the same dropout masks as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import random
from typing import Any

import numpy as np
import torch

from bertforge.errors import ConfigError

PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
# The dtype activations flow in between the matmuls (int8's matmuls quantize and dequantize inside).
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.float32}
# Precisions that change the model itself (applied to a loaded model), rather than running it under autocast.
QUANTIZED_PRECISIONS = ("int8",)
# The precisions a training run takes: not the quantized ones (int8 is for inference).
TRAINING_PRECISIONS = tuple(name for name in PRECISIONS if name not in QUANTIZED_PRECISIONS)
# Every inference path's default (evaluate, predict, the pipelines, embed, serve): fp32, so that by default
# predict and the server answer exactly what evaluate scored, on any machine.
DEFAULT_PRECISION = "fp32"
# A training run's default: bf16 where a GPU computes it natively, else fp32 (`choose_precision`).
DEFAULT_TRAINING_PRECISION = "auto"


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """`auto`/None -> `cuda` when available, else `cpu`; any other name (`cpu`, `cuda:1`, `mps`) as given."""
    if isinstance(name, torch.device):
        return name
    if name is None or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:<index>") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} was requested but CUDA is not available; use device=cpu or auto")
    return device


def choose_precision(precision: str, device: torch.device | str) -> tuple[str, str]:
    """(concrete precision, why) for a requested precision on `device`: the one rule of every path.

    `auto` -> bf16 on a CUDA device with bf16 support, else fp32 (a CPU always gets fp32: bf16 there is
    emulated on most CPUs, and where it is native it would still make `predict` answer differently from an
    fp32 `evaluate` of the same model on another machine). Any other name is checked against the device.

    int8 runs on the CPU only (PyTorch's dynamic int8 kernels are CPU kernels).

    Raises:
        ConfigError: an unknown name, bf16 on a GPU without bf16, or int8 off the CPU.
    """
    device = torch.device(device)
    if precision not in PRECISIONS:
        raise ConfigError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    if precision == "auto":
        if device.type == "cuda" and cuda_supports_bf16(device):
            return "bf16", "auto: bf16 on a CUDA device with bf16 support"
        return "fp32", f"auto: fp32 (bf16 is chosen only on a CUDA device with bf16 support; this is {device.type})"
    if precision == "int8" and device.type != "cpu":
        raise ConfigError(f"precision int8 runs on the CPU only (PyTorch's dynamic int8 kernels), and this run is "
                          f"on {device.type}; use --device cpu, or bf16 / fp16 on a GPU")
    if precision == "bf16" and device.type == "cuda" and not cuda_supports_bf16(device):
        raise ConfigError("precision bf16 needs a GPU with bfloat16 support (Ampere or newer); use fp16 or fp32")
    return precision, "requested"


def cuda_supports_bf16(device: torch.device | str) -> bool:
    """Whether CUDA `device` computes in bfloat16 natively, probed once per device index: the probe costs
    seconds on first use and every path asks it (a profiled `pretrain` called it 61 times)."""
    device = torch.device(device)
    return _bf16_probe(device.index or 0)


@functools.cache
def _bf16_probe(index: int) -> bool:
    # The index keys the cache only: a machine's GPUs are one kind, and asking about another device would
    # initialise a CUDA context on it.
    return bool(torch.cuda.is_bf16_supported())


def check_user_precision(precision: str, device: torch.device | str, where: str) -> None:
    """Refuse, before any work, a precision a user asked for that the device cannot honour: fp16 off a CUDA
    GPU (its loss scaling and fast kernels are CUDA's; on a CPU it would only be slower and less exact).
    `where` names the setting ("--precision", "finetune.training.precision")."""
    if precision == "fp16" and torch.device(device).type != "cuda":
        raise ConfigError(f"{where} fp16 needs a CUDA GPU, and this run is on {torch.device(device).type}; use fp32 "
                          "(the default) or bf16 there")


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """The concrete precision `choose_precision` picks (without the reason)."""
    return choose_precision(precision, device)[0]


def precision_dtype(precision: str) -> torch.dtype:
    """The compute dtype of a concrete precision name (`fp32`, `bf16`, `fp16`; `int8`: fp32 between its
    quantized matmuls)."""
    if precision not in DTYPES:
        raise ConfigError(f"unknown precision {precision!r}; use one of {tuple(DTYPES)}")
    return DTYPES[precision]


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """A context in which forward passes run at `precision` (a no-op context for fp32, and for int8, whose
    model is quantized instead: `engine.int8`). Entered by the training loop and by `engine.Engine.running`."""
    if precision in ("fp32", *QUANTIZED_PRECISIONS):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=precision_dtype(precision))


def set_seed(seed: int, deterministic: bool = False) -> None:
    """Seed Python, NumPy and torch (CPU and every CUDA device).

    `deterministic=True` also makes cuDNN/cuBLAS pick deterministic kernels (slower; bitwise-repeatable GPU
    runs). Data-loader workers derive their seeds from torch's, so they are covered too.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        # cuBLAS reads this when its handle is created; it must be set before the first matmul on the GPU.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def capture_rng_state() -> dict[str, Any]:
    """Every generator's state, made of tensors, ints and tuples only (safe for weights_only loading)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        # NumPy's key is a uint32 array; stored as int64 so no NumPy type ends up in the pickle.
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back what `capture_rng_state` returned."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; absent from musl, macOS and Windows C libraries
    except (AttributeError, OSError):
        return None


def release_freed_memory() -> bool:
    """Return the heap memory this process has freed to the operating system (glibc's `malloc_trim(0)`);
    False where the C library has no such call.

    Why: glibc keeps freed blocks for reuse, so a server's resident memory stays at its busiest moment. A
    CPU server that met many batch shapes measured 1,013 MiB resident with int8, 688 MiB after one call
    (15 ms; fp32 577 -> 433, bf16 1,151 -> 907; docs/serving.md, "Memory").
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
