"""The exceptions bertforge raises for user mistakes.

Every error a user can cause (a bad file, a wrong key, a corrupt checkpoint) is a `BertforgeError` whose
message names the file, line, key or field and says what to do. The CLI prints these as one line instead of
a traceback; anything else escaping is a bug in bertforge.
"""

from __future__ import annotations

import os


class BertforgeError(Exception):
    """Base class: a problem the user can fix; the message says how."""


class ConfigError(BertforgeError, ValueError):
    """A configuration field or run-file key is missing, unknown or out of range."""


class DataError(BertforgeError, ValueError):
    """An input file is malformed. Names the file and, where it applies, the 1-based line."""

    def __init__(self, message: str, path: str | os.PathLike | None = None, line: int | None = None):
        where = ""
        if path is not None:
            where = f"{os.fspath(path)}"
            if line is not None:
                where += f":{line}"
            where += ": "
        super().__init__(where + message)
        self.path = None if path is None else os.fspath(path)
        self.line = line


class CheckpointError(BertforgeError, ValueError):
    """A saved model or training state is missing files, keys or has mis-shaped tensors."""


class InputError(BertforgeError, ValueError):
    """A runtime input (token ids, sequence length, request) is out of range for the model."""
