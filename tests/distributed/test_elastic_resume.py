"""Resume on another world size: a 4-process run killed mid-way resumes on 2 processes, which are killed too
and resume on 1; over the whole run every step takes exactly the examples of the uninterrupted 4-process
run, and the losses (the final one included) equal its losses within fp32 noise. Pretraining and
fine-tuning.

The kills are `BERTFORGE_FAULT=STEP` (every rank SIGKILLs itself after that step, which is between two
checkpoints, so the steps after the last checkpoint are trained again after the resume); the examples are
recorded with `BERTFORGE_RECORD_EXAMPLES` (`data.datasets.record_examples`: one line per batch and rank).
The batch size stays as given; the accumulation adapts on resume (4 processes x batch B = 2 x B x 2 =
1 x B x 4), as `training.resume.keep_global_batch` says.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch import (
    environment,
    finetune_args,
    finish,
    largest_difference,
    make_classification_data,
    make_pretraining_data,
    pretrain_args,
    run_here,
    start_standalone,
    train_losses,
)

from bertforge.data.datasets import RECORD_ENV
from bertforge.training.checkpoint import find_latest, load_training_state

pytestmark = pytest.mark.slow  # five torchrun launches (up to 4 workers on 2 cores) per test

STEPS = 12
TOLERANCE = 1e-5  # fp32: the same examples per step, summed in another order and accumulation split


def records(folder: Path, world: int, accumulation: int) -> list[list]:
    """Every step's examples over all ranks, sorted, from the record files of one launch."""
    lines = [[json.loads(line) for line in (folder / f"examples-rank{r}.jsonl").read_text().splitlines()]
             for r in range(world)]
    count = min(len(rank_lines) for rank_lines in lines) // accumulation
    return [sorted((line["epoch"], i) for rank_lines in lines
                   for line in rank_lines[s * accumulation:(s + 1) * accumulation] for i in line["ids"])
            for s in range(count)]


def launch(args: list[str], processes: int, folder: Path, fault: int | None) -> int:
    """One torchrun launch recording its examples in `folder`; killed after step `fault` when given."""
    folder.mkdir()
    extra = {RECORD_ENV: str(folder), **({"BERTFORGE_FAULT": str(fault)} if fault else {})}
    (code, output), = finish([start_standalone(processes, args, env=environment(**extra))])
    assert (code != 0) == (fault is not None), output[-4000:]
    return code


def interrupted_run(args: list[str], out: Path, tmp_path: Path, monkeypatch, faults: tuple[int, int]) -> list:
    """4 processes killed after faults[0], 2 killed after faults[1], then 1 to the end; the steps' examples."""
    steps: list = []
    for processes, fault, name in ((4, faults[0], "four"), (2, faults[1], "two")):
        launch(args, processes, tmp_path / name, fault)
        saved = load_training_state(find_latest(out))
        accumulation = 4 // processes
        steps += records(tmp_path / name, processes, accumulation)[:saved["step"] - len(steps)]
        assert len(steps) == saved["step"] < fault  # the steps after the checkpoint are trained again
    (tmp_path / "one").mkdir()
    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "one"))
    run_here(args)
    return steps + records(tmp_path / "one", 1, 4)


def check_same_run(uninterrupted: list, interrupted: list, out_a: Path, out_b: Path, keys: tuple[str, ...],
                   what: str) -> None:
    assert len(uninterrupted) == len(interrupted) == STEPS
    assert interrupted == uninterrupted  # step by step, so over the whole run too
    losses_a, losses_b = train_losses(out_a), train_losses(out_b)
    difference = largest_difference(losses_a, losses_b, keys)
    final = abs(losses_a[STEPS]["loss"] - losses_b[STEPS]["loss"])
    print(f"{what}: 4 -> 2 -> 1 processes vs 4 uninterrupted, {STEPS} steps, examples identical; largest |delta| "
          f"of the logged losses {difference:.3g}, final loss {losses_b[STEPS]['loss']:.6f} (|delta| {final:.3g})")
    assert difference <= TOLERANCE


def test_elastic_resume_pretraining_4_to_2_to_1_processes_sees_the_uninterrupted_examples(
        tmp_path_factory, tmp_path, monkeypatch):
    data = make_pretraining_data(tmp_path_factory.mktemp("elastic"))
    # 283 instances in steps of 32: an epoch of 8 steps, so the run crosses an epoch end on 1 process.
    args = pretrain_args(data, tmp_path / "run", STEPS, 8, "--training.save_every=4", "--training.keep_last=0",
                         "--resume", "auto")
    reference = pretrain_args(data, tmp_path / "reference", STEPS, 8)
    launch(reference, 4, tmp_path / "uninterrupted", None)
    uninterrupted = records(tmp_path / "uninterrupted", 4, 1)
    interrupted = interrupted_run(args, tmp_path / "run", tmp_path, monkeypatch, faults=(6, 10))
    check_same_run(uninterrupted, interrupted, tmp_path / "reference", tmp_path / "run",
                   ("loss", "loss_mlm", "loss_nsp"), "pretraining")


def test_elastic_resume_finetuning_4_to_2_to_1_processes_sees_the_uninterrupted_examples(
        tiny_minilm_model, tmp_path, monkeypatch):
    # 70 rows in steps of 16: 4 whole steps and a partial one of 6 per epoch, so the run crosses two epoch
    # ends (each one evaluated and saved besides the checkpoints every 4 steps).
    train, dev = make_classification_data(tmp_path)
    common = ("--steps", str(STEPS), "--training.save_every=4", "--training.keep_last=0")
    args = finetune_args(tiny_minilm_model, train, dev, tmp_path / "run", 4, *common, "--resume", "auto")
    reference = finetune_args(tiny_minilm_model, train, dev, tmp_path / "reference", 4, *common)
    launch(reference, 4, tmp_path / "uninterrupted", None)
    uninterrupted = records(tmp_path / "uninterrupted", 4, 1)
    interrupted = interrupted_run(args, tmp_path / "run", tmp_path, monkeypatch, faults=(7, 11))
    check_same_run(uninterrupted, interrupted, tmp_path / "reference", tmp_path / "run", ("loss",), "fine-tuning")
    evaluations = [json.loads((tmp_path / name / "eval_results.json").read_text())["history"]
                   for name in ("reference", "run")]
    assert [e["step"] for e in evaluations[0]] == [e["step"] for e in evaluations[1]] == [5, 10, 12]
    for a, b in zip(*evaluations, strict=True):
        assert a["metrics"] == pytest.approx(b["metrics"], abs=TOLERANCE)
