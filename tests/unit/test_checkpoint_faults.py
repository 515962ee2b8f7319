"""Saves killed at every step: a run killed anywhere inside a checkpoint save or a `best/` replace leaves a
complete `best/` and a complete latest checkpoint, its next start removes every temporary directory, and the
resumed run ends exactly where an uninterrupted one does. Plus a full disk (one clear error, the old
checkpoint intact), the two-rename fallback where the exchange is unavailable, and a real `kill -9`.

A kill is simulated in-process: every file-system step a save takes (mkdir, file writes through storage,
safetensors and torch.save, fsync, chmod, rename, the exchange, rmtree) is counted, and from step k on each
raises `Killed`, a BaseException no handler of the package catches, so no cleanup runs either: what is on
disk is what a kill -9 at that instant leaves (with a torn, half-written file where the step was a write).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from test_training_loop import single_thread  # noqa: F401  (autouse fixture)
from test_training_recipes import (
    Objective,
    ScriptedEval,
    Source,
    config_for,
    tiny_classifier,
    train_values,
)

from bertforge import checkpoint_format, storage
from bertforge.checkpoint_format import load_model
from bertforge.errors import CheckpointError
from bertforge.families.classification import BertForSequenceClassification
from bertforge.storage import TEMPORARY_NAME
from bertforge.training import checkpoint as training_checkpoint
from bertforge.training import recipes, resume
from bertforge.training.checkpoint import find_latest, list_checkpoints, load_training_state
from bertforge.training.logging import read_metrics
from bertforge.training.loop import train
from bertforge.training.recipes import BestCheckpoint

SCORES = {2: 0.1, 4: 0.5, 6: 0.9}  # every evaluation is a new best: each one replaces best/
SETTINGS = dict(steps=6, eval_every=2, save_every=2, keep_last=1)
KILLED_SAVE = 4  # the evaluation and checkpoint whose saves are killed (best/ exists from step 2)


class Killed(BaseException):
    """The process died at this step: nothing after it runs, no `except` or `finally` of the package cleans."""


class Faults:
    """Counts the file-system steps of a run (with the save they belong to) and kills it at step `kill_at`."""

    def __init__(self, monkeypatch, kill_at: int | None = None, torn: bool = False):
        self.kill_at, self.torn, self.dead = kill_at, torn, False
        self.steps: list[tuple[str, str]] = []  # (save, step name)
        self.save = "-"
        patch = monkeypatch.setattr
        for owner, name in ((os, "mkdir"), (os, "rename"), (os, "replace"), (os, "fsync"), (os, "chmod"),
                            (storage, "exchange"), (shutil, "rmtree")):
            patch(owner, name, self.step(name, getattr(owner, name)))
        patch(storage, "open", self.step("open", open), raising=False)  # the files storage writes
        patch(checkpoint_format, "save_file", self.step("save_file", checkpoint_format.save_file, torn=True))
        patch(torch, "save", self.step("torch.save", torch.save, torn=True))
        patch(recipes.BestKeeper, "keep", self.named("best", recipes.BestKeeper.keep))
        patch(resume, "save_checkpoint", self.named("checkpoint", resume.save_checkpoint))

    def step(self, name, function, torn: bool = False):
        def counted(*args, **kwargs):
            if self.dead:
                raise Killed(name)
            if self.kill_at == len(self.steps):
                self.dead = True
                if torn and self.torn:
                    function(*args, **kwargs)  # written, then cut: the kill came in the middle of the write
                    target = Path(args[1])
                    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
                raise Killed(name)
            self.steps.append((self.save, name))
            return function(*args, **kwargs)

        return counted

    def named(self, save, function):
        def marked(*args, **kwargs):
            step = args[2] if save == "best" else args[1]
            self.save = f"{save}@{step}"
            try:
                return function(*args, **kwargs)
            finally:
                self.save = "-"

        return marked


def run(root: Path, faults: Faults | None = None, resume: str = "never", seed: int = 0):
    evaluation = ScriptedEval(SCORES)
    result = train(tiny_classifier(seed=seed), Source(3, 4), Objective(),
                   config_for(root / "run", resume=resume, **SETTINGS), eval_fn=evaluation,
                   best=BestCheckpoint("score", False, root / "run" / "best"))
    return result, evaluation


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if TEMPORARY_NAME.match(p.name))


def weights_of(directory: Path) -> dict[str, torch.Tensor]:
    model, _ = load_model(directory, BertForSequenceClassification)  # checksums verified
    return model.state_dict()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run: its final weights, best/, losses and per-step evaluation weights."""
    root = tmp_path_factory.mktemp("reference")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in every test here (single_thread): the same reductions, the same bits
    try:
        result, evaluation = run(root)
    finally:
        torch.set_num_threads(threads)
    return {"root": root, "result": result, "evaluated": evaluation.weights,
            "losses": train_values(read_metrics(root / "run"), "loss"),
            "final": weights_of(find_latest(root / "run")), "best": weights_of(root / "run" / "best")}


def save_steps(monkeypatch, tmp_path) -> list[tuple[str, str]]:
    """The file-system steps of the uninterrupted run, each with the save it belongs to."""
    with monkeypatch.context() as patched:
        faults = Faults(patched)
        run(tmp_path / "count")
    return faults.steps


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def kill_at(tmp_path, monkeypatch, reference, k: int, torn: bool) -> tuple[Path, tuple[int, int], list[str]]:
    """Kill the run at step k and check what is on disk: (run directory, (latest checkpoint's step, best/'s
    step), the temporaries left)."""
    root = tmp_path / f"kill-{k}"
    with monkeypatch.context() as patched:
        Faults(patched, kill_at=k, torn=torn)
        with pytest.raises(Killed):
            run(root)
    out = root / "run"
    # A complete best/ (the old evaluation's or the new one's, never a mix) and a complete latest checkpoint.
    best = weights_of(out / "best")
    best_step = next((s for s in (2, KILLED_SAVE) if same(best, reference["evaluated"][s])), None)
    assert best_step is not None, f"kill at {k}: best/ holds neither evaluation's model"
    latest = find_latest(out)
    assert latest is not None, f"kill at {k}: no complete checkpoint"
    saved_step = load_training_state(latest)["step"]
    assert saved_step in (2, KILLED_SAVE)
    weights_of(latest)
    return out, (saved_step, best_step), temporaries(out)


def resume_exactly(out: Path, reference, saved_step: int, k: int) -> None:
    """The next start removes every temporary, and the run ends where the uninterrupted one does, bit for bit."""
    resumed, _ = run(out.parent, resume="auto", seed=5)
    assert temporaries(out) == [], f"kill at {k}: {temporaries(out)} survived the next start"
    assert resumed.start_step == saved_step
    assert same(weights_of(find_latest(out)), reference["final"]), f"kill at {k}: final weights differ"
    assert same(weights_of(out / "best"), reference["best"]) and resumed.best_step == 6
    assert train_values(read_metrics(out), "loss") == reference["losses"]


@pytest.mark.parametrize("resume_every_kill", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["resume-per-outcome", "resume-every-kill"])
def test_checkpoint_faults_kill_at_every_step_of_a_save_leaves_complete_best_and_checkpoint(
        tmp_path, monkeypatch, reference, resume_every_kill):
    steps = save_steps(monkeypatch, tmp_path)
    window = [i for i, (save, _) in enumerate(steps) if save in (f"best@{KILLED_SAVE}", f"checkpoint@{KILLED_SAVE}")]
    names = {steps[i][1] for i in window}
    # Every kind of step is in the sweep, the exchange that replaces best/ and the prune's rename included.
    assert {"save_file", "torch.save", "fsync", "exchange", "rename", "rmtree", "open", "mkdir"} <= names, names
    outcomes, leftovers = {}, 0
    for k in window:
        out, outcome, left = kill_at(tmp_path, monkeypatch, reference, k, torn=steps[k][1] in ("save_file", "torch.save"))
        leftovers += bool(left)
        if resume_every_kill or outcome not in outcomes:
            resume_exactly(out, reference, outcome[0], k)
        else:  # the same files on disk as a kill already resumed: the start's cleanup alone
            training_checkpoint.tidy_run_directory(out)
            assert temporaries(out) == [], f"kill at {k}: {temporaries(out)} survived the cleanup"
        outcomes.setdefault(outcome, k)
    # Killed before, inside and after each save's one rename: old and new best/, old and new checkpoint.
    assert set(outcomes) == {(2, 2), (2, KILLED_SAVE), (KILLED_SAVE, KILLED_SAVE)}, outcomes
    assert leftovers >= len(window) // 2, "the kills left no temporaries: the sweep would not show the cleanup"


def test_checkpoint_faults_two_rename_fallback_restores_best_caught_between_renames(tmp_path, monkeypatch, reference):
    # Where renameat2's exchange is unavailable (another OS, NFS), replacing best/ takes two renames; a kill
    # between them leaves no best/ until the next start puts the old one back.
    monkeypatch.setattr(storage, "exchange", lambda a, b: False)
    steps = save_steps(monkeypatch, tmp_path)
    renames = [i for i, (save, name) in enumerate(steps) if save == f"best@{KILLED_SAVE}" and name == "rename"]
    assert len(renames) == 2
    root = tmp_path / "between"
    with monkeypatch.context() as patched:
        Faults(patched, kill_at=renames[1])
        with pytest.raises(Killed):
            run(root)
    out = root / "run"
    assert not (out / "best").exists() and [n for n in temporaries(out) if ".old-" in n]
    resumed, _ = run(root, resume="auto", seed=5)
    assert temporaries(out) == [] and same(weights_of(out / "best"), reference["best"]) and resumed.best_step == 6
    assert same(weights_of(find_latest(out)), reference["final"])


@pytest.mark.parametrize(("save", "nth", "failure"), [
    ("best", 3, SafetensorError("Error while serializing: IoError(No space left on device)")),
    ("checkpoint", 4, OSError(errno.ENOSPC, "No space left on device")),
])
def test_checkpoint_faults_full_disk_is_one_error_and_keeps_the_old_best_and_checkpoint(tmp_path, monkeypatch, save,
                                                                                        nth, failure):
    # Weights are written 1: best/ at step 2, 2: checkpoint 2, 3: best/ at step 4, 4: checkpoint 4.
    calls, real = [], checkpoint_format.save_file

    def full_disk(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == nth:
            raise failure
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint_format, "save_file", full_disk)
    with pytest.raises(CheckpointError) as info:
        run(tmp_path)
    monkeypatch.undo()
    message = str(info.value)
    assert "\n" not in message and "No space left on device" in message and "free disk space" in message
    out = tmp_path / "run"
    assert [s for s, _ in list_checkpoints(out)] == [2] and temporaries(out) == []
    assert load_training_state(find_latest(out))["step"] == 2
    weights_of(out / "best")


def test_checkpoint_faults_full_disk_in_the_cli_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    from bertforge.cli import main

    source = tmp_path / "model"
    tiny_classifier().save_pretrained(source)
    destination = tmp_path / "converted"
    shutil.copytree(source, destination)
    before = {p.name: p.read_bytes() for p in destination.iterdir()}

    def full_disk(*args, **kwargs):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")

    monkeypatch.setattr(checkpoint_format, "save_file", full_disk)
    code = main(["convert", str(source), "--out", str(destination)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "could not write the model directory" in err[0] and "StorageFull" in err[0]
    assert {p.name: p.read_bytes() for p in destination.iterdir()} == before and temporaries(tmp_path) == []


def test_checkpoint_faults_next_start_removes_only_our_temporaries(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    ours = [".best.tmp-999999999-0123456789ab", ".checkpoint-000004.del-999999999-abcdef012345"]
    theirs = [".cache", "best.tmp-1-0123456789ab", ".best.tmp-1-0123", ".notes.txt", "checkpoint-tmp"]
    for name in ours + theirs:
        (out / name).mkdir()
    (out / ".best.tmp-999999999-0123456789ab" / "model.safetensors").write_bytes(b"x" * 100)
    alive = f".best.tmp-{os.getppid()}-00000000000a"  # a live process's save in flight: left alone
    (out / alive).mkdir()
    removed = training_checkpoint.tidy_run_directory(out)
    assert sorted(p.name for p in removed) == sorted(ours)
    assert sorted(p.name for p in out.iterdir()) == sorted(theirs + [alive])


# --- a real kill -9 ---------------------------------------------------------------------------------------

KILL_LOOP = textwrap.dedent("""
    import json, os, random, signal, sys, time
    import torch
    torch.set_num_threads(1)
    from bertforge.checkpoint_format import load_model, save_model
    from bertforge.families.classification import BertForSequenceClassification
    from bertforge.model.config import BertConfig
    from bertforge.storage import TEMPORARY_NAME, remove_stale_temporaries

    out, kills = sys.argv[1], int(sys.argv[2])
    config = BertConfig(vocab_size=8000, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=512, id2label={0: "a", 1: "b"})
    model = BertForSequenceClassification(config)
    best = os.path.join(out, "best")
    save_model(model, best)
    random.seed(0)
    seen = {"loaded": 0, "leftovers": 0, "versions": set()}
    for kill in range(kills):
        child = os.fork()
        if child == 0:  # saves best/ again and again, each a new version, until killed
            version = kill * 1000
            while True:
                version += 1
                with torch.no_grad():
                    model.classifier.bias.fill_(version)
                save_model(model, best)
        time.sleep(random.uniform(0.02, 0.3))
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        loaded, _ = load_model(best, BertForSequenceClassification)  # complete, checksum verified
        seen["versions"].add(loaded.classifier.bias[0].item())
        seen["loaded"] += 1
        seen["leftovers"] += len(remove_stale_temporaries(out))
        assert not [n for n in os.listdir(out) if TEMPORARY_NAME.match(n)]
    print(json.dumps({**seen, "versions": len(seen["versions"])}))
""")


def test_checkpoint_faults_kill_9_during_saves_never_loses_best(tmp_path):
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", KILL_LOOP, str(tmp_path), "12"], capture_output=True, text=True,
                          timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["loaded"] == 12 and seen["versions"] >= 2, seen
