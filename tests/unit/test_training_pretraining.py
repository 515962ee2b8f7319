"""run_pretraining end to end on a few KB of a real book: prepare shards, train a tiny BERT, resume."""

from __future__ import annotations

import pytest
import torch
from test_training_loop import single_thread  # noqa: F401  (autouse fixture)

from bertforge.configuration import load_config, shared_data_root
from bertforge.data.datasets import PretrainingData
from bertforge.data.shards import prepare_corpus
from bertforge.errors import ConfigError
from bertforge.tasks.pretraining import BertForPretraining
from bertforge.tokenization.tokenizer import Tokenizer, TokenizerConfig
from bertforge.tokenization.vocab_builder import build_vocab
from bertforge.training.checkpoint import list_checkpoints
from bertforge.training.logging import read_metrics
from bertforge.training.pretraining import RUN_CONFIG_NAME, PretrainConfig, run_pretraining

BOOK = shared_data_root() / "pretrain_en/books/pg43_jekyll_and_hyde.txt"
TINY_MODEL = ("hidden_size = 32\nnum_hidden_layers = 1\nnum_attention_heads = 2\nintermediate_size = 37\n"
              "max_position_embeddings = 64")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    if not BOOK.is_file():
        pytest.skip(f"{BOOK} is not available")
    root = tmp_path_factory.mktemp("pretrain")
    lines = BOOK.read_text(encoding="utf-8").splitlines()[:600]
    files = []
    for part in range(6):  # one document per file
        files.append(root / f"part{part}.txt")
        files[-1].write_text("\n".join(lines[part * 100:(part + 1) * 100]), encoding="utf-8")
    tokenizer = Tokenizer(build_vocab(files, 300), TokenizerConfig())
    tokenizer.save_pretrained(root / "data")
    prepare_corpus(files, tokenizer, root / "data", max_seq_length=32, heldout_documents=1, seed=1)
    return root / "data"


def run_file(tmp_path, data_dir, *overrides):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "run.toml"
    path.write_text(f'data_dir = "{data_dir}"\nmodel = "tiny"\n[model_overrides]\n{TINY_MODEL}\n'
                    '[masking]\nmax_predictions_per_seq = 5\n'
                    f'[training]\nsteps = 6\nbatch_size = 4\nlr = 1e-3\nwarmup_steps = 2\nlog_every = 1\n'
                    f'eval_every = 3\nsave_every = 3\nprecision = "fp32"\ndevice = "cpu"\nprogress = false\n'
                    f'tensorboard = false\nout_dir = "{tmp_path / "out"}"\n', encoding="utf-8")
    return load_config(PretrainConfig, path, overrides)


def test_run_pretraining_trains_evaluates_and_checkpoints(tmp_path, data_dir):
    config = run_file(tmp_path, data_dir)
    result = run_pretraining(config)
    out = tmp_path / "out"
    assert result.step == 6
    assert [s for s, _ in list_checkpoints(out)] == [3, 6]
    assert set(result.eval) == {"mlm_loss", "mlm_acc", "mlm_majority_acc", "nsp_loss", "nsp_acc", "loss"}
    assert 0 < result.eval["mlm_majority_acc"] < 1
    events = read_metrics(out)
    assert [e["step"] for e in events if e["split"] == "eval"] == [3, 6]
    assert all(torch.isfinite(torch.tensor(e["values"]["loss"])) for e in events)
    model = BertForPretraining.from_pretrained(result.checkpoint)
    assert model.config.hidden_size == 32 and model.config.vocab_size == 300
    assert (result.checkpoint / "vocab.txt").is_file()
    assert load_config(PretrainConfig, out / RUN_CONFIG_NAME) == config


def test_run_pretraining_resume_matches_uninterrupted(tmp_path, data_dir, monkeypatch):
    # The tiny preset keeps dropout 0.1, and masks are drawn per batch: RNG and stream position both matter.
    full = run_pretraining(run_file(tmp_path / "a", data_dir))
    produce = PretrainingData.__next__
    served = []

    def interrupted(self):
        if self.split == "train":
            served.append(1)
            if len(served) > 5:  # during step 6; the last checkpoint is step 3
                raise KeyboardInterrupt("simulated preemption")
        return produce(self)

    monkeypatch.setattr(PretrainingData, "__next__", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_pretraining(run_file(tmp_path / "b", data_dir))
    monkeypatch.undo()
    resumed = run_pretraining(run_file(tmp_path / "b", data_dir, "--training.resume=auto"))

    def logged(events):
        return [(e["step"], e["split"], {k: v for k, v in e["values"].items() if k != "tokens_per_s"})
                for e in events]

    assert [e["step"] for e in resumed.history if e["split"] == "train"] == [4, 5, 6]
    assert logged(read_metrics(tmp_path / "b" / "out")) == logged(read_metrics(tmp_path / "a" / "out"))
    assert logged(resumed.history) == logged(full.history)[4:]


def test_pretrain_config_rejects_unknown_preset(tmp_path, data_dir):
    with pytest.raises(ConfigError, match="neither a model directory nor a preset"):
        PretrainConfig(data_dir=str(data_dir), model="huge")
