"""Lazy package attributes: `from bertforge.data import PretrainingData` imports only the module that has it.

Packages use this so that importing them never pulls in torch or an optional extra before a name is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_getattr(package: str, table: dict[str, str]) -> Callable[[str], Any]:
    """A module-level `__getattr__` resolving `name` from the module `table[name]` names."""

    def __getattr__(name: str) -> Any:
        if name in table:
            return getattr(importlib.import_module(table[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
