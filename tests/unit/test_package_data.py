"""The files the package needs at run time that are not Python (the server's browser page) are declared as
package data in pyproject.toml, so a wheel carries them: a file added beside them without a matching pattern
would work from a checkout and be missing from every installed copy."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOT = ROOT / "src"


def test_package_data_declares_every_page_file():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]
    static = PACKAGE_ROOT / "bertforge" / "serving" / "static"
    files = sorted(p for p in static.rglob("*") if p.is_file())
    assert {p.name for p in files} >= {"page.html", "page.js", "page.css"}
    patterns = declared["bertforge.serving"]
    for path in files:
        relative = path.relative_to(static.parent).as_posix()
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns), (
            f"{relative} is not package data; add a pattern for it under [tool.setuptools.package-data]")
