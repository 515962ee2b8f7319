"""Run files: TOML loaded into a tree of typed dataclasses, plus `--section.key=value` command-line overrides.

Each component owns its config dataclass (`TrainingConfig`, `MaskingConfig`, ...); a command's config is a
dataclass whose fields are values or nested component configs, and a TOML table maps onto each nested one:

    data_dir = "runs/shards"          # PretrainConfig.data_dir
    [training]                        # PretrainConfig.training: TrainingConfig
    lr = 1e-4

Overrides name the same path (`--training.lr=5e-5`); the value is read as a TOML literal (`5e-5`, `true`,
`[0.9, 0.98]`, `"text"`) and, when it is not one, taken as a plain string (`--model=base`). Unknown
sections or keys are errors that list the valid ones: a typo must never be silently ignored. Nothing is
evaluated (no exec, no globals, no interpolation). Validation of values is the dataclasses' own business
(`__post_init__`); this module only checks that a value's kind fits the field's annotation.

The command line's flags give typed values instead (`load_config(values=...)`, no text in between), and its
`--help` is the fields' own: each declares its help text, and any choices, with `setting`, read back with
`field_help` / `field_choices` (`declared_field` finds them for a field a subclass redeclares).
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from bertforge.errors import ConfigError

T = TypeVar("T")


def settings_source(path: str | os.PathLike | None, values: dict[str, Any] | None, overrides: Sequence[str]) -> str:
    """Where a run's settings came from, for its errors: the run file, the command line, both, or defaults."""
    typed = bool(values) or bool(overrides)
    if path is None:
        return "the command line" if typed else "defaults"
    return f"{os.fspath(path)} and the command line" if typed else os.fspath(path)


def load_config(cls: type[T], path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = (),
                values: dict[str, Any] | None = None) -> T:
    """Build `cls` (a dataclass) from a TOML run file, then `values`, then command-line overrides.

    Args:
        cls: the config dataclass; nested dataclass fields become TOML tables.
        path: the run file, or None for defaults.
        overrides: strings `section.key=value` (a leading `--` is allowed), applied in order.
        values: a nested dict of typed values applied after the file and before the overrides (the command
            line's flags, programmatic callers).

    Raises:
        ConfigError: unreadable file, unknown key, value of the wrong kind, or a dataclass's own validation.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"load_config needs a dataclass, got {cls!r}")
    tree: dict[str, Any] = {}
    source = settings_source(path, values, overrides)
    if path is not None:
        tree = read_toml(path)
    if values:
        merge(tree, values)
    for text in overrides:
        dotted, value = parse_override(text)
        set_dotted(tree, dotted, value)
    return build(cls, tree, source=source, prefix="")


def setting(default: Any = None, help: str = "", *, factory: Any = None, choices: tuple[Any, ...] = ()) -> Any:
    """A config field with its help text, which the command line's `--help` shows (`field_help`).

    `factory` builds a mutable default (a list) afresh for every instance. `choices` names the values the
    command line offers (`--precision {auto,fp32,bf16,fp16}`); the dataclass still validates its own values.
    """
    metadata = {"help": help, "choices": tuple(choices)} if choices else {"help": help}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def field_help(item: dataclasses.Field) -> str:
    """The help text a config field was declared with (`setting`), else ""."""
    return str(item.metadata.get("help", ""))


def field_choices(item: dataclasses.Field) -> tuple[Any, ...]:
    """The values a config field was declared to take (`setting(choices=...)`), else ()."""
    return tuple(item.metadata.get("choices", ()))


def declared_field(cls: type, name: str) -> dataclasses.Field:
    """Field `name` of dataclass `cls` with its metadata: `cls`'s own, or, where `cls` redeclares the field only
    to change its default (`FinetuneTrainingConfig.lr = 5e-5`), the one of the base class that declared it."""
    found = None
    for klass in cls.__mro__:
        if not dataclasses.is_dataclass(klass):
            continue
        item = next((f for f in dataclasses.fields(klass) if f.name == name), None)
        if item is None:
            break
        found = found or item
        if item.metadata:
            return item
    if found is None:
        raise KeyError(f"{cls.__name__} has no field {name!r}")
    return found


def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    file = Path(path)
    try:
        with open(file, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{file}: run file not found; check the path (example run files live in configs/)") from None
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message already carries "(at line L, column C)".
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read the run file ({exc})") from None


def parse_override(text: str) -> tuple[str, Any]:
    """`--training.lr=5e-5` -> ("training.lr", 5e-05); the value is a TOML literal or else a string."""
    body = text[2:] if text.startswith("--") else text
    if "=" not in body:
        raise ConfigError(f"override {text!r} has no '='; write it as --section.key=value")
    dotted, raw = body.split("=", 1)
    dotted = dotted.strip()
    if not dotted or any(not part for part in dotted.split(".")):
        raise ConfigError(f"override {text!r} has an empty key; write it as --section.key=value")
    return dotted, parse_value(raw.strip())


def parse_value(raw: str) -> Any:
    """A TOML literal (`3`, `1e-4`, `true`, `[1, 2]`, `"x"`, `{a = 1}`) or, failing that, the raw string."""
    try:
        return tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        return raw


def merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    """Recursively merge `new` into `into` (tables merge, everything else replaces)."""
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *sections, key = dotted.split(".")
    node = tree
    for section in sections:
        child = node.get(section)
        if not isinstance(child, dict):
            child = node[section] = {}
        node = child
    node[key] = value


def build(cls: type[T], data: dict[str, Any], *, source: str, prefix: str) -> T:
    """Instantiate dataclass `cls` from a nested dict, checking keys and value kinds.

    A class may fill defaults that depend on another of its keys (a recipe's: `PretrainConfig`'s `arch`) with a
    classmethod `implied_settings(data) -> data`, called first; keys the data sets keep their values."""
    implied = getattr(cls, "implied_settings", None)
    if implied is not None:
        data = implied(data)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"[{prefix.rstrip('.')}]" if prefix else "the top level"
        raise ConfigError(f"{source}: unknown key {prefix + unknown[0]!r} in {where}; valid keys are "
                          f"{describe_keys(cls, hints)}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        hint = hints[name]
        nested = dataclass_of(hint)
        if nested is not None:
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {prefix + name!r} is a section; set its keys, e.g. "
                                  f"--{prefix}{name}.<key>=value (valid keys: {describe_keys(nested)})")
            kwargs[name] = build(nested, value, source=source, prefix=f"{prefix}{name}.")
        else:
            kwargs[name] = coerce(value, hint, f"{prefix}{name}", source)
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: invalid value in [{prefix.rstrip('.') or cls.__name__}]: {exc}") from None


def describe_keys(cls: type, hints: dict[str, Any] | None = None) -> str:
    hints = hints if hints is not None else typing.get_type_hints(cls)
    names = []
    for f in dataclasses.fields(cls):
        if f.init:
            names.append(f"[{f.name}]" if dataclass_of(hints[f.name]) is not None else f.name)
    return ", ".join(names)


def dataclass_of(hint: Any) -> type | None:
    """The dataclass type a field holds (also through `X | None`), or None for plain values."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    if is_union(hint):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(options) == 1:
            return dataclass_of(options[0])
    return None


def is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def coerce(value: Any, hint: Any, key: str, source: str) -> Any:
    """Check `value` against the annotation; ints are accepted where a float is expected."""
    ok, converted = fits(value, hint)
    if not ok:
        raise ConfigError(f"{source}: {key} = {value!r} ({type(value).__name__}) does not fit the field's type "
                          f"{type_name(hint)}; quote strings, write numbers and true/false bare")
    return converted


def fits(value: Any, hint: Any) -> tuple[bool, Any]:
    if hint is Any or hint is object:
        return True, value
    if is_union(hint):
        for option in typing.get_args(hint):
            ok, converted = fits(value, option)
            if ok:
                return True, converted
        return False, value
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return value in typing.get_args(hint), value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            return False, value
        args = typing.get_args(hint)
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                return False, value
            items = list(args)
        else:
            items = [args[0] if args else Any] * len(value)
        converted = []
        for element, item in zip(value, items):
            ok, element = fits(element, item)
            if not ok:
                return False, value
            converted.append(element)
        return True, origin(converted)
    if origin is dict:
        return isinstance(value, dict), value
    if hint is type(None):
        return value is None, value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return True, float(value)
        return False, value
    if hint is str:
        return isinstance(value, str), value
    if isinstance(hint, type):
        return isinstance(value, hint), value
    return True, value


def type_name(hint: Any) -> str:
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "")


# --- writing a config back out ---------------------------------------------------------------------------

def to_dict(config: Any) -> dict[str, Any]:
    """The config tree as nested plain dicts (what `load_config(values=...)` takes back)."""
    return dataclasses.asdict(config)


def dumps_toml(config: Any) -> str:
    """The config as a TOML run file that `load_config` reads back to an equal config.

    TOML has no null: a field whose value is None is written as a comment, so reading the file back
    leaves it at its default (these fields default to None).
    """
    data = to_dict(config) if dataclasses.is_dataclass(config) else config
    lines: list[str] = []
    write_table(lines, data, [])
    return "\n".join(lines).strip() + "\n"


def write_table(lines: list[str], table: dict[str, Any], path: list[str]) -> None:
    if path:
        lines.append("")
        lines.append("[" + ".".join(path) + "]")
    subtables = []
    for key, value in table.items():
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            subtables.append((key, value))
        elif value is None:
            lines.append(f"# {key} is unset")
        else:
            lines.append(f"{key} = {toml_value(value)}")
    for key, value in subtables:
        write_table(lines, value, [*path, key])


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str | os.PathLike):
        text = os.fspath(value)
        escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
        return f'"{escaped}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise ConfigError(f"cannot write {value!r} ({type(value).__name__}) to TOML")


def toml_key(key: Any) -> str:
    text = str(key)
    if text and all(c.isalnum() or c in "_-" for c in text):
        return text
    return toml_value(text)


def shared_data_root() -> Path:
    """The project's real-data folder: $BERTFORGE_DATA, else `../shared/data` beside the working directory
    or beside the repository this package was installed from (what named tasks and benchmarks read)."""
    from_env = os.environ.get("BERTFORGE_DATA")
    if from_env:
        return Path(from_env)
    candidates = [base.parent / "shared" / "data" for base in (Path.cwd(), Path(__file__).resolve().parents[2])]
    # The project's workspace layout, for checkouts made elsewhere (e.g. a CI clone in a temporary folder).
    candidates.append(Path("/work/shared/data"))
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    return Path("../shared/data")
