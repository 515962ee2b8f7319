"""What a new user hit (issue #23), each as they would meet it on the command line: an option that cannot apply to
the run's family, kind or device is refused before any work, in one line naming the flag and why."""

from __future__ import annotations

import pytest

from bertforge.cli import main

ROWS = "text\tlabels\nJohn lives in Paris.\tLOC,PER\nIt rained.\t\nAcme hired Mary.\tORG,PER\n"


@pytest.fixture
def multilabel(tmp_path):
    path = tmp_path / "types.tsv"
    path.write_text(ROWS, encoding="utf-8")
    return path


@pytest.mark.parametrize("flags, named, why", [
    (["--crf"], "--crf (finetune.head.crf)", "applies to tagging"),
    (["--balanced-class-weights"], "--balanced-class-weights", "applies to single label classification and tagging"),
    (["--focal-gamma", "2"], "--focal-gamma", "applies to single label classification and tagging"),
    (["--max-answer-length", "10"], "--max-answer-length", "applies to question_answering"),
    (["--pooling", "cls"], "--pooling", "applies to embedding"),
])
def test_new_user_option_of_another_family_is_refused_before_loading(tmp_path, multilabel, capsys, flags, named, why):
    # The model path does not exist: the refusal comes before the model (or the data) is read.
    code = main(["finetune", "--format", "multilabel", "--train", str(multilabel), "--dev", str(multilabel),
                 "--text-a", "text", "--label", "labels", "--model", str(tmp_path / "no-model"),
                 "--out", str(tmp_path / "run"), *flags])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(error) == 1
    assert named in error[0] and why in error[0] and "multi label classification" in error[0]


def test_new_user_fp16_on_a_cpu_is_refused(tmp_path, multilabel, capsys):
    code = main(["finetune", "--format", "multilabel", "--train", str(multilabel), "--dev", str(multilabel),
                 "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "run"), "--precision", "fp16",
                 "--device", "cpu"])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(error) == 1 and "fp16 needs a CUDA GPU" in error[0] and "--precision" in error[0]


def test_new_user_predict_fp16_on_a_cpu_is_refused(tiny_minilm_model, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("hello\n", encoding="utf-8")
    code = main(["predict", "--model", str(tiny_minilm_model), "--task", "embed", "--input", str(source),
                 "--device", "cpu", "--precision", "fp16"])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "fp16 needs a CUDA GPU" in error[-1]
