"""Model directories on disk: the generic reader and writer below every model class.

A directory holds everything needed to use a model: `config.json` (architecture, label names, task kind),
`model.safetensors`, and when a tokenizer is saved with it `vocab.txt` + `tokenizer_config.json`, plus the
fine-tuning record `finetuning.json` of a fine-tuned model. It is a valid Hugging Face BERT checkpoint:
parameter names are translated by `interop.huggingface` on the way out and on the way in, and
`pytorch_model.bin` files from elsewhere load too (with `weights_only=True`).

This module knows no model class. It is handed one (`load_model(path, cls)`) and asks the class two things:
`encoder_prefix` (where the encoder sits: "" for `BertModel`, "bert." for models with a head) and
`head_prefixes` (the parameter-name prefixes of its own heads). Which class a directory names is decided
above the models, by `bertforge.families.registry`. Loading returns the model *and* a `LoadReport` (what
started fresh, what was skipped); nothing is attached to the module.

Saving writes a temporary directory and renames it, so a crash never leaves half a model behind.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from bertforge.constants import (
    CONFIG_NAME,
    FINETUNING_NAME,
    TOKENIZER_CONFIG_NAME,
    TORCH_WEIGHTS_NAME,
    VOCAB_NAME,
    WEIGHTS_NAME,
)
from bertforge.errors import CheckpointError, ConfigError
from bertforge.interop import huggingface as hf
from bertforge.model.config import BertConfig
from bertforge.storage import read_json, write_json
from bertforge.tokenization.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# The encoder's own top-level modules; any other parameter belongs to a head.
ENCODER_MODULES = ("embeddings.", "encoder.", "pooler.")


@dataclass
class LoadReport:
    """What loading did besides copying tensors.

    source: the weights file read. fresh: parameters initialised fresh (a head or pooler the checkpoint
    lacks). skipped: stored tensors deliberately not loaded (another task's head, a pooler the model lacks).
    """

    source: str
    fresh: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def fresh_in(self, prefixes: tuple[str, ...]) -> list[str]:
        return [k for k in self.fresh if k.startswith(prefixes)]


@dataclass
class ModelDirectory:
    """A model directory read once: everything a run needs besides the weights.

    config: the architecture (and label names). architecture: our class name from config.json (None when
    it names none). tokenizer: None when the directory has no vocab.txt. finetuning: the fine-tuning record
    (`finetuning.json`: how inputs were built), None for a model that was not fine-tuned here.
    """

    path: Path
    config: BertConfig
    architecture: str | None
    tokenizer: Tokenizer | None
    finetuning: dict[str, Any] | None

    def require_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise CheckpointError(f"{self.path}: no {VOCAB_NAME}; this model directory was saved without a "
                                  f"tokenizer (copy the vocab.txt and {TOKENIZER_CONFIG_NAME} it was trained "
                                  "with into it)")
        return self.tokenizer


# --- writing ---------------------------------------------------------------------------------------------

def replace_directory(build, path: str | os.PathLike) -> Path:
    """Run `build(tmp_dir)` in a fresh sibling directory, then swap it into `path` atomically.

    An existing directory at `path` is replaced only after the new one is complete; if the swap itself
    fails, the old directory is put back.
    """
    path = Path(path)
    # A plain mkdir, not tempfile.mkdtemp: mkdtemp makes the folder private (mode 0700), and the saved
    # model would then be unreadable to anyone else (a server running as another user).
    unique = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    tmp, old = path.parent / f".{path.name}.tmp-{unique}", path.parent / f".{path.name}.old-{unique}"
    moved_away = False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        build(tmp)
        if path.exists():
            os.replace(path, old)
            moved_away = True
        os.replace(tmp, path)
    except BaseException as exc:
        if moved_away and not path.exists():
            os.replace(old, path)
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise CheckpointError(f"{path}: could not write the model directory ({exc}); check free disk "
                                  "space and permissions — nothing was changed at that path") from None
        raise
    if moved_away:
        shutil.rmtree(old, ignore_errors=True)
    return path


def hf_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights under Hugging Face names, contiguous, ready for safetensors."""
    return {hf.to_hf_key(k): v.detach().contiguous() for k, v in model.state_dict().items()}


def save_model(model: torch.nn.Module, path: str | os.PathLike, tokenizer=None,
               extra_files: dict[str, str | bytes] | None = None) -> Path:
    """Save `model` (and its tokenizer) as a Hugging Face compatible BERT directory, atomically."""

    def build(tmp: Path) -> None:
        write_json(tmp / CONFIG_NAME, hf.config_to_hf(model.config.to_dict(), type(model).__name__), sort_keys=True)
        save_file(hf_state_dict(model), str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for name, content in (extra_files or {}).items():
            mode = "wb" if isinstance(content, bytes) else "w"
            with open(tmp / name, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as handle:
                handle.write(content)

    return replace_directory(build, path)


# --- reading ---------------------------------------------------------------------------------------------

def read_json_object(file: Path, what: str) -> dict[str, Any]:
    try:
        data = read_json(file, what=what)
    except FileNotFoundError:
        raise CheckpointError(f"{file}: missing; a model directory needs {file.name}") from None
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: expected a JSON object")
    return data


def read_config(path: str | os.PathLike) -> tuple[BertConfig, str | None]:
    """(config, our architecture name or None) from a model directory's config.json."""
    if not Path(path).is_dir():
        raise CheckpointError(f"{path}: not a model directory; pass a folder holding config.json and weights "
                              "(or a preset name where a command accepts one)")
    file = Path(path) / CONFIG_NAME
    fields, architecture = hf.config_from_hf(read_json_object(file, "config.json"), str(file))
    return BertConfig.from_dict(fields, source=str(file)), architecture


def read_directory(path: str | os.PathLike) -> ModelDirectory:
    """Config, architecture, tokenizer and fine-tuning record of a model directory, each read once."""
    config, architecture = read_config(path)
    folder = Path(path)
    tokenizer = Tokenizer.from_pretrained(folder) if (folder / VOCAB_NAME).exists() else None
    record_file = folder / FINETUNING_NAME
    record = read_json_object(record_file, FINETUNING_NAME) if record_file.exists() else None
    return ModelDirectory(folder, config, architecture, tokenizer, record)


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """The tokenizer saved in a model directory (clear error when the directory has none)."""
    folder = Path(path)
    if not (folder / VOCAB_NAME).exists():
        raise CheckpointError(f"{folder}: no {VOCAB_NAME}; this model directory was saved without a tokenizer "
                              f"(copy the vocab.txt and {TOKENIZER_CONFIG_NAME} it was trained with into it)")
    return Tokenizer.from_pretrained(folder)


def weights_file(path: str | os.PathLike) -> Path:
    """The weights file of a model directory: `model.safetensors`, its shard index, or `pytorch_model.bin`."""
    folder = Path(path)
    for candidate in (folder / WEIGHTS_NAME, folder / (WEIGHTS_NAME + ".index.json"), folder / TORCH_WEIGHTS_NAME):
        if candidate.exists():
            return candidate
    raise CheckpointError(f"{folder}: no weights found; expected {WEIGHTS_NAME} or {TORCH_WEIGHTS_NAME}")


def read_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Tensors of a model directory under their stored names (safetensors, sharded or not, or torch .bin)."""
    file = reading = weights_file(path)
    try:
        if file.name == WEIGHTS_NAME:
            return load_file(str(file))
        if file.name == TORCH_WEIGHTS_NAME:
            # weights_only: a .bin is a pickle, and a pickle from elsewhere must not run code on load.
            return torch.load(file, map_location="cpu", weights_only=True)
        shards = sorted(set(read_json_object(file, "shard index")["weight_map"].values()))
        tensors: dict[str, torch.Tensor] = {}
        for shard in shards:
            reading = file.parent / shard
            tensors.update(load_file(str(reading)))
        return tensors
    except (SafetensorError, OSError, RuntimeError, KeyError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"{reading}: weights are unreadable or corrupt ({type(exc).__name__}: {exc}); "
                              "re-save or re-download the checkpoint") from None


def is_encoder_key(name: str) -> bool:
    """Whether a (our-named) parameter belongs to the encoder rather than to a head."""
    return name.removeprefix("bert.").startswith(ENCODER_MODULES)


def translate_weights(tensors: dict[str, torch.Tensor], model: torch.nn.Module, expected: set[str],
                      source: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Map stored names onto `model`'s: (our state dict, stored keys we deliberately skipped)."""
    prefix = type(model).encoder_prefix
    own_heads = type(model).head_prefixes
    has_pooler = any(k.removeprefix(prefix).startswith("pooler.") for k in expected)
    ours: dict[str, torch.Tensor] = {}
    skipped: list[str] = []
    unknown: list[str] = []
    for key, value in tensors.items():
        if hf.is_redundant_hf_key(key):
            continue
        name = hf.from_hf_key(key)
        if name is None:
            unknown.append(key)
            continue
        if not is_encoder_key(name):
            if not name.startswith(own_heads):
                skipped.append(key)  # another task's head: fine-tuning starts from this checkpoint's encoder
                continue
            ours[name] = value
            continue
        name = prefix + name.removeprefix("bert.")
        if not has_pooler and name.removeprefix(prefix).startswith("pooler."):
            skipped.append(key)  # token-level models have no pooler; a pretrained checkpoint has one
            continue
        ours[name] = value
    if unknown:
        raise CheckpointError(f"{source}: unexpected tensors {unknown[:8]}{' ...' if len(unknown) > 8 else ''} "
                              "that a BERT checkpoint does not have; is this a BERT model?")
    return ours, skipped


def load_model(path: str | os.PathLike, cls: type, *, config_overrides: dict[str, Any] | None = None,
               device: str | torch.device | None = None, dtype: torch.dtype | None = None,
               fresh_head: bool = False) -> tuple[Any, LoadReport]:
    """Load a model directory into `cls`, in eval mode: (model, what loading did).

    A head that the checkpoint lacks entirely starts freshly initialised (e.g. a classifier on top of a
    pretrained encoder) and is listed in the report's `fresh`; `fresh_head=True` also discards a stored head
    of another shape (new labels). Missing encoder tensors or wrong shapes are errors.
    """
    config, _ = read_config(path)
    if config_overrides:
        if "id2label" in config_overrides and "label2id" not in config_overrides:
            config_overrides = {**config_overrides, "label2id": None}
        try:
            config = config.replace(**config_overrides)
        except TypeError as exc:
            raise ConfigError(f"bad config override: {exc}") from None
    model = cls(config)
    heads = cls.head_prefixes
    source = str(weights_file(path))
    expected = model.state_dict()
    ours, skipped = translate_weights(read_weights(path), model, set(expected), source)
    if fresh_head:
        ours = {k: v for k, v in ours.items() if not k.startswith(heads)}
    mismatched = [f"{hf.to_hf_key(k)}: stored {tuple(v.shape)}, model {tuple(expected[k].shape)}"
                  for k, v in ours.items() if k in expected and v.shape != expected[k].shape]
    if mismatched:
        head_shapes = any(not is_encoder_key(m.split(":")[0]) for m in mismatched)
        hint = ("; the head has a different number of labels — pass fresh_head=True (CLI: --fresh-head) to "
                "start a new head" if head_shapes else "; config.json does not match the weights")
        raise CheckpointError(f"{source}: mis-shaped tensors {mismatched[:4]}{hint}")
    unexpected = sorted(set(ours) - set(expected))
    if unexpected:
        raise CheckpointError(f"{source}: tensors {unexpected[:8]} do not belong to {cls.__name__}; load it "
                              "with the class its config.json names (bertforge.families.registry.load_model)")
    missing = sorted(set(expected) - set(ours))
    stored_heads = {k.split(".")[0] for k in ours if k.startswith(heads)}
    fresh = [k for k in missing if (k.startswith(heads) and k.split(".")[0] not in stored_heads)
             or k.removeprefix(cls.encoder_prefix).startswith("pooler.")]
    hard_missing = [hf.to_hf_key(k) for k in missing if k not in fresh]
    if hard_missing:
        raise CheckpointError(f"{source}: missing tensors {hard_missing[:8]}{' ...' if len(hard_missing) > 8 else ''}"
                              "; the checkpoint is incomplete or its config.json describes a different model")
    model.load_state_dict(ours, strict=False)
    model.tie_weights()
    if fresh:
        log.info("%s: initialised fresh (not in the checkpoint): %s", source, ", ".join(fresh))
    if dtype is not None or device is not None:
        model.to(device=device, dtype=dtype)
    return model.eval(), LoadReport(source, fresh, skipped)
