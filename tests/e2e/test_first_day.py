"""What a new user types on the first day, through the real command line: evaluate with the fine-tuning flags
typed again, evaluate --limit, label maps that are not label ids, a new head from `from_pretrained`.
The model is the saved pair classifier of tests/fixtures/saved_v1 (a tiny random model with its vocabulary)."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.errors import ConfigError
from bertforge.families.classification import BertForSequenceClassification
from bertforge.inference.pipelines import load_pipeline

PAIR = Path(__file__).resolve().parents[1] / "fixtures" / "saved_v1" / "pair"
RUN = ["--device", "cpu", "--precision", "fp32"]


@pytest.fixture
def pair(tmp_path) -> tuple[Path, Path]:
    shutil.copytree(PAIR, tmp_path / "pair")
    return tmp_path / "pair" / "model", tmp_path / "pair" / "data.tsv"


def evaluate(model: Path, data: Path, out: Path, *flags: str) -> int:
    return main(["evaluate", "--model", str(model), "--data", str(data), "--out", str(out), *RUN, *flags])


def test_evaluate_accepts_the_fine_tuning_format_flags_typed_again(pair, tmp_path, capsys):
    model, data = pair
    code = evaluate(model, data, tmp_path / "eval", "--format", "pair", "--text-a", "text_a", "--text-b", "text_b",
                    "--label", "label")
    assert code == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["examples"] == 32


@pytest.mark.parametrize("flags", [["--format", "classification"], ["--format", "ner"], ["--task", "sst2"]])
def test_evaluate_another_format_says_the_model_already_knows_its_format(pair, tmp_path, capsys, flags):
    model, data = pair
    assert evaluate(model, data, tmp_path / "eval", *flags) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{flags[0]} {flags[1]}: the model already knows its format" in err
    assert "format pair (classification, single_label_classification)" in err and f"drop {flags[0]}" in err
    assert not (tmp_path / "eval").exists()


def test_evaluate_limit_scores_the_first_n_examples(pair, tmp_path, capsys):
    model, data = pair
    assert evaluate(model, data, tmp_path / "eval", "--limit", "5") == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["examples"] == 5
    assert len((tmp_path / "eval" / "predictions.jsonl").read_text().splitlines()) == 5


def with_label_keys(model: Path, id2label: dict) -> None:
    config = json.loads((model / "config.json").read_text())
    config["id2label"] = id2label
    config.pop("label2id", None)
    (model / "config.json").write_text(json.dumps(config))


LABEL_KEYS_ERROR = "config.json: BertConfig.id2label={'x': 'neg', 'y': 'pos'} is invalid: give the label ids 0..N-1"


def test_id2label_with_keys_that_are_not_ids_is_one_error_in_python_predict_and_evaluate(pair, tmp_path, capsys):
    model, data = pair
    with_label_keys(model, {"x": "neg", "y": "pos"})
    with pytest.raises(ConfigError, match=r"config\.json: BertConfig\.id2label=.*give the label ids 0\.\.N-1") as info:
        load_pipeline(model, "classify")
    assert str(model) in str(info.value)
    lines = tmp_path / "in.txt"
    lines.write_text("the movie was fun\n")
    for argv in (["predict", "--model", str(model), "--task", "classify", "--input", str(lines), *RUN],
                 ["evaluate", "--model", str(model), "--data", str(data), "--out", str(tmp_path / "e"), *RUN],
                 ["serve", "--model", str(model), "--port", "1", *RUN]):
        assert main(argv) == 2, argv[0]
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and LABEL_KEYS_ERROR in err and str(model) in err, (argv[0], err)


def test_id2label_missing_is_served_as_label_n_with_a_warning_as_serving_md_says(pair, caplog):
    model, _ = pair
    config = json.loads((model / "config.json").read_text())
    for key in ("id2label", "label2id"):
        config.pop(key)
    (model / "config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING):
        result = load_pipeline(model, "classify")(["the film was fun"])[0]
    assert set(result["scores"]) == {"LABEL_0", "LABEL_1"}
    assert any("no id2label" in r.getMessage() and str(model) in r.getMessage() for r in caplog.records)
    serving = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text()
    assert "answers with `LABEL_0`, `LABEL_1`, ... and a warning" in serving


def test_from_pretrained_num_labels_makes_a_new_head_and_says_so(pair, caplog):
    model, _ = pair
    with caplog.at_level(logging.WARNING):
        loaded = BertForSequenceClassification.from_pretrained(model, num_labels=3)
    assert loaded.config.label_names == ["LABEL_0", "LABEL_1", "LABEL_2"]
    assert loaded(torch.tensor([[2, 3]])).logits.shape == (1, 3)
    assert any("num_labels=3: a new head of 3 labels" in r.getMessage() for r in caplog.records)
    same = BertForSequenceClassification.from_pretrained(model, num_labels=2)
    assert same.config.label_names == ["neg", "pos"]  # as many labels as saved: the saved head and names
    with pytest.raises(ConfigError, match="num_labels=0 is invalid"):
        BertForSequenceClassification.from_pretrained(model, num_labels=0)


# --- fine-tuning: the loss figures, the test split, a vocabulary that does not cover the text ----------------

def msra_root(root: Path) -> Path:
    """A data root with msra_ner's two files (one character and its tag per line), 40 and 20 sentences."""
    sentence = [("张", "B-PER"), ("三", "I-PER"), ("在", "O"), ("北", "B-LOC"), ("京", "I-LOC"), ("工", "O"), ("作", "O")]
    block = "".join(f"{char}\t{tag}\n" for char, tag in sentence) + "\n"
    (root / "msra_ner").mkdir(parents=True)
    (root / "msra_ner" / "train.tsv").write_text(block * 40, encoding="utf-8")
    (root / "msra_ner" / "test.tsv").write_text(block * 20, encoding="utf-8")
    return root


def test_finetune_crf_progress_and_event_lines_agree_and_the_test_split_is_announced_and_limited(
        tiny_minilm_model, tmp_path, caplog):
    root = msra_root(tmp_path / "data")
    with caplog.at_level(logging.INFO):
        code = main(["finetune", "--task", "msra_ner", "--data-root", str(root), "--model", str(tiny_minilm_model),
                     "--crf", "--steps", "4", "--log-every", "2", "--dev-limit", "3", "--batch-size", "4",
                     "--max-seq-length", "16", "--out", str(tmp_path / "run"), *RUN])
    assert code == 0, caplog.text
    for step in (2, 4):  # "loss" is one figure on both lines; the last step's own is step_loss
        progress = re.search(rf"step {step}/4 \(\d+%\) loss=(\S+) step_loss=\S+", caplog.text)
        event = re.search(rf"step {step} train: loss=(\S+) loss_crf_nll=", caplog.text)
        assert progress and event and progress.group(1) == event.group(1), caplog.text
    test_file = root / "msra_ner" / "test.tsv"
    assert (f"msra_ner: scoring the best model on the test split ({test_file}): 3 examples of 20 (--dev-limit 3); "
            "--evaluate-test false skips this") in caplog.text
    assert "msra_ner test (3 examples)" in caplog.text
    assert caplog.text.index("scoring the best model on the test split") > caplog.text.index("finished 4 steps")


def text_file(path: Path, texts: list[str]) -> Path:
    path.write_text("text\tlabel\n" + "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(texts)), encoding="utf-8")
    return path


CHINESE = ["这部电影的剧情非常精彩演员表演也很出色", "服务态度很差房间也不干净下次不会再来了", "酒店位置很好交通方便早餐丰富"] * 8
ENGLISH = ["the movie was wonderful and the actors were great", "the room was dirty and the staff was rude"] * 12


@pytest.mark.parametrize(("texts", "warned"), [(CHINESE, 1), (ENGLISH, 0)])
def test_finetune_and_evaluate_warn_once_when_the_vocabulary_does_not_cover_the_text(
        tiny_minilm_model, tmp_path, caplog, texts, warned):
    data = text_file(tmp_path / "data.tsv", texts)
    flags = ["--text-a", "text", "--label", "label"]
    with caplog.at_level(logging.WARNING):
        assert main(["finetune", "--format", "classification", "--train", str(data), "--dev", str(data), *flags,
                     "--model", str(tiny_minilm_model), "--steps", "1", "--batch-size", "4", "--max-seq-length", "32",
                     "--out", str(tmp_path / "run"), *RUN]) == 0
    unknown = [r.getMessage() for r in caplog.records if "[UNK]" in r.getMessage()]
    assert len(unknown) == warned, unknown
    if warned:
        assert unknown[0].startswith("classification train: ") and "does not cover this text's language" in unknown[0]
        assert "chinese_L-12_H-768_A-12" in unknown[0] and "bertforge convert" in unknown[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert evaluate(tmp_path / "run" / "best", data, tmp_path / "eval") == 0
    unknown = [r.getMessage() for r in caplog.records if "[UNK]" in r.getMessage()]
    assert len(unknown) == warned and all(m.startswith(f"{data}: ") for m in unknown), unknown


def test_vocabulary_coverage_counts_unknown_among_text_tokens_only():
    from types import SimpleNamespace

    from bertforge.data.vocabulary_coverage import unknown_share

    tokenizer = SimpleNamespace(unk_token_id=1, all_special_ids=[0, 1, 2, 3, 4])
    features = [SimpleNamespace(input_ids=[2, 1, 7, 8, 3, 0, 0]), SimpleNamespace(input_ids=[[2, 1, 1, 3], [2, 9, 3, 0]])]
    assert unknown_share(features, tokenizer) == (3 / 6, 6)  # [CLS], [SEP], [PAD] are not text; [UNK] is
    ragged = [SimpleNamespace(input_ids=[[2, 1, 3], [2, 9, 8, 3]])]  # choices of different lengths
    assert unknown_share(ragged, tokenizer) == (1 / 3, 3)
