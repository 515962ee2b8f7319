"""Atomic file writes, the one way bertforge writes a file: a temporary sibling, then a rename.

A crash, a full disk or Ctrl-C mid-write leaves the previous file intact (or no file), never half of one.
Files are created readable by others (0644 before umask): saved models and data are meant to be shared.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


@contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path`, on failure it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(handle)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def open_atomic(path: str | os.PathLike, mode: str = "w", **kwargs: Any) -> Iterator[IO]:
    """`open()` for writing, replacing `path` only when the block finishes without an exception."""
    if "b" not in mode:
        kwargs.setdefault("encoding", "utf-8")
    with atomic_path(path) as tmp, open(tmp, mode, **kwargs) as handle:
        yield handle


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with open_atomic(path, "wb") as handle:
        handle.write(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    """UTF-8 text, line endings written as given."""
    with open_atomic(path, "w", newline="") as handle:
        handle.write(text)


def write_json(path: str | os.PathLike, data: Any, *, sort_keys: bool = False) -> None:
    write_text(path, json.dumps(data, indent=2, ensure_ascii=False, sort_keys=sort_keys) + "\n")


def write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> None:
    with open_atomic(path) as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def read_json(path: str | os.PathLike, *, what: str = "file") -> Any:
    """The JSON value stored at `path`; a missing or malformed file raises one error naming it.

    Args:
        path: the file.
        what: what the file is, for the message (e.g. "config.json of the model directory").

    Raises:
        FileNotFoundError: the file does not exist (callers decide whether that is an error).
        ValueError: the file is unreadable, not UTF-8 or not JSON; the message names the file.
    """
    path = Path(path)
    try:
        # utf-8-sig: a byte-order mark at the start (Windows editors write one) is not part of the JSON.
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read this {what} as JSON ({exc})") from None
