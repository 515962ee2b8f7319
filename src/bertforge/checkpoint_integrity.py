"""What loading a model directory checks beyond its format: that the content can be what the directory says.

`checkpoint_format` calls these on every load: the weights hold no NaN or infinity (`check_finite`), no
floating-point parameter is stored as integers (`check_float_parameters`), a classifier's config.json names its
labels (`warn_without_labels`), a new head's label count is a positive integer (`label_count`). The checksums of the files themselves are
`storage`'s, verified before a file is read, and whether a vocabulary fits the embedding table is
`tokenization.vocab.check_fits_embeddings`. Each problem is one `CheckpointError` line naming the file and the
fix, or a warning that names the file. The module knows no model class or config type (it sits below them).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import torch

from bertforge.errors import CheckpointError, ConfigError

log = logging.getLogger("bertforge.checkpoint_format")

# Hugging Face architectures whose outputs are named by config.json's id2label.
LABELLED_HEADS = ("ForSequenceClassification", "ForTokenClassification")


def check_finite(tensors: dict[str, torch.Tensor], source: Path) -> None:
    """CheckpointError naming the first stored tensor that holds NaN or infinity: a file corrupted behind a
    valid header (or a diverged run's save) would otherwise load and answer every request with NaN."""
    for name, tensor in tensors.items():
        # (a sum is NaN or infinite when any element is, and costs one pass without a [numel] bool tensor; only a
        # non-finite sum, or one that overflowed, is checked element by element)
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor.sum())) \
                and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise CheckpointError(f"{source}: tensor {name} holds {bad} NaN or infinite values of {tensor.numel()}; "
                                  "the file is corrupt or was saved from a diverged run: re-save or re-download it")


def check_float_parameters(pairs: list[tuple[str, torch.Tensor, torch.Tensor]], source: str) -> None:
    """CheckpointError naming the stored tensors (name, stored, the model's own) whose parameter is floating
    point but whose stored dtype is an integer type: casting would load other numbers (a classifier's weights
    truncated to ints flip its labels), so the file is refused, not cast."""
    integer = [f"{name} ({stored.dtype})" for name, stored, own in pairs
               if own.is_floating_point() and not stored.is_floating_point()]
    if integer:
        raise CheckpointError(f"{source}: floating-point parameters stored with an integer dtype: "
                              f"{', '.join(integer[:4])}{' ...' if len(integer) > 4 else ''}; their values were lost "
                              "when they were written (casting them back would load other numbers): save the model "
                              "again from its float weights, or re-download it")


def label_count(num_labels: Any) -> int:
    """`num_labels` as asked of a loader (transformers' habit), refused unless a positive integer."""
    if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 1:
        raise ConfigError(f"num_labels={num_labels!r} is invalid: give the number of labels of the new head, an "
                          "integer of at least 1")
    return num_labels


def warn_without_labels(data: dict[str, Any], config: Any, file: Path) -> None:
    """Warn (once) about a classifier or tagger whose config.json (`data`, read into the BertConfig `config`)
    names no labels: its outputs would be called LABEL_0, LABEL_1, ... in every prediction."""
    if {"id2label", "label2id"} & set(data) or data.get("problem_type") == "regression":
        return
    if any(str(name).endswith(LABELLED_HEADS) for name in data.get("architectures") or []):
        warn_once(f"{file}: a classifier without label names (no id2label): its {config.num_labels} outputs are "
                  f"called {', '.join(config.label_names[:3])}...; add \"id2label\": {{\"0\": \"<label 0>\", ...}} "
                  "to config.json, listing the labels in the order the model was trained with")


@functools.cache
def warn_once(message: str) -> None:
    """Log a warning about a file once per process (a server loads a directory more than once)."""
    log.warning(message)


def brief(exc: BaseException) -> str:
    """A library's exception as one line for a one-line error (torch's unpickling errors run to ten)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
