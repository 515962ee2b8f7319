"""Run files and overrides: TOML into nested dataclasses, strict keys, TOML-literal override values, typed
values from the command line's flags, and the help metadata of config fields."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from bertforge.configuration import (
    declared_field,
    dumps_toml,
    field_choices,
    field_help,
    load_config,
    parse_override,
    setting,
)
from bertforge.errors import ConfigError
from bertforge.training.config import TrainingConfig


@dataclass
class Inner:
    rate: float = 0.5
    names: list[str] = field(default_factory=list)
    flag: bool = False


@dataclass
class Outer:
    name: str = "x"
    size: int = 3
    label: str | None = None
    inner: Inner = field(default_factory=Inner)
    training: TrainingConfig = field(default_factory=TrainingConfig)


def write(tmp_path, text: str):
    path = tmp_path / "run.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_load_config_reads_nested_tables(tmp_path):
    path = write(tmp_path, 'name = "run"\n[inner]\nrate = 2\nnames = ["a", "b"]\n[training]\nlr = 5e-5\nsteps = 10\n')
    config = load_config(Outer, path)
    assert config.name == "run" and config.size == 3
    assert config.inner == Inner(rate=2.0, names=["a", "b"])
    assert isinstance(config.inner.rate, float)
    assert config.training.lr == 5e-5 and config.training.steps == 10


def test_load_config_defaults_without_file():
    assert load_config(Outer) == Outer()


def test_load_config_overrides_parse_toml_literals_with_string_fallback(tmp_path):
    path = write(tmp_path, "[training]\nlr = 1e-4\n")
    config = load_config(Outer, path, ["--training.lr=3e-5", "--inner.flag=true", "inner.names=[\"p\"]",
                                       "--name=plain text", "--training.betas=[0.9, 0.98]", "--label=7e"])
    assert config.training.lr == 3e-5
    assert config.inner.flag is True and config.inner.names == ["p"]
    assert config.name == "plain text" and config.label == "7e"
    assert config.training.betas == [0.9, 0.98]


def test_load_config_later_override_wins():
    assert load_config(Outer, overrides=["--size=1", "--size=2"]).size == 2


@pytest.mark.parametrize("override, named, listed", [
    ("--training.lrr=1", "training.lrr", "lr, warmup_steps"),
    ("--sise=1", "sise", "name, size, label, [inner], [training]"),
    ("--trainin.lr=1", "trainin", "[training]"),
])
def test_load_config_rejects_unknown_key_and_lists_valid_ones(override, named, listed):
    with pytest.raises(ConfigError) as info:
        load_config(Outer, overrides=[override])
    assert repr(named) in str(info.value)
    assert listed in str(info.value)


def test_load_config_unknown_key_in_file_names_the_file(tmp_path):
    path = write(tmp_path, "[inner]\nrat = 1.0\n")
    with pytest.raises(ConfigError, match=r"run\.toml: unknown key 'inner\.rat' in \[inner\]; valid keys are rate"):
        load_config(Outer, path)


@pytest.mark.parametrize("override", ["--size=1.5", "--size=\"3\"", "--inner.flag=1", "--inner.names=[1]",
                                      "--size=true"])
def test_load_config_rejects_values_of_the_wrong_kind(override):
    with pytest.raises(ConfigError, match="does not fit the field's type"):
        load_config(Outer, overrides=[override])


def test_load_config_section_given_a_value_is_an_error():
    with pytest.raises(ConfigError, match="'inner' is a section"):
        load_config(Outer, overrides=["--inner=3"])


def test_load_config_component_validation_becomes_config_error(tmp_path):
    path = write(tmp_path, "[training]\nlr = -1.0\n")
    with pytest.raises(ConfigError, match=r"run\.toml: training\.lr=-1\.0 is invalid"):
        load_config(Outer, path)


def test_load_config_reports_toml_syntax_error_with_line(tmp_path):
    path = write(tmp_path, "name = 'a'\nsize = = 3\n")
    with pytest.raises(ConfigError, match=r"not valid TOML.*line 2"):
        load_config(Outer, path)


def test_load_config_missing_file_is_config_error(tmp_path):
    with pytest.raises(ConfigError, match="run file not found"):
        load_config(Outer, tmp_path / "absent.toml")


def test_parse_override_requires_equals():
    with pytest.raises(ConfigError, match="no '='"):
        parse_override("--training.lr")
    assert parse_override("a.b=") == ("a.b", "")


def test_dumps_toml_round_trips(tmp_path):
    config = load_config(Outer, overrides=['--name=a "quoted"\\path', "--inner.names=[\"x\", \"y\"]",
                                           "--training.resume=auto", "--training.lr=2.5e-05"])
    path = write(tmp_path, dumps_toml(config))
    assert load_config(Outer, path) == config


def test_load_config_values_apply_between_the_file_and_the_overrides(tmp_path):
    path = write(tmp_path, 'name = "file"\nsize = 1\n[inner]\nrate = 0.1\n')
    config = load_config(Outer, path, ["--size=3"], values={"size": 2, "label": "1e5", "inner": {"flag": True}})
    assert (config.name, config.size, config.label) == ("file", 3, "1e5")  # a typed string stays a string
    assert config.inner == Inner(rate=0.1, flag=True)


def test_load_config_values_of_the_wrong_type_are_refused():
    with pytest.raises(ConfigError, match="size = '3' .* does not fit the field's type int"):
        load_config(Outer, values={"size": "3"})


@dataclass
class Described:
    mode: str = setting("fast", "how to run", choices=("fast", "slow"))
    sizes: list[int] = setting(help="widths", factory=lambda: [1, 2])
    plain: int = 0


@dataclass
class Redeclared(Described):
    mode: str = "slow"  # a new default only: the help and choices stay Described's


def test_setting_declares_help_choices_and_fresh_defaults():
    fields = {f.name: f for f in dataclasses.fields(Described)}
    assert (field_help(fields["mode"]), field_choices(fields["mode"])) == ("how to run", ("fast", "slow"))
    assert (field_help(fields["plain"]), field_choices(fields["plain"])) == ("", ())
    first, second = Described(), Described()
    assert first.sizes == [1, 2] and first.sizes is not second.sizes


def test_declared_field_of_a_redeclared_field_is_the_base_classes():
    item = declared_field(Redeclared, "mode")
    assert field_help(item) == "how to run" and field_choices(item) == ("fast", "slow")
    assert Redeclared().mode == "slow"
    assert declared_field(Redeclared, "plain").name == "plain"
    with pytest.raises(KeyError, match="no field 'absent'"):
        declared_field(Redeclared, "absent")
