"""Atomic file and directory writes, the one way bertforge writes: build aside, then one rename; and the
checksums that let a reader tell a saved file from a damaged one.

Files: a temporary sibling, then `os.replace`. A crash, a full disk or Ctrl-C mid-write leaves the previous
file intact (or no file), never half of one.

Directories (a model directory, a training checkpoint, `best/`): `atomic_directory` builds a temporary
sibling, gives it the user's umask permissions, flushes it to disk (fsync, so a power cut after the rename
cannot leave empty files behind the new name), then puts it in place with ONE rename: a plain rename when
the target does not exist, else Linux's `renameat2(RENAME_EXCHANGE)`, which swaps the two names in one
step; the old directory, now under the temporary name, is deleted afterwards. So a reader (`--resume auto`,
`predict`, `serve`, `transformers`' `from_pretrained`) sees the old complete directory or the new complete
one at every instant, never none. Where the exchange is unavailable (another OS, a filesystem without it:
NFS, some FUSE mounts) the fallback is two renames (old aside, new in); a crash between them leaves the old
directory aside under a recognisable name, and `remove_stale_temporaries` puts it back on the next start.

Every temporary name is `.<target>.<tmp|old|del>-<pid>-<12 hex>`; `remove_stale_temporaries` removes only
names of that shape whose process is gone, never anything else in the folder.

Permissions: files 0o666 and folders 0o777, less the umask (0644 / 0755 with the usual 022), whatever the
writer (safetensors writes 0600): saved models and data are meant to be shared.

Checksums: `record_checksums` stores the sha256 and size of named files of a directory in its
`checksums.json`; `verify_checksum` compares a file with it before it is read (a missing manifest or entry
is fine: Hugging Face's directories and older saves have none). BERTFORGE_SKIP_CHECKSUM=1 skips the
verification (hashing reads the whole file once more: 0.7 s for 256 MiB on the 2-core test machine).
`file_record` / `file_differs` are the same check for a manifest of another name (an exported graph's
engine.json, an index's record).

The user's cache (`user_cache`): `$BERTFORGE_CACHE`, else `$XDG_CACHE_HOME/bertforge`, else
`~/.cache/bertforge`: what bertforge makes for itself from inputs at hand (the ONNX Runtime engine's graphs).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from bertforge.constants import CHECKSUMS_NAME
from bertforge.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)

# `.<target>.<kind>-<pid>-<token>`: tmp = being built (or, after an exchange, the old one being deleted),
# old = moved aside by the two-rename fallback, del = being deleted (a pruned checkpoint).
TEMPORARY_NAME = re.compile(r"^\.(?P<target>.+)\.(?P<kind>tmp|old|del)-(?P<pid>\d+)-(?P<token>[0-9a-f]{12})$")
SKIP_CHECKSUM_ENV = "BERTFORGE_SKIP_CHECKSUM"
CACHE_ENV = "BERTFORGE_CACHE"


def temporary_sibling(path: str | os.PathLike, kind: str = "tmp") -> Path:
    """A fresh name beside `path` that `remove_stale_temporaries` recognises (and nothing else uses)."""
    path = Path(path)
    return path.parent / f".{path.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


# --- files -----------------------------------------------------------------------------------------------

@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path`, on failure it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(path)
    try:
        yield tmp
        if tmp.exists():
            os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
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
    """The process's umask, read without changing it where Linux says it (os.umask would set it for a moment,
    racing other threads that create files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
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


# --- directories -----------------------------------------------------------------------------------------

@contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary directory beside `path`; when the block succeeds it becomes `path` in one
    rename (replacing a directory there), when it fails it is removed and `path` is untouched.

    Raises:
        OSError: creating, writing or renaming failed (a full disk, permissions); `path` is as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent, target=path.name)
    tmp = temporary_sibling(path)
    try:
        os.mkdir(tmp)
        yield tmp
        share_tree(tmp)
        sync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    swap_into_place(tmp, path)


def swap_into_place(tmp: Path, path: Path) -> None:
    """Make the complete directory `tmp` be `path` in one rename; delete what `path` held before."""
    try:
        if not os.path.lexists(path):
            os.rename(tmp, path)
            aside = None
        elif exchange(tmp, path):
            aside = tmp  # now holds the old directory
        else:
            aside = temporary_sibling(path, "old")
            os.rename(path, aside)
            try:
                os.rename(tmp, path)
            except BaseException:
                os.rename(aside, path)
                raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # The new directory is in place: what follows only tidies up, and must not report the save as failed.
    try:
        sync_directory(path.parent)
    except OSError as exc:
        log.warning("%s: saved, but flushing its folder to disk failed (%s)", path, exc)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def user_cache(*parts: str) -> Path:
    """A folder of the user's bertforge cache: `$BERTFORGE_CACHE`, else `$XDG_CACHE_HOME/bertforge` (an
    absolute path, as the XDG spec asks), else `~/.cache/bertforge`; `parts` below it. Nothing is created.
    What is kept there is made from inputs at hand (an exported graph): deleting it costs a rebuild only."""
    base = os.environ.get(CACHE_ENV, "").strip()
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
        base = os.path.join(xdg, "bertforge") if os.path.isabs(xdg) else os.path.join("~", ".cache", "bertforge")
    return Path(base).expanduser().joinpath(*parts)


def remove_directory(path: str | os.PathLike) -> None:
    """Delete a directory so that no half-deleted copy is ever visible under its name: rename it aside
    (a `.del-` name the next start removes, should this be interrupted), then delete it."""
    path = Path(path)
    aside = temporary_sibling(path, "del")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    except OSError:
        aside = path
    shutil.rmtree(aside, ignore_errors=True)


def remove_stale_temporaries(folder: str | os.PathLike, target: str | None = None) -> list[Path]:
    """Remove what crashed saves left in `folder` (only `TEMPORARY_NAME`s, optionally only those of
    `target`, whose process is gone), first putting back a directory the two-rename fallback had moved
    aside when nothing took its place. Returns the paths removed or put back."""
    folder = Path(folder)
    try:
        entries = sorted(folder.iterdir(), key=lambda p: p.lstat().st_mtime, reverse=True)
    except OSError:
        return []
    found = []
    for entry in entries:
        match = TEMPORARY_NAME.match(entry.name)
        if match is None or (target is not None and match["target"] != target):
            continue
        if process_alive(int(match["pid"])):
            continue  # another process's save in flight
        original = folder / match["target"]
        try:
            if match["kind"] == "old" and not os.path.lexists(original) and entry.is_dir():
                os.rename(entry, original)
                log.warning("%s: put back from %s (a save was interrupted between its two renames)", original,
                            entry.name)
            elif entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError as exc:
            log.warning("%s: could not remove this leftover of an interrupted save (%s)", entry, exc)
            continue
        found.append(entry)
    if found:
        log.info("%s: removed %d leftover(s) of interrupted saves", folder, len(found))
    return found


def process_alive(pid: int) -> bool:
    """Whether another process with this id is running (our own id: no save of ours is in flight while we
    tidy up, so its leftovers are stale too)."""
    if pid == os.getpid() or os.name != "posix":
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    except OSError:
        return False
    return True


def share_tree(root: Path) -> None:
    """Give every file 0o666 and every folder 0o777 less the umask (writers such as safetensors create 0600)."""
    mask = current_umask()
    os.chmod(root, 0o777 & ~mask)
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(folder, name), 0o777 & ~mask)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o666 & ~mask)


def sync_tree(root: Path) -> None:
    """fsync every file and folder under `root`, so that the rename that publishes it comes after its data
    is on disk."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            descriptor = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        sync_directory(Path(folder))


def sync_directory(folder: Path) -> None:
    """fsync a folder (its entries: names created or renamed in it); a no-op where folders cannot be opened."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
# renameat2's system call number where glibc is older than 2.28 (no wrapper): by machine.
_RENAMEAT2_SYSCALL = {"x86_64": 316, "aarch64": 276, "riscv64": 276, "ppc64le": 357, "s390x": 347}


@functools.cache
def _renameat2() -> Any:
    """A callable (olddirfd, old, newdirfd, new, flags) -> int for Linux's renameat2, or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    function = getattr(libc, "renameat2", None)
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        function.restype = ctypes.c_int
        return function
    number = _RENAMEAT2_SYSCALL.get(platform.machine())
    if number is None or not hasattr(libc, "syscall"):
        return None
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    return lambda *args: syscall(ctypes.c_long(number), ctypes.c_int(args[0]), ctypes.c_char_p(args[1]),
                                 ctypes.c_int(args[2]), ctypes.c_char_p(args[3]), ctypes.c_uint(args[4]))


def exchange(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Swap the names `a` and `b` atomically (Linux renameat2 RENAME_EXCHANGE). False when this system or
    filesystem cannot (the caller falls back); OSError for a real failure."""
    call = _renameat2()
    if call is None:
        return False
    if call(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), os.fspath(a), None, os.fspath(b))


# --- checksums -------------------------------------------------------------------------------------------

def file_sha256(path: str | os.PathLike) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def file_record(path: str | os.PathLike) -> dict[str, Any]:
    """{"sha256", "bytes"} of a file: what a manifest keeps to tell it later from a damaged or foreign one."""
    return {"sha256": file_sha256(path), "bytes": Path(path).stat().st_size}


def record_checksums(folder: str | os.PathLike, names: Iterable[str]) -> None:
    """Add the sha256 and size of `folder`'s files `names` to its `checksums.json` (created when absent)."""
    folder = Path(folder)
    manifest = read_checksums(folder) or {}
    for name in names:
        manifest[name] = file_record(folder / name)
    write_json(folder / CHECKSUMS_NAME, {"written_by": "bertforge", "algorithm": "sha256",
                                         "files": dict(sorted(manifest.items()))})


def read_checksums(folder: str | os.PathLike) -> dict[str, dict[str, Any]] | None:
    """{file name: {"sha256", "bytes"}} from `folder`'s checksums.json; None when there is none.

    Raises:
        CheckpointError: the manifest is unreadable or not bertforge's.
    """
    file = Path(folder) / CHECKSUMS_NAME
    try:
        data = read_json(file, what="checksum manifest")
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise CheckpointError(f"{exc}; the directory is damaged: re-save or re-download it (or delete "
                              f"{CHECKSUMS_NAME} to load it unverified)") from None
    if not isinstance(data, dict) or data.get("written_by") != "bertforge":
        log.debug("%s: not written by bertforge; not used to verify files", file)
        return None
    files = data.get("files")
    if data.get("algorithm") != "sha256" or not isinstance(files, dict):
        raise CheckpointError(f"{file}: not a bertforge checksum manifest (expected \"algorithm\": \"sha256\" and "
                              f"\"files\"); re-save the directory, or delete {CHECKSUMS_NAME} to load it unverified")
    return files


def checksums_skipped() -> bool:
    return os.environ.get(SKIP_CHECKSUM_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def verify_checksum(file: str | os.PathLike) -> bool:
    """Compare `file` with the entry its directory's checksums.json holds for it, before it is read.

    Returns True when verified, False when there is nothing to verify against (no manifest or no entry:
    a Hugging Face directory, an older save) or verification is skipped (BERTFORGE_SKIP_CHECKSUM=1).

    Raises:
        CheckpointError: the size or the sha256 differs (the file was damaged on disk or in a copy, or
            replaced by another tool), naming the file and the fixes.
    """
    file = Path(file)
    if checksums_skipped():
        return False
    entry = (read_checksums(file.parent) or {}).get(file.name)
    if not isinstance(entry, dict):
        return False
    problem = file_differs(file, entry)
    if problem is not None:
        # A reader racing a save of the same directory (a server reloading best/ while training replaces it)
        # may have read the manifest of one version and the file of the next: compare once more with what
        # the directory holds now, and report only a difference that stays.
        again = (read_checksums(file.parent) or {}).get(file.name)
        if again != entry and isinstance(again, dict):
            problem = file_differs(file, again)
    if problem is not None:
        raise CheckpointError(f"{file}: {problem}; re-save or re-download it; if the file was replaced on purpose, "
                              f"delete {CHECKSUMS_NAME} beside it (or set {SKIP_CHECKSUM_ENV}=1 to load without "
                              "verification)")
    return True


def file_differs(file: str | os.PathLike, entry: dict[str, Any], recorded_in: str = CHECKSUMS_NAME) -> str | None:
    """How `file` differs from its entry (`file_record`'s {"sha256", "bytes"}) in the manifest `recorded_in`
    (missing, another size, another sha256), or None when it matches. The size is compared first: a
    truncated file costs no hash."""
    file = Path(file)
    try:
        size = file.stat().st_size
    except FileNotFoundError:
        return f"missing, though {recorded_in} lists it"
    if size != entry.get("bytes"):
        return f"{size} bytes, but {entry.get('bytes')} were saved (truncated or damaged)"
    if file_sha256(file) != entry.get("sha256"):
        return f"its sha256 differs from the one saved in {recorded_in} (the file is damaged or was replaced)"
    return None


def start_parts(parts: Path, manifest: dict[str, Any], *, what: str,
                differences: Callable[[dict[str, Any], dict[str, Any]], list[str]],
                subfolders: Iterable[str] = (), manifest_name: str = "manifest.json") -> None:
    """Prepare the parts folder of a resumable job that writes its output in parts (rank 0, before any rank
    writes; `bertforge predict` of a file, `bertforge mine-negatives --corpus`): a new folder gets `manifest`;
    a folder of the same run loses the temporary files a killed run left behind (in it and in `subfolders`), so
    their parts are redone; a folder of another run is refused, `differences(existing, manifest)` saying how.

    Raises:
        ConfigError: the folder holds the `what` of another run, or a manifest that cannot be read.
    """
    try:
        existing = read_json(parts / manifest_name, what=f"{what} manifest")
    except FileNotFoundError:
        existing = None
    except ValueError as error:
        raise ConfigError(f"{error}; delete {parts} to start over") from None
    manifest = json.loads(json.dumps(manifest))  # as read back (lists, not tuples)
    if existing is not None and existing != manifest:
        raise ConfigError(f"{parts} holds the {what} of another run ({'; '.join(differences(existing, manifest))}); "
                          f"rerun the same command to resume, or delete {parts} to start over")
    parts.mkdir(parents=True, exist_ok=True)
    for folder in (parts, *(parts / name for name in subfolders)):
        for stale in folder.glob(".*.tmp"):
            stale.unlink(missing_ok=True)
    if existing is None:
        write_json(parts / manifest_name, manifest)
