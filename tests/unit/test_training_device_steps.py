"""Steps that never wait for the host: no host read-back in a step that does not log, the finite check and
the skipped-step counts on the device (`training.updates`), and fused AdamW where it is the default (CUDA).

Run on the CPU with the fused AdamW asked for explicitly (the path CUDA takes by default); every place a
tensor is read on the host is counted by patching `torch.Tensor`'s read methods."""

from __future__ import annotations

import logging
import random
from collections import Counter

import pytest
import torch
from test_training_loop import NanAfter, SyntheticSource, config_for, losses, single_thread, tiny_model  # noqa: F401

from bertforge.cli import build_parser
from bertforge.data.datasets import PretrainingData
from bertforge.data.masking import MaskingConfig
from bertforge.data.preparation import prepare_corpus
from bertforge.families.pretraining import BertForPretraining, PretrainingObjective
from bertforge.model.bert import BertModel
from bertforge.model.config import BertConfig
from bertforge.model.fast_paths import set_fast_paths
from bertforge.tokenization import Tokenizer, Vocab
from bertforge.training.checkpoint import find_latest
from bertforge.training.config import TrainingConfig
from bertforge.training.loop import NonFiniteLossError, train
from bertforge.training.optim import build_optimizer, fused_adamw

WORDS = "the cat sat on mat and dog ran to park it was sunny day bird saw fly away big small red blue".split()
TOKENIZER = Tokenizer(Vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "."]))
READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("device-steps")
    rng = random.Random(0)
    blocks = ["\n".join(" ".join(rng.choices(WORDS, k=rng.randint(3, 10))) + "." for _ in range(rng.randint(2, 8)))
              for _ in range(30)]
    (root / "corpus.txt").write_text("\n\n".join(blocks) + "\n")
    prepare_corpus(root / "corpus.txt", TOKENIZER, root / "data", max_seq_length=32, heldout_fraction=0.0)
    return root / "data"


class CountedReads:
    """Counts host reads of tensors (`READS`) per optimizer step: batch k is fetched at the start of step k."""

    def __init__(self, source, monkeypatch):
        self.source, self.step, self.reads = source, 0, Counter()
        for name in READS:
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, _name=name, **kwargs):
                self.reads[(self.step, _name)] += 1
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)

    def __getattr__(self, name):
        return getattr(self.source, name)

    def __iter__(self):
        return self

    def __next__(self):
        self.step += 1
        return next(self.source)


def test_train_steps_that_do_not_log_read_nothing_back(tmp_path, data_dir, monkeypatch):
    torch.manual_seed(0)
    model = BertForPretraining(BertConfig(vocab_size=TOKENIZER.vocab_size, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, intermediate_size=37, max_position_embeddings=32))
    # Around the model, not inside it: the encoder's input range check reads ids on a CPU only (it returns at
    # once on an accelerator), and the unpadded layout reads the sequence lengths (on CUDA too: see
    # `model.layouts.Unpadded`), so the plain layout runs here.
    monkeypatch.setattr(BertModel, "check_inputs", lambda self, input_ids, token_type_ids: None)
    set_fast_paths(model, unpad=False)
    source = PretrainingData(data_dir, batch_size=4, masking=MaskingConfig(), seed=1,
                             vocab_size=TOKENIZER.vocab_size, special_ids=TOKENIZER.all_special_ids,
                             mask_id=TOKENIZER.mask_token_id)
    counted = CountedReads(source, monkeypatch)
    config = config_for(tmp_path, steps=12, log_every=4, fused_adamw=True, ema_decay=0.9)
    result = train(model, counted, PretrainingObjective(), config)
    monkeypatch.undo()
    assert [e["step"] for e in result.history] == [4, 8, 12]
    quiet = {step for step in range(1, 13) if step % 4}
    assert {key: n for key, n in counted.reads.items() if key[0] in quiet} == {}
    assert any(step in (4, 8, 12) for step, _ in counted.reads)  # the reads happen, at the log steps
    assert result.tokens > 0 and result.skipped_steps == 0


def test_train_device_step_logs_what_the_host_step_logs(tmp_path):
    def run(fused, path):
        config = config_for(tmp_path / path, steps=6, log_every=2, fused_adamw=fused, ema_decay=0.5)
        return train(tiny_model(), SyntheticSource(2, 4), PretrainingObjective(), config)

    host, device = run(False, "host"), run(True, "device")
    assert [step for step, _ in losses(host.history)] == [step for step, _ in losses(device.history)] == [2, 4, 6]
    for (_, a), (_, b) in zip(losses(host.history), losses(device.history), strict=True):
        assert a == pytest.approx(b, rel=1e-4)
    assert device.tokens == host.tokens and device.skipped_steps == host.skipped_steps == 0


def test_train_device_step_skips_nonfinite_steps_and_stops(tmp_path, caplog):
    config = config_for(tmp_path, steps=20, max_nonfinite_steps=3, save_every=1, fused_adamw=True)
    model = tiny_model()
    with caplog.at_level(logging.WARNING, logger="bertforge.training"), \
            pytest.raises(NonFiniteLossError, match=r"step 5: .*3 consecutive.*lower training.lr"):
        train(model, SyntheticSource(3, 4), NanAfter(good_steps=2), config)
    assert "updates were skipped" in caplog.text
    # The skipped steps did not touch the weights: they equal the step-2 checkpoint's.
    assert find_latest(tmp_path).name == "checkpoint-000004"
    reference = BertForPretraining.from_pretrained(tmp_path / "checkpoint-000002")
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), name


def test_fused_adamw_is_the_default_on_cuda_only():
    auto = TrainingConfig()
    assert auto.fused_adamw == "auto"
    assert fused_adamw(auto, torch.device("cuda")) and fused_adamw(auto, torch.device("cuda", 1))
    assert not fused_adamw(auto, torch.device("cpu"))
    assert not fused_adamw(TrainingConfig(fused_adamw=False), torch.device("cuda"))
    assert fused_adamw(TrainingConfig(fused_adamw=True), torch.device("cpu"))
    plain = build_optimizer(tiny_model(), auto, torch.device("cpu"))
    assert not plain.defaults["fused"] and not getattr(plain, "_step_supports_amp_scaling", False)  # as before
    fused = build_optimizer(tiny_model(), TrainingConfig(fused_adamw=True), torch.device("cpu"))
    assert fused.defaults["fused"] and fused._step_supports_amp_scaling


def test_fused_adamw_flag_reads_auto_true_and_false():
    parser = build_parser()
    for words, expected in ((["--fused-adamw", "auto"], "auto"), (["--fused-adamw"], True),
                            (["--fused-adamw", "false"], False)):
        args = parser.parse_args(["pretrain", "--data", "somewhere", *words])
        assert args.config_values["training"]["fused_adamw"] == expected
