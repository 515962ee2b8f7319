"""Every hint in the package names command-line options that exist: a string of the source (a message, a
docstring) that writes `<command> --flag` names a flag that command's parser takes (issue 46: a refusal told
users to run `serve --tasks rerank`, which `serve` never had), and every `--flag` named anywhere is a flag of
some command."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

import bertforge
from bertforge.cli.parser import build_parser

SOURCE = Path(bertforge.__file__).parent
# A flag as users type it (`--max-length`); not a dotted override (`--training.lr=...`, checked by the run
# config itself) nor another program's snake_case option (`--doc_stride`).
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9](?![\w.])")
# `serve --x ...`, `bertforge embed --x`: a command word followed by its flags (up to the end of the clause).
COMMAND_FLAGS = r"(?<![\w./-])(?:bertforge\s+)?({commands})\s+((?:--[a-z][\w-]*(?:[ =][^\s`'\";,)(]+)?\s*)+)"
# Options of other programs the package's texts name (torchrun's, tensorboard's, text-embeddings-inference's),
# and the placeholders of the override syntax's description (`cli.overrides`).
# Subcommands named by a verb that hints also use in prose: named as hints only after `bertforge`.
PROSE_WORDS = {"add", "delete", "compact", "index", "search"}
FOREIGN = {"--nnodes", "--logdir", "--auto-truncate", "--key", "--some-key", "--some-flag", "--unknown-key"}


def subcommands() -> dict[str, set[str]]:
    """Each `bertforge` subcommand's option strings (and the global ones)."""
    parser = build_parser()
    top = {option for action in parser._actions for option in action.option_strings}
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = top | {option for a in sub._actions for option in a.option_strings}
    return found


def source_strings() -> list[tuple[str, str]]:
    """(file:line, text) of every string constant in the package, f-strings' literal parts joined."""
    strings = []
    for path in sorted(SOURCE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                text = "".join(part.value if isinstance(part, ast.Constant) else "X" for part in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            else:
                continue
            strings.append((f"{path.relative_to(SOURCE)}:{node.lineno}", text))
    return strings


def test_cli_hints_name_flags_their_command_takes():
    commands = subcommands()
    pattern = re.compile(COMMAND_FLAGS.format(commands="|".join(sorted(map(re.escape, commands), key=len,
                                                                        reverse=True))))
    unknown = []
    for where, text in source_strings():
        for match in pattern.finditer(text):
            command = match.group(1)
            if command in PROSE_WORDS and not match.group(0).startswith("bertforge"):
                continue  # "add --sparse": the verb in a sentence, not `bertforge add`
            unknown += [f"{where}: {command} {flag}" for flag in FLAG.findall(match.group(2))
                        if flag not in commands[command]]
    assert unknown == []


def test_cli_hints_name_only_flags_some_command_takes():
    known = set().union(*subcommands().values()) | FOREIGN
    unknown = sorted({f"{where}: {flag}" for where, text in source_strings() for flag in FLAG.findall(text)
                      if flag not in known})
    assert unknown == []


@pytest.mark.parametrize("text, named", [("run `bertforge serve --tasks rerank`", "serve --tasks"),
                                         ("use serve --rerank-label LABEL", None)])
def test_cli_hints_check_finds_a_flag_its_command_lacks(text, named):
    commands = subcommands()
    pattern = re.compile(COMMAND_FLAGS.format(commands="|".join(commands)))
    found = [f"{m.group(1)} {flag}" for m in pattern.finditer(text) for flag in FLAG.findall(m.group(2))
             if flag not in commands[m.group(1)]]
    assert found == ([named] if named else [])
