"""Checkpoints: loadable model directories + training state, atomic writes, pruning, resume lookup."""

from __future__ import annotations

import errno

import numpy as np
import pytest
import torch

from bertforge.constants import CONFIG_NAME, TRAINING_STATE_NAME, WEIGHTS_NAME
from bertforge.errors import CheckpointError
from bertforge.families.pretraining import BertForPretraining
from bertforge.model.config import BertConfig
from bertforge.training.checkpoint import (
    checkpoint_step,
    find_latest,
    list_checkpoints,
    load_training_state,
    plain,
    resolve_resume,
    save_checkpoint,
)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return BertForPretraining(BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, intermediate_size=20, max_position_embeddings=16))


def test_save_checkpoint_writes_a_loadable_model_and_state(tmp_path, model):
    path = save_checkpoint(tmp_path, 100, model, {"optimizer": {"x": torch.ones(2)}, "data": [{"epoch": 1}]})
    assert path.name == "checkpoint-000100"
    assert {p.name for p in path.iterdir()} >= {CONFIG_NAME, WEIGHTS_NAME, TRAINING_STATE_NAME}
    loaded = BertForPretraining.from_pretrained(path)
    for a, b in zip(loaded.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)
    state = load_training_state(path)
    assert state["step"] == 100 and state["data"] == [{"epoch": 1}]
    assert torch.equal(state["optimizer"]["x"], torch.ones(2))


def test_save_checkpoint_keeps_last_k_and_find_latest(tmp_path, model):
    for step in (1, 2, 3, 10):
        save_checkpoint(tmp_path, step, model, {}, keep_last=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 10]
    assert find_latest(tmp_path).name == "checkpoint-000010"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_find_latest_ignores_incomplete_and_foreign_dirs(tmp_path, model):
    save_checkpoint(tmp_path, 5, model, {})
    (tmp_path / "checkpoint-000009").mkdir()  # no training state: not a checkpoint
    (tmp_path / "checkpoint-best").mkdir()
    assert find_latest(tmp_path).name == "checkpoint-000005"
    assert find_latest(tmp_path / "absent") is None


def test_save_checkpoint_full_disk_is_clear_and_keeps_older(tmp_path, model, monkeypatch):
    save_checkpoint(tmp_path, 1, model, {"marker": 1})

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(CheckpointError, match="step 2.*No space left on device.*free disk space") as info:
        save_checkpoint(tmp_path, 2, model, {"marker": 2}, keep_last=1)
    assert "Traceback" not in str(info.value)
    monkeypatch.undo()
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]
    assert load_training_state(tmp_path / "checkpoint-000001")["marker"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-000001"]


def test_save_checkpoint_torch_runtime_write_error_is_checkpoint_error(tmp_path, model, monkeypatch):
    def writer_failed(*args, **kwargs):
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")

    monkeypatch.setattr(torch, "save", writer_failed)
    with pytest.raises(CheckpointError, match="earlier checkpoints are intact"):
        save_checkpoint(tmp_path, 3, model, {})
    assert list(tmp_path.iterdir()) == []


def test_load_training_state_corrupt_file_is_clear(tmp_path, model):
    path = save_checkpoint(tmp_path, 4, model, {})
    (path / "checksums.json").unlink()  # as an older checkpoint, saved without checksums
    (path / TRAINING_STATE_NAME).write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="unreadable or corrupt"):
        load_training_state(path)


def test_resolve_resume_modes(tmp_path, model):
    assert resolve_resume("auto", tmp_path) is None
    path = save_checkpoint(tmp_path, 7, model, {})
    assert resolve_resume("never", tmp_path) is None
    assert resolve_resume("auto", tmp_path) == path
    assert resolve_resume(str(path), tmp_path / "elsewhere") == path
    with pytest.raises(CheckpointError, match="it is a run directory.*checkpoint-000007"):
        resolve_resume(str(tmp_path), tmp_path)
    with pytest.raises(CheckpointError, match="not a training checkpoint"):
        resolve_resume(str(tmp_path / "absent"), tmp_path)


def test_plain_converts_numpy_for_weights_only_loading():
    value = plain({"a": np.int64(3), "b": [np.float32(0.5)], "c": np.arange(3), "d": (np.bool_(True),)})
    assert value == {"a": 3, "b": [0.5], "c": [0, 1, 2], "d": (True,)}
    assert type(value["a"]) is int and type(value["b"][0]) is float


def test_save_checkpoint_never_prunes_the_one_just_written(tmp_path, model):
    for step in (8, 9):
        save_checkpoint(tmp_path, step, model, {}, keep_last=2)
    save_checkpoint(tmp_path, 3, model, {}, keep_last=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 8, 9]


def test_checkpoint_step_from_the_name_or_the_state(tmp_path, model):
    path = save_checkpoint(tmp_path / "run", 12, model, {})
    assert checkpoint_step(path) == 12
    renamed = path.rename(tmp_path / "kept-for-later")  # a checkpoint passed by a path of its own
    assert checkpoint_step(renamed) == 12
