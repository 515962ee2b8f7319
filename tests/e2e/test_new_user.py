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


def test_new_user_labels_given_that_the_file_does_not_use_name_the_file_labels(tiny_minilm_model, tmp_path, capsys):
    data = tmp_path / "pairs.tsv"
    data.write_text("text_a\ttext_b\tlabel\na b\tc d\t0\ne f\tg h\t1\n", encoding="utf-8")
    code = main(["finetune", "--format", "pair", "--train", str(data), "--dev", str(data), "--labels", "yes,no",
                 "--model", str(tiny_minilm_model), "--out", str(tmp_path / "run")])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(error) == 1
    assert "not among the labels given with --labels" in error[0] and "--labels 0,1" in error[0]
    assert "never seen in training" not in error[0]


def test_new_user_a_bad_flag_value_is_one_line_naming_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_code:
        main(["finetune", "--task", "sst2", "--model", str(tmp_path), "--lr", "abc"])
    error = capsys.readouterr().err.strip().splitlines()
    assert exit_code.value.code == 2 and len(error) == 1 and "--lr: invalid float value: 'abc'" in error[0]
    assert main(["finetune", "--task", "sst2", "--model", str(tmp_path), "--epochs", "-1"]) == 2
    error = capsys.readouterr().err.strip()
    assert "the command line: --epochs (finetune.training.epochs)=-1.0 is invalid" in error
    assert "defaults" not in error


def test_new_user_demo_keeps_its_budget_and_says_the_cost(tmp_path):
    from bertforge.demo import DEFAULT_MINUTES, LEARNING_STEPS, StepCost, announce_plan, plan_demo, run_demo
    from bertforge.errors import ConfigError

    # the busy machine of issue 48 (1.6 s a step): the default budget is kept, with fewer steps, said up front
    plan = plan_demo(60 * DEFAULT_MINUTES, 30.0, StepCost(1.612, 12.0, threads=2), books=4)
    assert plan.total <= 60 * DEFAULT_MINUTES and plan.steps < LEARNING_STEPS
    said = announce_plan(plan, "tiny", 1_000_000, started_at=0.0)
    assert f"about {plan.total / 60:.1f} min in all" in said and "--minutes " in said
    with pytest.raises(ConfigError, match="--minutes 0 is not a time budget"):  # before any work
        run_demo(out=tmp_path / "demo", minutes=0)
    assert not (tmp_path / "demo").exists()


def test_new_user_usual_jsonl_shape_reads_without_flags(tiny_minilm_model, tmp_path, capsys):
    rows = ['{"text": "John lives in Paris.", "labels": ["LOC", "PER"]}', '{"text": "It rained.", "labels": []}',
            '{"text": "Acme hired Mary.", "labels": ["ORG", "PER"]}', '{"text": "Berlin is big.", "labels": ["LOC"]}']
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(rows * 2) + "\n", encoding="utf-8")
    assert main(["finetune", "--format", "multilabel", "--train", str(data), "--dev", str(data), "--model",
                 str(tiny_minilm_model), "--out", str(tmp_path / "run"), "--epochs", "1", "--batch-size", "4"]) == 0
    capsys.readouterr()
    other = tmp_path / "other.jsonl"
    other.write_text('{"body": "x", "labels": ["LOC"]}\n', encoding="utf-8")
    assert main(["finetune", "--format", "multilabel", "--train", str(other), "--dev", str(other), "--model",
                 str(tiny_minilm_model), "--out", str(tmp_path / "run2")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "keys ['body', 'labels']" in error[0] and "--text-a" in error[0]
