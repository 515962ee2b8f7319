"""The training loop on a tiny BertForPretraining and a synthetic batch source (CPU, fp32, seconds).

The source builds every example from its index alone, with uneven lengths and uneven numbers of masked
tokens, so count normalisation across micro-batches is actually exercised.
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass, fields

import numpy as np
import pytest
import torch

from bertforge.checkpoint_format import load_model
from bertforge.constants import IGNORE_INDEX
from bertforge.errors import ConfigError
from bertforge.families.pretraining import BertForPretraining, Pretraining, PretrainingObjective
from bertforge.model.config import BertConfig
from bertforge.training.checkpoint import find_latest, list_checkpoints, load_training_state
from bertforge.training.config import TrainingConfig
from bertforge.training.logging import read_metrics
from bertforge.training.loop import NonFiniteLossError, train
from bertforge.training.recipes import BestCheckpoint

SEQ_LEN = 16
MASK_SLOTS = 4
VOCAB = 99
LOSS_TOLERANCE = 1e-5  # fp32, same instances split differently: only summation order differs


@pytest.fixture(autouse=True)
def single_thread():
    """One intra-op thread: these models are tiny, and on a busy machine extra threads only spin and wait
    (the module's tests went from under 1 s to over a minute under load without this)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@dataclass
class SyntheticBatch:
    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    attention_mask: torch.Tensor
    mlm_positions: torch.Tensor
    mlm_labels: torch.Tensor
    nsp_labels: torch.Tensor

    def to(self, device):
        return SyntheticBatch(*(getattr(self, f.name).to(device) for f in fields(self)))

    def model_inputs(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def num_tokens(self):
        return int(self.attention_mask.sum())


def make_example(index: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 100_003 + index)
    length = int(torch.randint(6, SEQ_LEN + 1, (1,), generator=g))
    ids = torch.zeros(SEQ_LEN, dtype=torch.long)
    ids[:length] = torch.randint(5, VOCAB, (length,), generator=g)
    types = torch.zeros(SEQ_LEN, dtype=torch.long)
    types[length // 2:length] = 1
    mask = torch.zeros(SEQ_LEN, dtype=torch.long)
    mask[:length] = 1
    real = int(torch.randint(1, MASK_SLOTS + 1, (1,), generator=g))
    positions = torch.zeros(MASK_SLOTS, dtype=torch.long)
    positions[:real] = torch.randperm(length - 2, generator=g)[:real] + 1
    labels = torch.full((MASK_SLOTS,), IGNORE_INDEX, dtype=torch.long)
    labels[:real] = ids[positions[:real]]
    ids[positions[:real]] = 4  # [MASK]
    nsp = torch.randint(0, 2, (), generator=g)
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "mlm_positions": positions,
            "mlm_labels": labels, "nsp_labels": nsp}


class SyntheticSource:
    """`num_batches` batches per epoch; epoch e visits the examples in a seeded permutation.

    With `rank`/`world_size`, global batch j is split into equal slices and this rank yields its slice.
    `make_example` and `batch_class` say what an example and a batch are (other tests subclass it).
    """

    make_example = staticmethod(make_example)
    batch_class = SyntheticBatch

    def __init__(self, num_batches: int, batch_size: int, seed: int = 0, rank: int = 0, world_size: int = 1,
                 fail_after: int | None = None):
        self.num_batches, self.batch_size, self.seed = num_batches, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.index = 0, 0
        self.fail_after = fail_after
        self.yielded = 0

    def __len__(self):
        return self.num_batches

    def __iter__(self):
        global_batch = self.batch_size * self.world_size
        order = np.random.default_rng(self.seed + self.epoch).permutation(self.num_batches * global_batch)
        while self.index < self.num_batches:
            start = self.index * global_batch + self.rank * self.batch_size
            examples = [self.make_example(int(i), self.seed) for i in order[start:start + self.batch_size]]
            self.index += 1
            if self.fail_after is not None and self.yielded >= self.fail_after:
                raise KeyboardInterrupt("simulated interruption")
            self.yielded += 1
            yield self.batch_class(*(torch.stack([e[f.name] for e in examples]) for f in fields(self.batch_class)))
        self.epoch += 1
        self.index = 0

    def state_dict(self):
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state):
        self.epoch, self.index = state["epoch"], state["index"]


def tiny_model(dropout: float = 0.0, seed: int = 0) -> BertForPretraining:
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=SEQ_LEN, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout)
    return BertForPretraining(config)


def config_for(tmp_path, **overrides) -> TrainingConfig:
    values = {"steps": 6, "batch_size": 4, "lr": 1e-3, "warmup_steps": 2, "log_every": 1, "precision": "fp32",
              "device": "cpu", "out_dir": str(tmp_path), "progress": False, "tensorboard": False}
    return TrainingConfig(**{**values, **overrides})


def losses(history, split="train", keys=("loss", "loss_mlm", "loss_nsp", "mlm_acc", "nsp_acc", "grad_norm")):
    return [(e["step"], {k: e["values"][k] for k in keys if k in e["values"]}) for e in history if e["split"] == split]


def test_train_loss_decreases_on_repeated_batches(tmp_path):
    config = config_for(tmp_path, steps=30, warmup_steps=3, lr=3e-3)
    result = train(tiny_model(), SyntheticSource(2, 8), PretrainingObjective(), config)
    history = losses(result.history)
    first, last = history[0][1]["loss"], history[-1][1]["loss"]
    assert result.step == 30 and len(history) == 30
    assert last < 0.8 * first
    assert set(result.train) >= {"loss", "loss_mlm", "loss_nsp", "mlm_acc", "nsp_acc", "lr", "grad_norm",
                                 "tokens_per_s", "epoch"}
    assert result.train["epoch"] == pytest.approx(15.0)


def test_train_grad_accumulation_matches_one_large_batch(tmp_path):
    # Batch 8 in one micro-batch vs 4 + 4 accumulated: the same examples in each step (the source's
    # permutation is over global batches of 8 either way), uneven masked counts between the halves.
    whole = train(tiny_model(), SyntheticSource(3, 8), PretrainingObjective(), config_for(tmp_path / "a"))
    split = train(tiny_model(), SyntheticSource(6, 4, seed=0), PretrainingObjective(),
                  config_for(tmp_path / "b", grad_accumulation=2, batch_size=4))
    assert_same_permutation_halves()
    for (step_a, a), (step_b, b) in zip(losses(whole.history), losses(split.history), strict=True):
        assert step_a == step_b
        for key in a:
            assert a[key] == pytest.approx(b[key], abs=LOSS_TOLERANCE), (step_a, key)


def assert_same_permutation_halves():
    """The accumulation test relies on SyntheticSource(6, 4) visiting SyntheticSource(3, 8)'s batches as halves."""
    big, small = SyntheticSource(3, 8), SyntheticSource(6, 4)
    big_ids = [b.input_ids for b in big]
    small_ids = [b.input_ids for b in small]
    if not all(torch.equal(big_ids[i], torch.cat(small_ids[2 * i:2 * i + 2])) for i in range(3)):
        pytest.fail("synthetic source permutations differ; the comparison would be meaningless")


def test_train_resume_matches_uninterrupted_run_with_dropout(tmp_path):
    steps, save_every, fail_at = 9, 3, 7  # interrupted during step 8; the last checkpoint is step 6
    config = dict(steps=steps, save_every=save_every, keep_last=2, batch_size=4)

    full = train(tiny_model(dropout=0.1), SyntheticSource(4, 4), PretrainingObjective(),
                 config_for(tmp_path / "full", **config))

    run = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        train(tiny_model(dropout=0.1), SyntheticSource(4, 4, fail_after=fail_at), PretrainingObjective(),
              config_for(run, **config))
    assert find_latest(run).name == "checkpoint-000006"
    assert max(e["step"] for e in read_metrics(run)) == 7  # step 7 was logged, then lost with the interruption

    # A fresh process: another model init seed, fresh source; everything must come from the checkpoint.
    resumed = train(tiny_model(dropout=0.1, seed=123), SyntheticSource(4, 4), PretrainingObjective(),
                    config_for(run, resume="auto", **config))
    assert resumed.step == steps and [e["step"] for e in resumed.history] == [7, 8, 9]
    assert losses(read_metrics(run)) == losses(read_metrics(tmp_path / "full"))
    assert losses(resumed.history) == losses(full.history)[6:]
    assert [s for s, _ in list_checkpoints(run)] == [6, 9]


def test_train_resume_with_grad_accumulation_and_mid_window_log(tmp_path):
    # log_every 4 does not divide save_every 3: the partial log window is carried in the checkpoint.
    config = dict(steps=8, save_every=3, log_every=4, grad_accumulation=2, batch_size=2)
    full = train(tiny_model(dropout=0.1), SyntheticSource(5, 2), PretrainingObjective(), config_for(tmp_path / "a", **config))
    with pytest.raises(KeyboardInterrupt):
        train(tiny_model(dropout=0.1), SyntheticSource(5, 2, fail_after=9), PretrainingObjective(),
              config_for(tmp_path / "b", **config))
    resumed = train(tiny_model(dropout=0.1), SyntheticSource(5, 2), PretrainingObjective(),
                    config_for(tmp_path / "b", resume="auto", **config))
    assert losses(read_metrics(tmp_path / "b")) == losses(full.history)
    assert find_latest(tmp_path / "b").name == "checkpoint-000008"
    assert [e["step"] for e in resumed.history] == [4, 8]  # step 4's window began before the checkpoint


def test_train_resume_of_finished_run_returns_at_once(tmp_path):
    config = config_for(tmp_path, steps=2)
    train(tiny_model(), SyntheticSource(2, 4), PretrainingObjective(), config)
    again = train(tiny_model(), SyntheticSource(2, 4), PretrainingObjective(), config_for(tmp_path, steps=2, resume="auto"))
    assert again.step == 2 and again.history == [] and again.checkpoint == find_latest(tmp_path)


def test_train_checkpoint_holds_model_and_state(tmp_path):
    config = config_for(tmp_path, steps=4, save_every=2, keep_last=1)
    result = train(tiny_model(), SyntheticSource(3, 4), PretrainingObjective(), config)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4]
    loaded = BertForPretraining.from_pretrained(result.checkpoint)
    assert isinstance(loaded, BertForPretraining)
    state = load_training_state(result.checkpoint)
    assert state["step"] == 4 and state["world_size"] == 1
    assert state["data"] == [{"epoch": 1, "index": 1}]
    assert set(state) >= {"optimizer", "scheduler", "scaler", "rng", "log_window", "config"}


def test_train_metrics_jsonl_has_train_and_eval_events(tmp_path):
    calls = []

    def eval_fn(model, step):
        calls.append((model.training, step))
        return {"score": 1.5}

    config = config_for(tmp_path, steps=4, log_every=2, eval_every=2)
    result = train(tiny_model(), SyntheticSource(3, 4), PretrainingObjective(), config, eval_fn=eval_fn)
    events = [(e["step"], e["split"]) for e in read_metrics(tmp_path)]
    assert events == [(2, "train"), (2, "eval"), (4, "train"), (4, "eval")]
    assert calls == [(False, 2), (False, 4)]
    assert result.eval == {"score": 1.5}


def test_train_evaluation_does_not_change_the_training_run(tmp_path):
    def noisy_eval(model, step):
        # Draws from every global generator; the loop must shield the training run from it.
        return {"noise": float(torch.rand(()) + random.random() + np.random.rand())}

    plain = train(tiny_model(dropout=0.1), SyntheticSource(3, 4), PretrainingObjective(), config_for(tmp_path / "a"))
    evaluated = train(tiny_model(dropout=0.1), SyntheticSource(3, 4), PretrainingObjective(),
                      config_for(tmp_path / "b", eval_every=1), eval_fn=noisy_eval)
    assert losses(plain.history) == losses(evaluated.history)


class SingleTermTask:
    """MLM only, without `counts`: the loop must divide the accumulated gradients afterwards."""

    def loss_terms(self, output, batch):
        return {"mlm": (output.mlm_loss_sum, output.mlm_count)}

    def metrics(self, output, batch):
        return {}


class SingleTermTaskWithCounts(SingleTermTask):
    def counts(self, batch):
        return {"mlm": (batch.mlm_labels != IGNORE_INDEX).sum()}


def test_train_task_without_counts_matches_counts_first(tmp_path):
    config = dict(grad_accumulation=3, batch_size=2, steps=4)
    deferred = train(tiny_model(), SyntheticSource(6, 2), SingleTermTask(), config_for(tmp_path / "a", **config))
    first = train(tiny_model(), SyntheticSource(6, 2), SingleTermTaskWithCounts(),
                  config_for(tmp_path / "b", **config))
    for (_, a), (_, b) in zip(losses(deferred.history), losses(first.history), strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=LOSS_TOLERANCE)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)


def test_train_task_without_counts_needs_single_term(tmp_path):
    class TwoTerms(SingleTermTask):
        def loss_terms(self, output, batch):
            return {"mlm": (output.mlm_loss_sum, output.mlm_count), "nsp": (output.nsp_loss_sum, output.nsp_count)}

    with pytest.raises(TypeError, match="counts"):
        train(tiny_model(), SyntheticSource(2, 2), TwoTerms(), config_for(tmp_path, steps=1))


class StepRecorder(SingleTermTaskWithCounts):
    """Records the steps the loop announces (`at_step`) and how many windows ran after each."""

    def __init__(self):
        self.announced: list[tuple[int, int]] = []
        self.passes: list[int] = []

    def at_step(self, step, total_steps):
        self.announced.append((step, total_steps))
        self.passes.append(0)

    def loss_terms(self, output, batch):
        self.passes[-1] += 1
        return super().loss_terms(output, batch)


def test_train_tells_the_task_each_step_before_its_window(tmp_path):
    task = StepRecorder()
    train(tiny_model(), SyntheticSource(6, 2), task, config_for(tmp_path, grad_accumulation=2, batch_size=2, steps=3))
    assert task.announced == [(0, 3), (1, 3), (2, 3)]
    assert task.passes == [2, 2, 2]  # both micro-batches of a step run after its announcement


class NanAfter(PretrainingObjective):
    def __init__(self, good_steps: int):
        self.calls = 0
        self.good_steps = good_steps

    def loss_terms(self, output, batch):
        self.calls += 1
        terms = super().loss_terms(output, batch)
        if self.calls > self.good_steps:
            terms["mlm"] = (terms["mlm"][0] * float("nan"), terms["mlm"][1])
        return terms


def test_train_nonfinite_loss_stops_with_clear_error(tmp_path, caplog):
    config = config_for(tmp_path, steps=20, max_nonfinite_steps=3, save_every=1)
    model = tiny_model()
    with caplog.at_level(logging.WARNING, logger="bertforge.training"), \
            pytest.raises(NonFiniteLossError, match=r"step 5: .*3 consecutive.*lower training.lr"):
        train(model, SyntheticSource(3, 4), NanAfter(good_steps=2), config)
    assert "skipping this update" in caplog.text
    # The skipped steps did not touch the weights: they equal the step-2 checkpoint's.
    saved = BertForPretraining.from_pretrained(find_latest(tmp_path))
    assert find_latest(tmp_path).name == "checkpoint-000004"
    reference = BertForPretraining.from_pretrained(tmp_path / "checkpoint-000002")
    for (name, a), b in zip(saved.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), name
    for a, b in zip(model.state_dict().values(), reference.state_dict().values()):
        assert torch.equal(a, b)


def test_train_bf16_autocast_on_cpu(tmp_path):
    result = train(tiny_model(), SyntheticSource(2, 4), PretrainingObjective(), config_for(tmp_path, steps=3, precision="bf16"))
    assert all(np.isfinite(v["loss"]) for _, v in losses(result.history))


def test_train_fp16_uses_loss_scaler(tmp_path):
    result = train(tiny_model(), SyntheticSource(2, 4), PretrainingObjective(),
                   config_for(tmp_path, steps=3, precision="fp16"))
    assert result.step == 3
    assert "scaler" in load_training_state(result.checkpoint)


def test_train_epochs_set_the_length(tmp_path):
    config = config_for(tmp_path, steps=0, epochs=1.5, grad_accumulation=2)
    result = train(tiny_model(), SyntheticSource(4, 2), PretrainingObjective(), config)
    assert result.total_steps == 3 and result.step == 3


def test_pretraining_task_evaluate_matches_manual_average():
    model = tiny_model()
    batches = list(SyntheticSource(2, 4))
    values = Pretraining().training.evaluate(model, batches)
    with torch.no_grad():
        outs = [model(**b.model_inputs()) for b in batches]
    mlm = sum(float(o.mlm_loss_sum) for o in outs) / sum(float(o.mlm_count) for o in outs)
    nsp_acc = sum(float(o.nsp_correct) for o in outs) / 8
    assert values["mlm_loss"] == pytest.approx(mlm, rel=1e-6)
    assert values["nsp_acc"] == pytest.approx(nsp_acc)
    assert values["loss"] == pytest.approx(values["mlm_loss"] + values["nsp_loss"])
    assert model.training


def test_pretraining_task_counts_equal_model_counts():
    batch = next(iter(SyntheticSource(1, 4)))
    out = tiny_model()(**batch.model_inputs())
    counts = PretrainingObjective().counts(batch)
    terms = PretrainingObjective().loss_terms(out, batch)
    assert float(counts["mlm"]) == float(terms["mlm"][1])
    assert float(counts["nsp"]) == float(terms["nsp"][1]) == 4.0


def test_train_refuses_to_mix_runs_in_one_directory(tmp_path):
    train(tiny_model(), SyntheticSource(2, 4), PretrainingObjective(), config_for(tmp_path, steps=2))
    with pytest.raises(ConfigError, match=r"already holds checkpoints.*checkpoint-000002.*resume=auto"):
        train(tiny_model(), SyntheticSource(2, 4), PretrainingObjective(), config_for(tmp_path, steps=2))


def test_train_progress_bar_and_console_log(tmp_path, capsys, caplog):
    with caplog.at_level(logging.INFO, logger="bertforge.training"):
        train(tiny_model(), SyntheticSource(2, 4), PretrainingObjective(), config_for(tmp_path, steps=3, progress=True))
    # stderr is not a terminal here: progress comes as log lines, not as a bar's carriage-return updates.
    assert "\r" not in capsys.readouterr().err
    assert "step 3/3 (100%) loss=" in caplog.text and "ETA" in caplog.text
    assert "training 3 steps (warmup 2) of 4 examples (batch 4 x accumulation 1 x 1 processes)" in caplog.text
    assert "step 3 train: loss=" in caplog.text


# --- the best checkpoint ---------------------------------------------------------------------------------

class ScriptedEval:
    """An evaluation whose score at each step is scripted; it records a copy of the weights it saw."""

    def __init__(self, scores: dict[int, float]):
        self.scores, self.weights = scores, {}

    def __call__(self, model, step):
        self.weights[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return {"score": self.scores[step], "loss": 1.0 - self.scores[step]}


def assert_weights(directory, expected) -> None:
    loaded, report = load_model(directory, BertForPretraining)
    assert not report.fresh
    state = loaded.state_dict()
    assert set(state) == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(state[name], tensor, rtol=0, atol=0)


def test_loop_keeps_best_checkpoint(tmp_path):
    scores = {1: 0.2, 2: 0.6, 3: 0.9, 4: 0.7, 5: 0.4, 6: 0.3}  # up, then down: step 3 is the best
    evaluation, seen = ScriptedEval(scores), []
    best = BestCheckpoint("score", False, tmp_path / "best", {"note.json": "{}\n"},
                          on_best=lambda step, values: seen.append(step))
    result = train(tiny_model(), SyntheticSource(3, 4), PretrainingObjective(), config_for(tmp_path / "run", eval_every=1),
                   eval_fn=evaluation, best=best)
    assert (result.best_step, result.best_eval, result.best_dir) == (3, {"score": 0.9, "loss": pytest.approx(0.1)},
                                                                     tmp_path / "best")
    assert seen == [1, 2, 3] and result.eval["score"] == 0.3  # the last evaluation is not the best one
    assert_weights(tmp_path / "best", evaluation.weights[3])
    assert (tmp_path / "best" / "note.json").read_text() == "{}\n"
    with pytest.raises(AssertionError):  # the weights did change after step 3: the check can fail
        assert_weights(tmp_path / "best", evaluation.weights[6])

    # A metric where lower is better picks the step with the smallest value; a missing one is a clear error.
    lowest = train(tiny_model(), SyntheticSource(3, 4), PretrainingObjective(), config_for(tmp_path / "low", eval_every=1),
                   eval_fn=ScriptedEval(scores), best=BestCheckpoint("loss", True, tmp_path / "best-low"))
    assert lowest.best_step == 3
    with pytest.raises(ConfigError, match=r"'f1', which is not among the evaluation's values \['loss', 'score'\]"):
        train(tiny_model(), SyntheticSource(3, 4), PretrainingObjective(), config_for(tmp_path / "bad", eval_every=1),
              eval_fn=ScriptedEval(scores), best=BestCheckpoint("f1", False, tmp_path / "best-bad"))


def test_loop_best_checkpoint_survives_resume(tmp_path):
    scores = {1: 0.2, 2: 0.9, 3: 0.5, 4: 0.4, 5: 0.3, 6: 0.2}  # the best (step 2) comes before the checkpoint
    config = dict(steps=6, save_every=2, eval_every=1)
    run, best_dir = tmp_path / "run", tmp_path / "best"
    first = ScriptedEval(scores)
    with pytest.raises(KeyboardInterrupt):  # interrupted while fetching step 5's batch: checkpoint 4 is the last
        train(tiny_model(), SyntheticSource(3, 4, fail_after=4), PretrainingObjective(), config_for(run, **config),
              eval_fn=first, best=BestCheckpoint("score", False, best_dir))
    assert find_latest(run).name == "checkpoint-000004"
    assert load_training_state(find_latest(run))["best"]["step"] == 2
    assert_weights(best_dir, first.weights[2])

    # A fresh process resumes: steps 5 and 6 score worse than step 2, so the best directory must stay as it is.
    resumed = train(tiny_model(seed=123), SyntheticSource(3, 4), PretrainingObjective(),
                    config_for(run, resume="auto", **config), eval_fn=ScriptedEval(scores),
                    best=BestCheckpoint("score", False, best_dir))
    assert [e["step"] for e in resumed.history if e["split"] == "eval"] == [5, 6]
    assert (resumed.best_step, resumed.best_eval["score"]) == (2, 0.9)
    assert_weights(best_dir, first.weights[2])
    # A finished run resumed again reports the same best without training.
    again = train(tiny_model(), SyntheticSource(3, 4), PretrainingObjective(), config_for(run, resume="auto", **config),
                  eval_fn=ScriptedEval(scores), best=BestCheckpoint("score", False, best_dir))
    assert again.history == [] and (again.best_step, again.best_eval["score"]) == (2, 0.9)


class Notes:
    """A caller's state for `extra_state`: what the loop must carry through checkpoints."""

    def __init__(self):
        self.seen: list[int] = []

    def state_dict(self):
        return {"seen": list(self.seen)}

    def load_state_dict(self, state):
        self.seen = list(state["seen"])


def test_train_save_also_and_extra_state_travel_in_checkpoints(tmp_path):
    notes = Notes()

    def eval_fn(model, step):
        notes.seen.append(step)
        return {"score": float(step)}

    config = dict(steps=6, eval_every=1, keep_last=0)
    with pytest.raises(KeyboardInterrupt):  # interrupted fetching step 6's batch: step 5 was saved (save_also)
        train(tiny_model(), SyntheticSource(3, 4, fail_after=5), PretrainingObjective(), config_for(tmp_path, **config),
              eval_fn=eval_fn, save_also=lambda step: step in (2, 5), extra_state=notes)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 5]
    assert load_training_state(tmp_path / "checkpoint-000002")["extra"] == {"seen": [1, 2]}

    resumed_notes = Notes()
    resumed = train(tiny_model(), SyntheticSource(3, 4), PretrainingObjective(), config_for(tmp_path, resume="auto", **config),
                    eval_fn=lambda model, step: resumed_notes.seen.append(step) or {"score": 0.0},
                    extra_state=resumed_notes)
    assert resumed_notes.seen == [1, 2, 3, 4, 5, 6]  # restored from checkpoint 5, then step 6
    assert (resumed.resumed_from, resumed.start_step) == (tmp_path / "checkpoint-000005", 5)


def test_train_resume_auto_says_it_starts_fresh(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="bertforge.training"):
        result = train(tiny_model(), SyntheticSource(2, 4), PretrainingObjective(),
                       config_for(tmp_path, steps=1, resume="auto"))
    assert f"resume auto: no checkpoint (checkpoint-<step>/ with training_state.pt) in {tmp_path}" in caplog.text
    assert (result.resumed_from, result.start_step) == (None, 0)
    with caplog.at_level(logging.INFO, logger="bertforge.training"):
        train(tiny_model(), SyntheticSource(2, 4), PretrainingObjective(), config_for(tmp_path, steps=2, resume="auto"))
    assert f"resuming from {tmp_path / 'checkpoint-000001'} at step 1 of 2" in caplog.text


def test_train_result_summary_is_one_readable_line(tmp_path):
    result = train(tiny_model(), SyntheticSource(3, 4), PretrainingObjective(), config_for(tmp_path, steps=2, eval_every=2),
                   eval_fn=lambda model, step: {"mlm_acc": 0.25})
    line = result.summary()
    assert line.startswith("trained to step 2 of 2 in ") and "\n" not in line and "TrainResult" not in line
    assert f"final loss {result.train['loss']:.4f} (mlm " in line and "eval mlm_acc 0.25" in line
    assert line.endswith(f"checkpoint {tmp_path / 'checkpoint-000002'}")
    again = train(tiny_model(), SyntheticSource(3, 4), PretrainingObjective(), config_for(tmp_path, steps=2, resume="auto"))
    assert again.summary().startswith("already complete at step 2 of 2 (nothing trained)")


def test_train_progress_line_and_event_line_show_the_same_loss(tmp_path, caplog):
    # "loss" is the mean training loss since the last training log line on both; the last step's own loss is
    # `step_loss` on the progress line. A line every step (10 steps, a tenth each), events every 5 steps.
    with caplog.at_level(logging.INFO, logger="bertforge.training"):
        train(tiny_model(), SyntheticSource(10, 4), PretrainingObjective(),
              config_for(tmp_path, steps=10, log_every=5, progress=True, lr=3e-3))
    for step in (5, 10):
        progress = re.search(rf"step {step}/10 \(\d+%\) loss=(\S+) step_loss=(\S+)", caplog.text)
        event = re.search(rf"step {step} train: loss=(\S+)", caplog.text)
        assert progress and event, caplog.text
        assert progress.group(1) == event.group(1)
    steps = [float(m) for m in re.findall(r"step_loss=(\S+)", caplog.text)]
    assert len(steps) == 10 and len(set(steps)) > 1  # the last step's own figure, under its own name
