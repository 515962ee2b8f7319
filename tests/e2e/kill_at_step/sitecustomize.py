"""Loaded by Python at start-up when this folder leads PYTHONPATH (tests/e2e/test_retrieval_kill9.py): counts the
file-system steps a command takes under one folder and sends the process SIGKILL at one of them.

A step is what test_retrieval_folder_growth counts in-process: an os.replace, os.rename or os.unlink (Path.unlink
calls it), an open for writing (builtins.open, io.open and so Path.open; os.open with a writing flag), and the one-call directory swap (`storage.exchange`), each counted only when
its path lies under BERTFORGE_KILL_ROOT (the folder the command changes; what the interpreter and its libraries
write elsewhere is not the command's and would not be deterministic). The step is killed before it happens.

    BERTFORGE_KILL_ROOT   the folder whose steps count (unset: this module does nothing)
    BERTFORGE_KILL_AT     the step (0-based) at which the process kills itself (unset: none, run to the end)
    BERTFORGE_KILL_LOG    a file to which each step taken is appended, one line "NAME PATH"
"""

from __future__ import annotations

import builtins
import io
import os
import signal

ROOT = os.environ.get("BERTFORGE_KILL_ROOT")


def install(root: str) -> None:
    root = os.path.realpath(root)
    kill_at = int(os.environ["BERTFORGE_KILL_AT"]) if os.environ.get("BERTFORGE_KILL_AT") else None
    log = os.environ.get("BERTFORGE_KILL_LOG") or None
    record = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if log else None
    taken = [0]
    real_open = os.open

    def inside(path: object) -> bool:
        if isinstance(path, int):
            return False  # a descriptor: opened already
        try:
            full = os.path.realpath(os.fsdecode(path))
        except TypeError:
            return False
        return full == root or full.startswith(root + os.sep)

    def step(name: str, path: object) -> None:
        if not inside(path):
            return
        if kill_at is not None and taken[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        taken[0] += 1
        if record is not None:
            os.write(record, f"{name} {os.fsdecode(path)}\n".encode())

    def counted(name: str, function, path_of=lambda args, kwargs: args[0]):
        def wrapper(*args, **kwargs):
            step(name, path_of(args, kwargs))
            return function(*args, **kwargs)

        return wrapper

    for name in ("replace", "rename", "unlink", "remove"):
        setattr(os, name, counted(name, getattr(os, name)))
    real_io_open = io.open

    def writing(args, kwargs) -> object:
        mode = args[1] if len(args) > 1 else kwargs.get("mode", "r")
        return args[0] if any(flag in mode for flag in "wax+") else None

    def opened(*args, **kwargs):
        path = writing(args, kwargs)
        if path is not None:
            step("open", path)
        return real_io_open(*args, **kwargs)

    builtins.open = io.open = opened

    def os_opened(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            step("os.open", path)
        return real_open(path, flags, *args, **kwargs)

    os.open = os_opened
    from bertforge import storage  # stdlib only: cheap, and its directory swap is a step too

    storage.exchange = counted("exchange", storage.exchange)


if ROOT:
    install(ROOT)
