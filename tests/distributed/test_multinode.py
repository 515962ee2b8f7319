"""Multi-node launch: two torchrun "nodes" of one process each on localhost, meeting through c10d rendezvous
(`torchrun --nnodes 2 --node_rank i --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint ...`, as
docs/pretraining.md shows for a cluster), train exactly like one process with the same global batch: the
same loss at every one of 20 steps (|delta| <= 1e-6, or 4 float32 ulps for a loss above 4), for
pretraining and for fine-tuning (dropout 0: the ranks' random streams differ). Each rank logs its place
once; only rank 0 writes checkpoints and results.
"""

from __future__ import annotations

import json
import os
import re

import pytest
from launch import (
    beyond_tolerance,
    finetune_args,
    largest_difference,
    make_classification_data,
    make_pretraining_data,
    pretrain_args,
    run_here,
    run_nodes,
    train_losses,
)

STEPS = 20
# fp32: the same examples per step, only the order of summation differs: |delta| <= 1e-6, or 4 units of
# float32's last place where that is more (a loss near 7, where one unit is 4.8e-7: up to 1.9e-6).
PLACE = re.compile(r"rank (\d) of 2 \(local rank 0, node (\d), host \S+, master \S+:\d+, gloo on cpu\)")


@pytest.fixture(scope="module")
def pretraining_data(tmp_path_factory):
    return make_pretraining_data(tmp_path_factory.mktemp("multinode"))


def check_places(results: list[tuple[int, str]]) -> None:
    """Every rank logged its place once, on its own node."""
    places = [PLACE.findall(output) for _, output in results]
    assert [len(found) for found in places] == [1, 1], [output[-2000:] for _, output in results]
    assert sorted((rank, node) for found in places for rank, node in found) == [("0", "0"), ("1", "1")]


def test_multinode_two_nodes_pretrain_like_one_process_with_the_same_global_batch(pretraining_data, tmp_path):
    results = run_nodes(2, pretrain_args(pretraining_data, tmp_path / "nodes", STEPS, 4))
    run_here(pretrain_args(pretraining_data, tmp_path / "one", STEPS, 8))

    check_places(results)
    nodes, one = train_losses(tmp_path / "nodes"), train_losses(tmp_path / "one")
    keys = ("loss", "loss_mlm", "loss_nsp", "grad_norm")
    print(f"pretraining, 2 nodes x batch 4 vs 1 process x batch 8, {STEPS} steps: largest |delta| "
          + ", ".join(f"{key} {largest_difference(nodes, one, (key,)):.3g}" for key in keys))
    assert not beyond_tolerance(nodes, one, keys)
    assert sorted(p.name for p in (tmp_path / "nodes").glob("checkpoint-*")) == [f"checkpoint-{STEPS:06d}"]


def test_multinode_two_nodes_finetune_like_one_process_with_the_same_global_batch(tiny_minilm_model, tmp_path):
    # 70 rows in steps of 8: an epoch of 8 whole steps and a partial one of 6 (3 per node), so 20 steps
    # cross two epoch ends and two dev evaluations.
    train, dev = make_classification_data(tmp_path)
    common = ("--steps", str(STEPS))
    results = run_nodes(2, finetune_args(tiny_minilm_model, train, dev, tmp_path / "nodes", 4, *common))
    run_here(finetune_args(tiny_minilm_model, train, dev, tmp_path / "one", 8, *common))

    check_places(results)
    nodes, one = train_losses(tmp_path / "nodes"), train_losses(tmp_path / "one")
    keys = ("loss", "grad_norm")
    print(f"fine-tuning, 2 nodes x batch 4 vs 1 process x batch 8, {STEPS} steps: largest |delta| "
          + ", ".join(f"{key} {largest_difference(nodes, one, (key,)):.3g}" for key in keys))
    assert not beyond_tolerance(nodes, one, keys)
    results_nodes = json.loads((tmp_path / "nodes" / "eval_results.json").read_text(encoding="utf-8"))
    results_one = json.loads((tmp_path / "one" / "eval_results.json").read_text(encoding="utf-8"))
    assert [e["step"] for e in results_nodes["history"]] == [e["step"] for e in results_one["history"]] == [9, 18, 20]
    for a, b in zip(results_nodes["history"], results_one["history"], strict=True):
        assert a["metrics"] == pytest.approx(b["metrics"], abs=1e-6)


def test_multinode_slurm_script_torchrun_line_parses(monkeypatch):
    # scripts/slurm_*.sbatch: torchrun's options parse with torchrun's own parser, and the bertforge command
    # with ours, its overrides included (as tests/e2e/test_docs_commands.py checks the docs' commands).
    import shlex
    import sys
    from pathlib import Path

    from torch.distributed.run import get_args_parser

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from test_docs_commands import check_values, command_from, parse, subparsers

    scripts = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("slurm_*.sbatch"))
    assert scripts
    for name, value in {"SLURM_NNODES": "4", "SLURM_JOB_ID": "77", "MASTER_ADDR": "n1", "MASTER_PORT": "29500",
                        "DATA": "runs/en/data", "OUT": "runs/en/pretrain-cluster"}.items():
        monkeypatch.setenv(name, value)
    for script in scripts:
        text = script.read_text(encoding="utf-8").replace("\\\n", " ")
        lines = [line for line in text.splitlines() if "torchrun " in line and not line.lstrip().startswith("#")]
        assert len(lines) == 1, script
        line = os.path.expandvars(lines[0])
        words = shlex.split(line)
        launcher = get_args_parser().parse_args(words[words.index("torchrun") + 1:])
        assert (launcher.nnodes, launcher.rdzv_backend, launcher.rdzv_endpoint) == ("4", "c10d", "n1:29500")
        assert launcher.module and launcher.training_script == "bertforge"
        command = command_from(line[line.index("torchrun"):], script.name, 1, True, set(subparsers()))
        assert command is not None and command.command == "pretrain"
        check_values(command, *parse(command))
