"""The arguments no flag knows: free-form `--section.key=value` overrides that a user types.

Only `pretrain`, `finetune` and `evaluate` take them. They stay text here, `key=value`, and are parsed once,
where the config is built (`configuration.parse_override`: a TOML literal, else a plain string); the config
rejects a key it does not have, listing the valid ones.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from bertforge.errors import ConfigError

OVERRIDE_COMMANDS = ("pretrain", "finetune", "evaluate")
OVERRIDE = re.compile(r"^--([A-Za-z_][\w]*(\.[A-Za-z_]\w*)*)=(.*)$", re.S)
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def split_overrides(extra: list[str]) -> list[str]:
    """Arguments argparse did not know, as `key=value` overrides of the run's config.

    Accepted spellings: `--section.key=value`, `--key=value`, `--some-key value` and a bare `--some-flag`
    (true); hyphens in names become underscores. The config rejects keys it does not have.
    """
    overrides = []
    items = list(extra)
    while items:
        arg = items.pop(0)
        key, sep, value = arg.partition("=")
        match = OVERRIDE.match("--" + key[2:].replace("-", "_") + sep + value) if key.startswith("--") else None
        if match and sep:
            overrides.append(f"{match.group(1)}={match.group(3)}")
            continue
        name = arg[2:].replace("-", "_") if arg.startswith("--") else ""
        if not DOTTED.fullmatch(name):
            raise ConfigError(f"unrecognised argument {arg!r}; any setting of a run file can be given as "
                              "--key value, --key=value or --section.key=value (e.g. --training.lr=5e-5)")
        if items and not items[0].startswith("--"):
            overrides.append(f"{name}={items.pop(0)}")
        else:
            overrides.append(f"{name}=true")
    return overrides


def join_unknown_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """Rewrite `--unknown-key value` as `--unknown-key=value` for the subcommands that take config overrides.

    Otherwise argparse hands `value` to the optional positional run file (`--progress false` would look for a
    run file named "false").
    """
    if not argv or argv[0] not in OVERRIDE_COMMANDS:
        return argv
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    known = subparsers.choices[argv[0]]._option_string_actions
    out, items = [argv[0]], list(argv[1:])
    while items:
        item = items.pop(0)
        if (item.startswith("--") and "=" not in item and item not in known and items
                and not items[0].startswith("--")):
            item = f"{item}={items.pop(0)}"
        elif item in known and known[item].nargs != 0 and items and not items[0].startswith("--"):
            # a known option keeps its own value (an optional one, e.g. `--progress`, may have none)
            out.append(item)
            item = items.pop(0)
        out.append(item)
    return out


def evaluate_overrides(args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    """What the command line changes in the saved task description: `{"reader": {...}, "inputs": {...},
    "options": {...}}` from the column flags, then `--reader.KEY=value` / `--inputs.KEY=value` /
    `--options.KEY=value`."""
    from bertforge.cli.flags import config_values
    from bertforge.configuration import parse_override, set_dotted

    overrides = config_values(args)
    for item in split_overrides(extra):
        set_dotted(overrides, *parse_override(item))
    return overrides
