"""Atomic writes of files and directories (the old one survives a failed write, no temporary remains, one
rename swaps a directory), the cleanup of crashed saves, the umask permissions, and the checksums."""

import errno
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from bertforge import storage
from bertforge.errors import CheckpointError
from bertforge.storage import open_atomic, write_json, write_text


def test_storage_failed_write_keeps_old_file(tmp_path):
    target = tmp_path / "vocab.txt"
    write_text(target, "old\n")
    with pytest.raises(RuntimeError), open_atomic(target) as handle:
        handle.write("half of a new fi")
        raise RuntimeError("disk full")
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["vocab.txt"]


def test_storage_files_are_readable_by_others(tmp_path):
    target = tmp_path / "sub" / "config.json"
    write_json(target, {"b": 1, "a": 2}, sort_keys=True)
    assert target.read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'
    assert stat.S_IMODE(target.stat().st_mode) & 0o044 == 0o044 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- directories -----------------------------------------------------------------------------------------

def build(path, files: dict[str, bytes]) -> None:
    with storage.atomic_directory(path) as tmp:
        for name, data in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_bytes(data)


def contents(path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_storage_atomic_directory_replaces_whole_and_leaves_nothing(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(storage, "exchange", lambda a, b: False)
    target = tmp_path / "best"
    build(target, {"a.txt": b"old", "old-only.txt": b"x"})
    build(target, {"a.txt": b"new", "sub/b.bin": b"\x00\x01"})
    assert contents(target) == {"a.txt": b"new", "sub/b.bin": b"\x00\x01"}
    assert sorted(os.listdir(tmp_path)) == ["best"]


def test_storage_exchange_swaps_two_directories_in_one_step(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "f").write_text("A")
    (b / "f").write_text("B")
    if not storage.exchange(a, b):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available on this system or filesystem")
    assert (a / "f").read_text() == "B" and (b / "f").read_text() == "A"


def test_storage_atomic_directory_failure_keeps_the_old_one(tmp_path):
    target = tmp_path / "best"
    build(target, {"a.txt": b"old"})
    with pytest.raises(OSError, match="No space left"):
        with storage.atomic_directory(target) as tmp:
            (tmp / "a.txt").write_bytes(b"half")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert contents(target) == {"a.txt": b"old"} and sorted(os.listdir(tmp_path)) == ["best"]


@pytest.mark.parametrize(("umask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700),
                                                               (0o002, 0o664, 0o775)])
def test_storage_saved_directory_gets_the_users_umask(tmp_path, umask, file_mode, dir_mode, tiny_config):
    from bertforge.model.bert import BertModel

    previous = os.umask(umask)
    try:
        assert storage.current_umask() == umask
        BertModel(tiny_config).save_pretrained(tmp_path / "m")  # safetensors alone writes 0600
        write_text(tmp_path / "plain.txt", "x")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "m").stat().st_mode) == dir_mode
    for file in (tmp_path / "m").iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == file_mode, file.name
    assert stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode) == file_mode


def test_storage_remove_stale_temporaries_puts_back_a_directory_moved_aside(tmp_path):
    # The two-rename fallback killed between its renames: best/ is aside as .old-, the new one as .tmp-.
    aside = tmp_path / ".best.old-999999999-0123456789ab"
    build(aside, {"a.txt": b"old"})
    build(tmp_path / ".best.tmp-999999999-abcdefabcdef", {"a.txt": b"new, not known complete"})
    found = storage.remove_stale_temporaries(tmp_path)
    assert len(found) == 2 and contents(tmp_path / "best") == {"a.txt": b"old"}
    assert sorted(os.listdir(tmp_path)) == ["best"]


def test_storage_remove_directory_never_shows_half_a_directory(tmp_path, monkeypatch):
    build(tmp_path / "checkpoint-000002", {"training_state.pt": b"s", "model.safetensors": b"w"})
    seen = []
    monkeypatch.setattr(storage.shutil, "rmtree", lambda path, **kw: seen.append(Path(path).name))
    storage.remove_directory(tmp_path / "checkpoint-000002")
    assert not (tmp_path / "checkpoint-000002").exists() and storage.TEMPORARY_NAME.match(seen[0])


# --- checksums -------------------------------------------------------------------------------------------

def test_storage_checksums_record_and_verify(tmp_path, monkeypatch):
    (tmp_path / "w.bin").write_bytes(b"weights")
    storage.record_checksums(tmp_path, ["w.bin"])
    manifest = json.loads((tmp_path / "checksums.json").read_text())
    assert manifest["files"]["w.bin"] == {"sha256": hashlib.sha256(b"weights").hexdigest(), "bytes": 7}
    assert storage.verify_checksum(tmp_path / "w.bin") is True
    assert storage.verify_checksum(tmp_path / "checksums.json") is False  # no entry: nothing to verify
    (tmp_path / "w.bin").write_bytes(b"weighty")
    with pytest.raises(CheckpointError, match=r"w\.bin: its sha256 differs .*BERTFORGE_SKIP_CHECKSUM=1"):
        storage.verify_checksum(tmp_path / "w.bin")
    monkeypatch.setenv("BERTFORGE_SKIP_CHECKSUM", "1")
    assert storage.verify_checksum(tmp_path / "w.bin") is False

