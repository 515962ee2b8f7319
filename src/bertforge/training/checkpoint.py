"""Training checkpoints: a model directory plus the state needed to continue the run exactly.

`out_dir/checkpoint-000100/` is a complete model artifact (config.json, model.safetensors, the tokenizer
when given), so `from_pretrained` loads it directly, plus `training_state.pt`: optimizer, scheduler and
loss-scaler state, the step, every rank's RNG states and data position (the batch source's `state_dict()`,
so a resume continues from the next unseen batch in O(1) instead of replaying the stream). The directory is
built aside and renamed into place in one step (`storage.atomic_directory`), so a crash or a full disk never
leaves a half-written checkpoint and never touches the older ones; its `checksums.json` holds the sha256 of
the weights and of the training state, verified when they are read. Only the last `keep_last` are kept; a
pruned one is renamed aside before it is deleted, so no half-deleted checkpoint is ever visible.
`tidy_run_directory` removes what crashed saves left behind (the run calls it at every start).

The loop's recipes add to the state (each key is optional, so older checkpoints still resume): `best`
carries `stale`, the evaluations since the last improvement by more than `min_delta` (early stopping);
`stopped_early` says the run ended there; with EMA of the weights the directory's model weights are the
average and `ema` holds {"decay", "shadow", "raw"}: the float32 shadow and the raw training weights by
parameter name.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError

from bertforge.checkpoint_format import replace_directory, write_model_files
from bertforge.checkpoint_integrity import brief
from bertforge.constants import TRAINING_STATE_NAME
from bertforge.errors import CheckpointError
from bertforge.storage import record_checksums, remove_directory, remove_stale_temporaries, verify_checksum

log = logging.getLogger(__name__)

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
STATE_FORMAT_VERSION = 1


def checkpoint_path(out_dir: str | os.PathLike, step: int) -> Path:
    return Path(out_dir) / f"checkpoint-{step:06d}"


def list_checkpoints(out_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints in `out_dir` as (step, path), oldest first."""
    folder = Path(out_dir)
    if not folder.is_dir():
        return []
    found = []
    for entry in folder.iterdir():
        match = CHECKPOINT_PATTERN.match(entry.name)
        if match and entry.is_dir() and (entry / TRAINING_STATE_NAME).is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def find_latest(out_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint in `out_dir`, or None when there is none (`--resume auto`)."""
    found = list_checkpoints(out_dir)
    return found[-1][1] if found else None


def checkpoint_step(path: str | os.PathLike) -> int:
    """The optimizer step checkpoint `path` was written after: from its name, else from its training state."""
    match = CHECKPOINT_PATTERN.match(Path(path).name)
    return int(match.group(1)) if match else int(load_training_state(path)["step"])


def resolve_resume(resume: str, out_dir: str | os.PathLike) -> Path | None:
    """The checkpoint a run with `resume` (`auto`, `never` or a directory) continues from, or None."""
    if resume == "never":
        return None
    if resume == "auto":
        return find_latest(out_dir)
    path = Path(resume)
    if not (path / TRAINING_STATE_NAME).is_file():
        hint = ""
        if path.is_dir() and list_checkpoints(path):
            hint = f"; it is a run directory — pass {find_latest(path)} or --training.resume=auto"
        raise CheckpointError(f"{path}: not a training checkpoint (no {TRAINING_STATE_NAME}){hint}")
    return path


def plain(value: Any) -> Any:
    """NumPy scalars/arrays -> Python numbers/lists, recursively: the state must load with weights_only."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def save_checkpoint(out_dir: str | os.PathLike, step: int, model, state: dict[str, Any], *, tokenizer=None,
                    keep_last: int = 0) -> Path:
    """Write `checkpoint-<step>/` (model artifact + `training_state.pt`) atomically; prune old ones.

    Args:
        out_dir: the run directory.
        step: optimizer steps completed.
        model: the unwrapped model (a BertPretrainedModel).
        state: training state (optimizer, scheduler, scaler, rng, data, ...); stored with `step`.
        tokenizer: saved into the directory when given, so the checkpoint is self-contained.
        keep_last: keep this many newest checkpoints (0 = all); the one just written is always kept.

    Raises:
        CheckpointError: the disk is full or not writable; the previous checkpoints are left intact.
    """
    path = checkpoint_path(out_dir, step)
    payload = plain({**state, "step": step, "format_version": STATE_FORMAT_VERSION})

    def build(tmp: Path) -> None:
        # The model directory's files, then the state beside them; replace_directory renames the whole
        # directory into place.
        write_model_files(model, tmp, tokenizer)
        torch.save(payload, tmp / TRAINING_STATE_NAME)
        record_checksums(tmp, [TRAINING_STATE_NAME])

    try:
        replace_directory(build, path)
    except CheckpointError as exc:
        raise CheckpointError(f"checkpoint at step {step} not written: {exc}") from None
    except (OSError, RuntimeError, SafetensorError) as exc:
        # torch.save reports a full disk as RuntimeError ("PytorchStreamWriter failed writing file").
        raise CheckpointError(f"{path}: could not write the checkpoint at step {step} ({exc}); free disk space "
                              "or choose another training.out_dir — earlier checkpoints are intact") from None
    prune_checkpoints(out_dir, keep_last, keep=path)
    return path


def prune_checkpoints(out_dir: str | os.PathLike, keep_last: int, keep: Path | None = None) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoints (0 keeps all) and `keep`; return the deleted paths."""
    if keep_last <= 0:
        return []
    found = list_checkpoints(out_dir)
    doomed = [path for _, path in found[:-keep_last] if path != keep]
    for path in doomed:
        remove_directory(path)
    return doomed


def tidy_run_directory(out_dir: str | os.PathLike) -> list[Path]:
    """Remove what interrupted saves left in the run directory (only bertforge's own temporary names, of
    processes that are gone: `storage.remove_stale_temporaries`), putting back a `best/` caught between the
    two renames of the fallback swap. Returns what was removed or put back."""
    return remove_stale_temporaries(out_dir) if Path(out_dir).is_dir() else []


def load_training_state(path: str | os.PathLike) -> dict[str, Any]:
    """The `training_state.pt` of checkpoint `path`, on CPU (read with weights_only: no code runs on load)."""
    file = Path(path) / TRAINING_STATE_NAME
    if not file.is_file():
        raise CheckpointError(f"{file}: missing; {path} is a model directory but not a training checkpoint")
    verify_checksum(file)
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"{file}: unreadable or corrupt ({brief(exc)}); resume from an "
                              "older checkpoint (pass its directory as --training.resume)") from None
    if not isinstance(state, dict) or state.get("format_version") != STATE_FORMAT_VERSION:
        raise CheckpointError(f"{file}: not a bertforge training state of format {STATE_FORMAT_VERSION}")
    return state


def stopped_early(path: str | os.PathLike) -> bool:
    """Whether checkpoint `path` ended its run by early stopping (`training.patience`): resuming it trains
    nothing, although its step is below the run's total."""
    return bool(load_training_state(path).get("stopped_early", False))
