"""Command-line flags made from config fields: each flag reads one typed value and puts it in the nested dict
a run config is built from (`configuration.load_config(values=...)`), so no value is written back to text.

A field's annotation says how its flag reads its text, once, as argparse's `type=`: `int` (N), `float` (X),
`str` (TEXT), `int | str` (an integer where the text is one, a column index, else the text); `bool` takes
an optional word (`--progress`, `--progress false`), and `bool | Literal["auto"]` that word or "auto";
`list[X]` takes one or more arguments, each
comma-separated (`--seeds 1,2 3`) or a TOML array (`--labels '["a,b", "c"]'` for items with commas). Its
help text and choices are the field's metadata (`configuration.setting`). Dict and table fields have no
flag: `--section.key=value` sets them (`cli.overrides`).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bertforge.configuration import (
    dataclass_of,
    declared_field,
    field_choices,
    field_help,
    is_union,
    parse_value,
    set_dotted,
)
from bertforge.errors import ConfigError

# The namespace attribute holding the typed values of the config flags given, as a nested dict.
CONFIG_VALUES = "config_values"
TRUE_WORDS, FALSE_WORDS = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
SCALARS = (int, float, str)
METAVARS = {int: "N", float: "X", str: "TEXT"}
LIST_METAVARS = {int: "N,N", float: "X,X", str: "A,B"}


# `bertforge pretrain`'s common settings, shown first in --help: PretrainConfig key -> its flag. Each is also
# spelled as its field's own flag (--data-dir, --out-dir).
PRETRAIN_FLAGS = {
    "data_dir": "--data", "tokenizer": "--tokenizer", "arch": "--arch", "model": "--model",
    "objective": "--objective",
    "training.out_dir": "--out", "training.minutes": "--minutes", "training.budget_clock": "--budget-clock",
    "training.schedule": "--schedule",
    "training.warmup_ratio": "--warmup-ratio", "masking.mlm_probability": "--mask-rate",
    "training.steps": "--steps", "training.batch_size": "--batch-size",
    "training.grad_accumulation": "--grad-accumulation", "training.lr": "--lr", "training.optimizer": "--optimizer",
    "training.precision": "--precision", "training.device": "--device", "training.seed": "--seed",
    "training.resume": "--resume", "masking.whole_word_masking": "--whole-word-masking",
    "pack_sequences": "--pack-sequences",
}

# `bertforge finetune`'s common settings, shown first in --help: FinetuneConfig key -> its flag (also spelled
# as its field's own flag: --out-dir, --text-a-column, --classifier-hidden-sizes).
FINETUNE_FLAGS = {
    "data.task": "--task", "data.format": "--format", "data.train": "--train", "data.dev": "--dev",
    "model": "--model", "training.out_dir": "--out", "data.text_a_column": "--text-a",
    "data.text_b_column": "--text-b", "data.label_column": "--label", "training.epochs": "--epochs",
    "training.batch_size": "--batch-size", "training.lr": "--lr", "training.warmup_ratio": "--warmup-ratio",
    "features.max_seq_length": "--max-seq-length", "training.seed": "--seed", "seeds": "--seeds",
    "training.device": "--device", "training.precision": "--precision", "data.train_limit": "--train-limit",
    "data.dev_limit": "--dev-limit", "data.data_root": "--data-root", "head.freeze_encoder": "--freeze-encoder",
    "head.feature_layers": "--feature-layers", "head.classifier_hidden_sizes": "--classifier-hidden",
    "head.fresh_head": "--fresh-head", "training.resume": "--resume",
}


def read_bool(text: str) -> bool:
    word = text.strip().lower()
    if word in TRUE_WORDS + FALSE_WORDS:
        return word in TRUE_WORDS
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def bool_or(words: tuple[str, ...]) -> Callable[[str], Any]:
    """Text -> one of `words` as it is, else a bool (`read_bool`)."""
    def read(text: str) -> Any:
        return text.strip().lower() if text.strip().lower() in words else read_bool(text)

    return read


def scalar_reader(kinds: tuple[type, ...]) -> Callable[[str], Any]:
    """Text -> the first of `kinds` (int, float, str) that reads it; a lone kind is its own reader."""
    if len(kinds) == 1:
        return kinds[0]

    def read(text: str) -> Any:
        for kind in kinds:
            try:
                return kind(text)
            except ValueError:
                continue
        raise argparse.ArgumentTypeError(f"expected {' or '.join(k.__name__ for k in kinds)}, got {text!r}")

    return read


def list_reader(item: type) -> Callable[[str], list]:
    """One argument of a list flag -> its items: comma-separated, or a TOML array."""

    def read(text: str) -> list:
        if text.lstrip().startswith("["):
            value = parse_value(text)
            if not isinstance(value, list):
                raise argparse.ArgumentTypeError(f"expected a TOML array such as [\"a\", \"b\"], got {text!r}")
            return value
        try:
            return [item(part.strip()) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {item.__name__}s, got {text!r}") from None

    return read


@dataclass(frozen=True)
class FlagKind:
    """How a field's flag reads the command line: argparse's `type=`, `nargs` and `metavar`."""

    read: Callable[[str], Any]
    metavar: str
    nargs: str | None = None  # "?": a bool's optional word; "+": a list's arguments


def flag_kind(hint: Any) -> FlagKind | None:
    """How a field annotated `hint` is read from the command line; None: it has no flag (a dict, a table)."""
    options = tuple(a for a in typing.get_args(hint) if a is not type(None)) if is_union(hint) else (hint,)
    if len(options) == 1 and options[0] is bool:
        return FlagKind(read_bool, "BOOL", "?")
    words = [word for option in options if typing.get_origin(option) is typing.Literal
             for word in typing.get_args(option)]
    if bool in options and len(options) == 2 and words:  # `bool | Literal["auto"]`: a bool, or one of the words
        return FlagKind(bool_or(tuple(words)), "|".join(["BOOL", *words]), "?")
    if len(options) == 1 and typing.get_origin(options[0]) is list:
        (item,) = typing.get_args(options[0]) or (str,)
        return FlagKind(list_reader(item), LIST_METAVARS[item], "+") if item in SCALARS else None
    if options and all(kind in SCALARS for kind in options):
        return FlagKind(scalar_reader(options), "TEXT" if str in options else METAVARS[options[0]])
    return None


class ConfigFlag(argparse.Action):
    """Sets config key `key` (dotted) to the flag's typed value in `namespace.config_values`, and at the flag's
    own dest for readers of the namespace (`args.out`). A bool flag given bare sets true (`const`); with
    `nargs=0` the flag takes no value and sets `const` (`--no-dev` -> data.dev = "")."""

    def __init__(self, option_strings: Sequence[str], dest: str, key: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.key = key

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if self.nargs == 0 or values is None:
            value = self.const
        elif self.nargs == "+":
            value = [item for argument in values for item in argument]  # `1,2 3` -> [1, 2, 3]
        else:
            value = values
        setattr(namespace, self.dest, value)
        tree = getattr(namespace, CONFIG_VALUES, None)
        if tree is None:
            tree = {}
            setattr(namespace, CONFIG_VALUES, tree)
        set_dotted(tree, self.key, value)


def config_values(args: argparse.Namespace) -> dict[str, Any]:
    """The typed values the config flags of a parsed command line gave, as a nested dict (a copy)."""
    return copy.deepcopy(getattr(args, CONFIG_VALUES, None) or {})


@dataclass(frozen=True)
class ConfigField:
    """One field of a run config or of one of its tables, as the command line sees it."""

    key: str  # dotted: "training.lr", or "model" at the top level
    table: str  # "training", or "" at the top level
    owner: type  # the dataclass the field belongs to
    name: str
    hint: Any
    default: Any  # the value a run gets when nothing sets it (None: none to show)

    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def config_fields(cls: type) -> list[ConfigField]:
    """The fields of run config `cls`: its own (top level) first, then each table's, in declaration order."""
    hints = typing.get_type_hints(cls)
    top, tables = [], []
    for item in dataclasses.fields(cls):
        nested = dataclass_of(hints[item.name])
        if nested is None:
            top.append(ConfigField(item.name, "", cls, item.name, hints[item.name], default_of(item)))
        else:
            tables.append((item.name, nested, default_of(item)))
    for title, nested, instance in tables:
        nested_hints = typing.get_type_hints(nested)
        for item in dataclasses.fields(nested):
            default = getattr(instance, item.name) if instance is not None else default_of(item)
            top.append(ConfigField(f"{title}.{item.name}", title, nested, item.name, nested_hints[item.name], default))
    return top


def default_of(item: dataclasses.Field) -> Any:
    """A field's default value (its factory's product), or None when it has none or the factory refuses."""
    if item.default is not dataclasses.MISSING:
        return item.default
    if item.default_factory is not dataclasses.MISSING:
        try:
            return item.default_factory()
        except (ConfigError, TypeError, ValueError):  # a table that needs settings to exist shows no defaults
            return None
    return None


def default_note(value: Any) -> str:
    if value is None or value == "" or dataclasses.is_dataclass(value):
        return ""
    if isinstance(value, list | tuple):
        return f" (default {','.join(str(v) for v in value)})" if value else ""
    return f" (default {json.dumps(value, ensure_ascii=False)})"


def field_flag_help(field: ConfigField) -> str:
    """The help a field's flag shows: the field's declared help text, then its default."""
    return field_help(declared_field(field.owner, field.name)) + default_note(field.default)


def add_field_flag(container: Any, names: Sequence[str], field: ConfigField, note: str = "") -> None:
    """Add to `container` (a parser or an argument group) the flag `names` setting `field`; `note` follows
    the help text."""
    kind = flag_kind(field.hint)
    if kind is None:
        raise TypeError(f"{field.key}: a {field.hint} field has no flag; set it with --{field.key}=value")
    choices = field_choices(declared_field(field.owner, field.name)) or None
    extra = {"const": True} if kind.nargs == "?" else {}
    container.add_argument(*names, action=ConfigFlag, key=field.key, type=kind.read, nargs=kind.nargs,
                           choices=choices, metavar=None if choices else kind.metavar,
                           help=(field_flag_help(field) + note).replace("%", "%%"), **extra)


def add_config_flags(parser: argparse.ArgumentParser, cls: type, common: Mapping[str, str] | None = None) -> None:
    """One flag per field of run config `cls` and of its tables. The `common` ones ({key: flag}, e.g.
    {"training.out_dir": "--out"}) come first, in the parser's own group and in their order, each also
    spelled as its field's own flag (`--out-dir`); every other field follows under its table's heading,
    named after the field (`--eval-every` sets training.eval_every). Dict fields are left to
    `--section.key=value`."""
    fields = {field.key: field for field in config_fields(cls)}
    for key, flag in (common or {}).items():
        field = fields.pop(key)
        own = field.flag()
        add_field_flag(parser, [flag] if own in (flag, *parser._option_string_actions) else [flag, own], field)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for field in fields.values():
        # A field whose flag another field took first (the same name in two tables) keeps --table.key=value.
        if field.flag() in parser._option_string_actions or flag_kind(field.hint) is None:
            continue
        if field.table not in groups:
            groups[field.table] = parser.add_argument_group(f"[{field.table}] settings" if field.table
                                                            else "run settings")
        add_field_flag(groups[field.table], [field.flag()], field)


def field_of(cls: type, name: str, key: str) -> ConfigField:
    """Field `name` of dataclass `cls`, set at `key` (for flags outside a run config: evaluate's reader)."""
    return ConfigField(key, key.rpartition(".")[0], cls, name, typing.get_type_hints(cls)[name], None)


def add_engine_flags(parser: argparse.ArgumentParser, *, device_help: str = "auto, cpu, cuda or cuda:N") -> None:
    """How a command that runs a model runs it: `--device`, `--precision`, `--engine`, `--threads`, each with the
    one default and the one rule of every such command (`engine.build.plan_engine`)."""
    from bertforge.engine.build import DEFAULT_KIND, KINDS
    from bertforge.runtime import DEFAULT_PRECISION, PRECISIONS

    parser.add_argument("--device", default="auto", help=f"{device_help} (default auto: cuda when available)")
    parser.add_argument("--precision", default=DEFAULT_PRECISION, choices=PRECISIONS,
                        help=f"default {DEFAULT_PRECISION}, the precision evaluate scores at; auto = bf16 on a CUDA "
                             "GPU with bf16 support, else fp32; int8: the CPU only")
    parser.add_argument("--engine", default=DEFAULT_KIND, choices=KINDS,
                        help=f"what runs the model (default {DEFAULT_KIND}: onnxruntime for fp32 on a CPU where the "
                             "export extra is installed, else torch): " + ", ".join(KINDS))
    parser.add_argument("--threads", type=int, help="the CPU's intra-op threads (default: every core this process "
                                                    "may use, or OMP_NUM_THREADS; reported either way)")
