"""The benchmark scripts are not run by the suite, but the names they import from bertforge and from each other
must exist: a rename in the package otherwise breaks a documented benchmark (or a test that imports it) silently
until someone runs it. Checked from the source, without running the scripts' heavy imports."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OURS = ("bertforge", "benchmarks")


def imported_names(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, name) for every `from bertforge... import name` / `from benchmarks... import name`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in OURS:
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
    return found


def test_benchmark_imports_name_what_exists():
    missing = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        for line, module, name in imported_names(path):
            target = importlib.import_module(module)
            if not hasattr(target, name):
                try:
                    importlib.import_module(f"{module}.{name}")
                except ImportError:
                    missing.append(f"benchmarks/{path.name}:{line}: {module} has no {name}")
    assert not missing, "\n".join(missing)
