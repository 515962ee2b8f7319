"""The command line end to end on a small slice of the bundled corpus: the README's commands work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bertforge.cli import main
from bertforge.cli.flags import config_fields, flag_kind
from bertforge.configuration import declared_field, field_help
from bertforge.training.finetune_config import FinetuneConfig
from bertforge.training.pretraining import PretrainConfig

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "data" / "demo" / "en" / "jekyll_and_hyde.txt"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """vocab -> prepare -> pretrain (tiny, a few steps), shared by the tests below."""
    root = tmp_path_factory.mktemp("cli")
    corpus = root / "corpus.txt"
    corpus.write_text(BOOK.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    assert main(["vocab", "--corpus", str(corpus), "--vocab-size", "600", "--out", str(root / "vocab")]) == 0
    assert main(["prepare", "--corpus", str(corpus), "--tokenizer", str(root / "vocab"), "--out",
                 str(root / "data"), "--max-seq-length", "64", "--heldout-documents", "1"]) == 0
    assert main(["pretrain", "--data", str(root / "data"), "--model", "tiny", "--out", str(root / "run"),
                 "--steps", "4", "--batch-size", "8", "--device", "cpu", "--training.log_every=2",
                 "--training.progress=false", "--training.eval_every=4"]) == 0
    return root


def test_cli_pretrain_writes_checkpoint_and_metrics(workspace):
    checkpoint = workspace / "run" / "checkpoint-000004"
    assert (checkpoint / "model.safetensors").exists() and (checkpoint / "vocab.txt").exists()
    events = [json.loads(line) for line in (workspace / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {e["split"] for e in events} >= {"train", "eval"}
    assert all("mlm_acc" in e["values"] for e in events if e["split"] == "eval")


def test_cli_predict_fill_mask_reads_stdin(workspace, tmp_path):
    inputs = tmp_path / "in.txt"
    inputs.write_text("the [MASK] was dark.\n\n{\"text\": \"he [MASK] the door.\", \"id\": 7}\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    code = main(["predict", "--model", str(workspace / "run" / "checkpoint-000004"), "--task", "fill-mask",
                 "--input", str(inputs), "--output", str(out), "--device", "cpu", "--precision", "fp32"])
    assert code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and rows[1]["id"] == 7
    assert len(rows[0]["masks"][0]["predictions"]) == 5


def test_cli_finetune_own_files(workspace, tmp_path):
    rows = ["text_a\tlabel"] + [f"{'good' if i % 2 else 'bad'} day number {i}\t{'pos' if i % 2 else 'neg'}"
                                for i in range(40)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (tmp_path / "dev.tsv").write_text("\n".join(rows[:11]) + "\n", encoding="utf-8")
    code = main(["finetune", "--format", "classification", "--train", str(tmp_path / "train.tsv"), "--dev",
                 str(tmp_path / "dev.tsv"), "--text-a", "text_a", "--label", "label", "--model",
                 str(workspace / "run" / "checkpoint-000004"), "--out", str(tmp_path / "ft"), "--epochs", "1",
                 "--batch-size", "8", "--device", "cpu", "--max-seq-length", "16", "--progress=false",
                 "--training.log_every=2", "--doc-stride", "8", "--features.tag_scheme=BIO"])
    assert code == 0
    config = json.loads(next((tmp_path / "ft").rglob("config.json")).read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert set(config["id2label"].values()) == {"neg", "pos"}
    # Common flags, field flags (--progress, --doc-stride) and dotted keys (--training.log_every) all reached
    # the run.
    record = json.loads((tmp_path / "ft" / "best" / "finetuning.json").read_text())
    assert (record["inputs"]["max_seq_length"], record["inputs"]["doc_stride"]) == (16, 8)
    assert record["reader"]["text_a_column"] == "text_a"
    run = json.loads((tmp_path / "ft" / "eval_results.json").read_text())["config"]
    assert (run["training"]["epochs"], run["training"]["batch_size"], run["training"]["log_every"]) == (1.0, 8, 2)
    assert run["training"]["progress"] is False and run["data"]["format"] == "classification"


def test_cli_finetune_rejects_unknown_key_naming_the_valid_ones(tmp_path, capsys):
    code = main(["finetune", "--format", "classification", "--train", str(tmp_path / "t.tsv"), "--training.lrr=1e-5"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown key 'training.lrr'" in err and "lr, warmup_steps" in err
    assert len(err.strip().splitlines()) == 1


def test_cli_user_error_is_one_line(tmp_path, capsys):
    code = main(["pretrain", "--data", str(tmp_path / "missing"), "--model", "tiny", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("bertforge pretrain: error:") and "\n" not in err and "Traceback" not in err


def test_cli_rejects_unknown_override(tmp_path, capsys):
    code = main(["pretrain", "--data", str(tmp_path), "--model", "tiny", "--training.no_such_key=3"])
    assert code == 2
    assert "no_such_key" in capsys.readouterr().err


def test_cli_module_entry_point_prints_help():
    result = subprocess.run([sys.executable, "-m", "bertforge", "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "pretrain" in result.stdout and "finetune" in result.stdout


def test_cli_overrides_accept_every_spelling():
    from bertforge.cli import split_overrides

    assert split_overrides(["--doc-stride", "64", "--tag-scheme=IOBES", "--training.lr=5e-5", "--freeze-encoder",
                            "--feature-layers", "[-1, -2]"]) == [
        "doc_stride=64", "tag_scheme=IOBES", "training.lr=5e-5", "freeze_encoder=true", "feature_layers=[-1, -2]"]


def test_cli_unknown_key_value_is_an_override_not_a_run_file():
    from bertforge.cli import build_parser, join_unknown_values

    parser = build_parser()
    argv = ["finetune", "--task", "sst2", "--training.progress", "false", "--seeds", "1", "2", "--freeze-encoder",
            "--training.lr", "-1e-5", "--data.header=true", "--progress", "--eval-every", "10"]
    joined = join_unknown_values(parser, argv)
    assert joined == ["finetune", "--task", "sst2", "--training.progress=false", "--seeds", "1", "2",
                      "--freeze-encoder", "--training.lr=-1e-5", "--data.header=true", "--progress", "--eval-every",
                      "10"]
    args, extra = parser.parse_known_args(joined)
    assert args.run_file is None and args.task == "sst2"
    assert extra == ["--training.progress=false", "--training.lr=-1e-5", "--data.header=true"]
    assert args.config_values == {"data": {"task": "sst2"}, "seeds": [1, 2], "head": {"freeze_encoder": True},
                                  "training": {"progress": True, "eval_every": 10}}
    assert join_unknown_values(parser, ["predict", "--x", "y"]) == ["predict", "--x", "y"]


def subcommand(name: str):
    from bertforge.cli import build_parser

    return next(a for a in build_parser()._actions if a.dest == "command").choices[name]


def config_flags(parser) -> dict[str, object]:
    """The flags of a subcommand that read a config key's value, by that key (not --no-dev, which sets one)."""
    from bertforge.cli.flags import ConfigFlag

    return {action.key: action for action in parser._actions if isinstance(action, ConfigFlag) and action.nargs != 0}


@pytest.mark.parametrize("command, cls", [("finetune", FinetuneConfig), ("pretrain", PretrainConfig)])
def test_cli_every_config_field_has_a_flag_with_its_declared_help(command, cls):
    # FinetuneTrainingConfig redeclares some TrainingConfig fields for their defaults: their help is the base's.
    flags = config_flags(subcommand(command))
    fields = [field for field in config_fields(cls) if flag_kind(field.hint) is not None]
    assert {field.key for field in fields} <= set(flags)
    for field in fields:
        declared = field_help(declared_field(field.owner, field.name))
        shown = flags[field.key].help.replace("%%", "%")
        assert declared, f"{field.key} has no help text: declare it with configuration.setting(default, help)"
        rest = shown.removeprefix(declared)
        assert shown.startswith(declared) and (rest == "" or (rest.startswith(" (default ") and rest.endswith(")")))
        assert field.flag() in flags[field.key].option_strings
    # Only dict fields (PretrainConfig.model_overrides) are left to --section.key=value.
    assert {f.key for f in config_fields(cls)} - {f.key for f in fields} <= {"model_overrides"}


def test_cli_no_generated_flag_has_an_empty_help():
    from bertforge.cli.flags import ConfigFlag

    for command in ("finetune", "pretrain", "evaluate"):
        for action in subcommand(command)._actions:
            if not isinstance(action, ConfigFlag):
                continue
            text = (action.help or "").strip()
            assert text and not text.startswith("(default"), f"{command} {action.option_strings}: {text!r}"


def test_cli_finetune_help_lists_every_common_option():
    finetune = subcommand("finetune")
    text = finetune.format_help()
    documented = ["--steps", "--grad-accumulation", "--metric", "--labels", "--header", "--file-format", "--device",
                  "--doc-stride", "--tag-scheme", "--label-policy", "--activation-checkpointing", "--eval-every",
                  "--save-every", "--keep-last", "--no-dev", "--progress", "--on-invalid", "--max-answer-length"]
    assert all(f"  {flag} " in text or f", {flag} " in text for flag in documented), text
    assert "cuda:N" in text and "every epoch" in text
    # The short spellings keep their field's own flag beside them.
    flags = set(finetune._option_string_actions)
    assert {"--out", "--out-dir", "--text-a", "--text-a-column", "--label", "--label-column",
            "--classifier-hidden", "--classifier-hidden-sizes", "--seeds", "--no-dev"} <= flags
    assert {"--data", "--data-dir", "--out", "--out-dir", "--whole-word-masking", "--mlm-probability"} <= set(
        subcommand("pretrain")._option_string_actions)


def parse_finetune(*argv: str):
    from bertforge.cli import build_parser, finetune_config, join_unknown_values

    parser = build_parser()
    args, extra = parser.parse_known_args(join_unknown_values(parser, ["finetune", *argv]))
    return args, extra, finetune_config(args, extra)


def test_cli_generated_flags_reach_the_config():
    args, extra, config = parse_finetune(
        "--format", "ner", "--train", "t.txt", "--steps", "7", "--grad-accumulation", "2", "--labels", "O,B-PER,I-PER",
        "--header", "false", "--file-format", "csv", "--doc-stride", "16", "--tag-scheme", "IOBES", "--label-policy",
        "all", "--activation-checkpointing", "--eval-every", "3", "--save-every", "5", "--keep-last", "1", "--metric",
        "f1", "--progress", "false", "--no-dev", "--device", "cuda:1", "--betas", "0.9,0.98")
    assert extra == []
    assert (config.training.steps, config.training.grad_accumulation, config.training.eval_every,
            config.training.save_every, config.training.keep_last) == (7, 2, 3, 5, 1)
    assert config.data.labels == ["O", "B-PER", "I-PER"] and config.data.header is False
    assert (config.data.file_format, config.data.dev, config.metric, config.training.device) == ("csv", "", "f1",
                                                                                              "cuda:1")
    assert (config.features.doc_stride, config.features.tag_scheme, config.features.label_policy) == (16, "IOBES",
                                                                                                      "all")
    assert config.training.activation_checkpointing is True and config.training.progress is False
    assert config.training.betas == [0.9, 0.98]
    pretrain = subcommand("pretrain")
    for value, expected in (("false", False), ("true", True)):
        parsed, _ = pretrain.parse_known_args(["--progress", value])
        assert parsed.config_values == {"training": {"progress": expected}}
    parsed, _ = pretrain.parse_known_args(["--whole-word-masking", "--data", "d", "--out", "o"])
    assert parsed.config_values == {"masking": {"whole_word_masking": True}, "data_dir": "d",
                                    "training": {"out_dir": "o"}}
    assert (parsed.data, parsed.out) == ("d", "o")  # the flag's own dest keeps its value too


def test_cli_flags_give_typed_values_without_a_toml_round_trip():
    # Each flag's text is read once, by its field's type: a string stays the text given (TOML would read
    # `1e5` as a float, `true` as a bool, `"x"` as x), an int | str column is an index when it is an integer.
    args, extra, config = parse_finetune(
        "--task", "sst2", "--text-a", "1e5", "--text-b", "3", "--label", '"label"', "--metric", "true",
        "--separator", "[x]", "--seeds", "1,2", "3", "--feature-layers", "-1", "-2", "--classifier-hidden=256,128",
        "--class-weights", "1", "2.5", "--labels", '["a,b", "c"]', "--freeze-encoder", "--fresh-head", "false",
        "--lr", "2e-5", "--epochs", "2")
    assert extra == []
    assert args.config_values["data"] == {"task": "sst2", "text_a_column": "1e5", "text_b_column": 3,
                                          "label_column": '"label"', "separator": "[x]", "labels": ["a,b", "c"]}
    assert (config.data.text_a_column, config.data.text_b_column, config.data.label_column) == ("1e5", 3, '"label"')
    assert config.metric == "true" and config.data.separator == "[x]" and config.data.labels == ["a,b", "c"]
    assert config.seeds == [1, 2, 3] and config.head.feature_layers == [-1, -2]
    assert config.head.classifier_hidden_sizes == [256, 128] and config.head.class_weights == [1.0, 2.5]
    assert config.head.freeze_encoder is True and config.head.fresh_head is False
    assert (config.training.lr, config.training.epochs) == (2e-5, 2.0)
    assert all(type(v) is int for v in config.seeds) and isinstance(config.training.epochs, float)


def test_cli_flags_refuse_a_value_of_the_wrong_type_in_one_line(capsys):
    for argv, expected in ((["--steps", "x"], "argument --steps: invalid int value: 'x'"),
                           (["--progress", "maybe"], "argument --progress: expected true or false, got 'maybe'"),
                           (["--seeds", "1,b"], "argument --seeds: expected comma-separated ints, got '1,b'"),
                           (["--precision", "half"], "argument --precision: invalid choice: 'half'")):
        with pytest.raises(SystemExit) as info:
            main(["finetune", "--task", "sst2", *argv])
        err = capsys.readouterr().err
        assert info.value.code == 2 and expected in err and "Traceback" not in err


def test_cli_pretrain_accepts_progress_false_and_prints_a_summary(workspace, tmp_path, capsys):
    code = main(["pretrain", "--data", str(workspace / "data"), "--model", "tiny", "--out", str(tmp_path / "run"),
                 "--steps", "2", "--batch-size", "8", "--device", "cpu", "--progress", "false",
                 "--training.log_every=1", "--eval-every", "2"])
    out = capsys.readouterr().out
    assert code == 0 and "TrainResult(" not in out
    assert out.startswith("trained to step 2 of 2 in ") and "final loss " in out and "eval " in out
    assert f"checkpoint {tmp_path / 'run' / 'checkpoint-000002'}" in out


def sentiment_files(folder: Path) -> tuple[Path, Path]:
    rows = ["text_a\tlabel"] + [f"{'good' if i % 2 else 'bad'} day number {i}\t{'pos' if i % 2 else 'neg'}"
                                for i in range(16)]
    (folder / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    renamed = ["review\tsentiment"] + rows[1:9]
    (folder / "reviews.tsv").write_text("\n".join(renamed) + "\n", encoding="utf-8")
    return folder / "train.tsv", folder / "reviews.tsv"


def finetune_argv(workspace, train: Path, out: Path, *extra: str) -> list[str]:
    return ["finetune", "--format", "classification", "--train", str(train), "--model",
            str(workspace / "run" / "checkpoint-000004"), "--out", str(out), "--steps", "2", "--batch-size", "8",
            "--device", "cpu", "--max-seq-length", "16", "--progress", "false", *extra]


def test_cli_finetune_resume_auto_and_evaluate_column_flags(workspace, tmp_path, capsys):
    train, reviews = sentiment_files(tmp_path)
    out = tmp_path / "ft"
    assert main(finetune_argv(workspace, train, out, "--dev", str(train), "--resume", "auto")) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"resume auto: no checkpoint in {out}, started a fresh run\n")
    assert "best dev accuracy=" in printed
    results = (out / "eval_results.json").read_bytes()
    assert main(finetune_argv(workspace, train, out, "--dev", str(train), "--resume", "auto")) == 0
    again = capsys.readouterr().out
    assert again.startswith(f"already complete: {out / 'checkpoint-000002'} is step 2 of 2; nothing trained")
    assert printed.splitlines()[1] == again.splitlines()[1]  # the same best dev line, read back
    assert (out / "eval_results.json").read_bytes() == results

    # evaluate on a file with other column names: --text-a / --label name them.
    assert main(["evaluate", "--model", str(out / "best"), "--data", str(reviews), "--out", str(tmp_path / "ev"),
                 "--text-a", "review", "--label", "sentiment", "--device", "cpu"]) == 0
    assert "accuracy: " in capsys.readouterr().out
    assert len((tmp_path / "ev" / "predictions.jsonl").read_text().splitlines()) == 8


def test_cli_finetune_refuses_bad_metric_and_missing_dev_before_training(workspace, tmp_path, capsys):
    train, _ = sentiment_files(tmp_path)
    assert main(finetune_argv(workspace, train, tmp_path / "a", "--dev", str(train), "--metric", "bogus")) == 2
    err = capsys.readouterr().err
    assert "metric='bogus' is invalid" in err and "'accuracy'" in err
    assert main(finetune_argv(workspace, train, tmp_path / "b")) == 2
    assert "no dev file to evaluate on" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert main(finetune_argv(workspace, train, tmp_path / "c", "--no-dev")) == 0
    out = capsys.readouterr().out
    assert "best dev" not in out
    assert f"classification: trained 2 steps without evaluation (no dev set); final model saved to " \
           f"{tmp_path / 'c' / 'best'}" in out


def test_cli_predict_bad_files_are_one_clear_line(tmp_path, capsys, tiny_minilm_model):
    latin1, good = tmp_path / "latin1.txt", tmp_path / "ok.txt"
    latin1.write_bytes(b"caf\xe9 au lait\n")
    good.write_text("hello\n", encoding="utf-8")
    cases = [
        (["--model", str(tmp_path / "nonexistent"), "--input", str(good)], "not a model directory"),
        (["--model", str(tiny_minilm_model), "--input", str(tmp_path / "missing.txt")], "missing.txt: file not found"),
        (["--model", str(tiny_minilm_model), "--input", str(latin1)], "latin1.txt:1: not UTF-8 text"),
        (["--model", str(tiny_minilm_model), "--input", str(good), "--output", str(tmp_path / "no" / "out.jsonl")],
         "does not exist; create it"),
    ]
    for extra, expected in cases:
        assert main(["predict", "--task", "embed", "--device", "cpu", *extra]) == 2
        err = capsys.readouterr().err
        assert expected in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err



def test_cli_leaves_the_process_group_a_command_joined(tmp_path, monkeypatch):
    # A gloo group left to the interpreter's exit aborted a finished torchrun rank now and then (SIGABRT,
    # "terminate called without an active exception"); `main` leaves it once a command has succeeded.
    import argparse

    import torch.distributed as dist

    from bertforge import cli

    cli.leave_process_group()  # nothing joined: nothing to do

    def joins(args, extra):  # a command that trains under torchrun joins the group
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)

    parser = argparse.ArgumentParser()
    parser.add_argument("command")
    parser.add_argument("--verbose", action="store_true")
    parser.set_defaults(func=joins)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    try:
        assert cli.main(["joins"]) == 0
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
