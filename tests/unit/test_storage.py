"""Atomic writes: the old file survives a failed write, no temporary files remain, files are shareable."""

import os
import stat

import pytest

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
