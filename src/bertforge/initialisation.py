"""When a model's weights are initialised: at construction, unless the model is built to be loaded.

A model class initialises every tensor in its constructor (`init_weights`). A model that a loader builds only to
overwrite its tensors with a checkpoint's (`checkpoint_format.load_model`) is built inside `weights_to_come()`:
its `init_weights` then does nothing, and the loader initialises afterwards only the tensors the checkpoint
lacks (a fresh head: `init_weights(only=...)`). Why: a ModernBERT-base's truncated-normal initialisation (150
million draws by rejection) was 25 CPU seconds of a 31-second load, all of it overwritten.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_LOADING = contextvars.ContextVar("bertforge_weights_to_come", default=False)


@contextlib.contextmanager
def weights_to_come() -> Iterator[None]:
    """Models built inside skip their constructors' initialisation (a checkpoint is about to fill them)."""
    token = _LOADING.set(True)
    try:
        yield
    finally:
        _LOADING.reset(token)


def initialisation_deferred() -> bool:
    """Whether a constructor's `init_weights` should do nothing now (`weights_to_come`)."""
    return _LOADING.get()


__all__ = ["initialisation_deferred", "weights_to_come"]
