"""The command line end to end on a small slice of the bundled corpus: the README's commands work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bertforge.cli import main

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
    # Flags, flat keys (--progress, --doc-stride) and dotted keys (--training.log_every) all reached the run.
    record = json.loads((tmp_path / "ft" / "best" / "finetuning.json").read_text())
    assert (record["max_seq_length"], record["doc_stride"], record["text_a_column"]) == (16, 8, "text_a")
    run = json.loads((tmp_path / "ft" / "eval_results.json").read_text())["config"]
    assert (run["training"]["epochs"], run["training"]["batch_size"], run["training"]["log_every"]) == (1.0, 8, 2)
    assert run["training"]["progress"] is False and run["data"]["format"] == "classification"


def test_cli_finetune_rejects_unknown_flat_key(tmp_path, capsys):
    code = main(["finetune", "--format", "classification", "--train", str(tmp_path / "t.tsv"), "--lrr=1e-5"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown key 'lrr'" in err and "did you mean 'lr'" in err


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
    argv = ["finetune", "--task", "sst2", "--progress", "false", "--seeds", "1", "2", "--freeze-encoder",
            "--training.lr", "-1e-5", "--eval-every=10"]
    joined = join_unknown_values(parser, argv)
    assert joined == ["finetune", "--task", "sst2", "--progress=false", "--seeds", "1", "2", "--freeze-encoder",
                      "--training.lr=-1e-5", "--eval-every=10"]
    args, extra = parser.parse_known_args(joined)
    assert args.run_file is None and args.task == "sst2"
    assert extra == ["--progress=false", "--training.lr=-1e-5", "--eval-every=10"]
    assert join_unknown_values(parser, ["predict", "--x", "y"]) == ["predict", "--x", "y"]
