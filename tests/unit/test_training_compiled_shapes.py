"""`--compile` with packing and unpadding: batches in a few shapes (`data.loading`, fixed_shapes) and a model
step without data-dependent graph breaks (`model.layouts` under torch.compile, `training.loop.compiled`), so
the compiler builds a bounded number of graphs however many steps run, instead of one nearly every step.

Graphs are counted with dynamo's counting backend (it runs them eagerly: no C++ compiler, a few seconds)."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import torch
from torch._dynamo.testing import CompileCounter

from bertforge.constants import IGNORE_INDEX
from bertforge.data.datasets import PretrainingData
from bertforge.data.loading import bucket_length, length_buckets
from bertforge.data.masking import MaskingConfig
from bertforge.data.preparation import prepare_corpus
from bertforge.families.pretraining import BertForPretraining, PretrainingObjective
from bertforge.model.config import BertConfig
from bertforge.model.fast_paths import set_fast_paths
from bertforge.tokenization import Tokenizer, Vocab
from bertforge.training.config import TrainingConfig
from bertforge.training.loop import train

WORDS = "the cat sat on mat and dog ran to park it was sunny day bird saw fly away big small red blue".split()
TOKENIZER = Tokenizer(Vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "."]))
MAX_LENGTH = 32


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("compiled-shapes")
    rng = random.Random(0)
    blocks = ["\n".join(" ".join(rng.choices(WORDS, k=rng.randint(2, 10))) + "." for _ in range(rng.randint(1, 6)))
              for _ in range(80)]
    (root / "corpus.txt").write_text("\n\n".join(blocks) + "\n")
    prepare_corpus(root / "corpus.txt", TOKENIZER, root / "data", max_seq_length=MAX_LENGTH, heldout_fraction=0.0,
                   short_seq_prob=0.5)
    return root / "data"


def stream(data_dir, **options) -> PretrainingData:
    return PretrainingData(data_dir, batch_size=6, masking=MaskingConfig(), seed=0, vocab_size=TOKENIZER.vocab_size,
                           special_ids=TOKENIZER.all_special_ids, mask_id=TOKENIZER.mask_token_id, pad_to_multiple_of=8,
                           **options)


class Shapes:
    """The batch stream, recording every batch's (rows, tokens, slots, NSP labels)."""

    def __init__(self, source):
        self.source, self.seen = source, Counter()

    def __getattr__(self, name):
        return getattr(self.source, name)

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self.source)
        self.seen[(*batch.input_ids.shape, batch.mlm_labels.shape[1], batch.nsp_labels.shape[0])] += 1
        return batch


def test_length_buckets_cover_the_prepared_length_in_four_steps():
    assert length_buckets(128, 8) == [32, 64, 96, 128]
    assert length_buckets(100, 8) == [32, 64, 96, 100]  # the last bucket is the prepared length itself
    assert [bucket_length(w, [32, 64, 96, 128]) for w in (1, 32, 33, 128)] == [32, 32, 64, 128]


def test_fixed_shapes_batches_keep_the_tight_batch_and_take_few_shapes(data_dir):
    tight, fixed = stream(data_dir), stream(data_dir, fixed_shapes=True)
    packed = stream(data_dir, fixed_shapes=True, pack_sequences=True)
    shapes = Counter()
    for _ in range(12):
        a, b, p = next(tight), next(fixed), next(packed)
        rows, width = a.input_ids.shape
        assert b.input_ids.shape[1] in length_buckets(MAX_LENGTH, 8) and b.mlm_labels.shape[1] % 8 == 0
        assert torch.equal(b.input_ids[:, :width], a.input_ids) and not b.attention_mask[:, width:].any()
        real = a.mlm_labels != IGNORE_INDEX
        assert torch.equal(b.mlm_labels[:, :a.mlm_labels.shape[1]][real], a.mlm_labels[real])
        assert int((b.mlm_labels != IGNORE_INDEX).sum()) == int(real.sum()) and b.num_tokens == a.num_tokens
        assert p.input_ids.shape[1] == MAX_LENGTH and p.num_tokens == a.num_tokens
        shapes[(width, a.mlm_labels.shape[1])] += 1
    assert len(shapes) > 2  # the tight batches did vary


def test_compiled_packed_unpadded_steps_build_a_bounded_number_of_graphs(tmp_path, data_dir, monkeypatch):
    # With the NSP head: its pooled [CLS] rows, one per packed sequence, are a size known only from the batch.
    torch._dynamo.reset()
    # reset() keeps the counters: graph breaks of other tests' compiled models would count here.
    torch._dynamo.utils.counters.clear()
    counter = CompileCounter()
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: real_compile(model, backend=counter))
    torch.manual_seed(0)
    model = BertForPretraining(BertConfig(vocab_size=TOKENIZER.vocab_size, hidden_size=32, num_hidden_layers=1,
                                          num_attention_heads=4, intermediate_size=37,
                                          max_position_embeddings=MAX_LENGTH))
    set_fast_paths(model, unpad=True)
    source = Shapes(stream(data_dir, pack_sequences=True, fixed_shapes=True))
    config = TrainingConfig(steps=6, batch_size=6, lr=1e-3, warmup_steps=0, log_every=3, precision="fp32",
                            device="cpu", out_dir=str(tmp_path), progress=False, tensorboard=False, compile=True,
                            save_every=0)
    result = train(model, source, PretrainingObjective(), config)
    torch._dynamo.reset()
    assert result.step == 6 and np.isfinite(result.history[-1]["values"]["loss"])
    # Packed rows of a fixed capacity; rows, prediction slots and sequences still vary from batch to batch.
    assert {shape[1] for shape in source.seen} == {MAX_LENGTH} and len(source.seen) >= 2
    # One graph for the first shape, then one with the varying dimensions dynamic; no graph breaks (each would
    # split the step in pieces compiled anew for new sizes: 21 graphs in these 6 steps before).
    assert counter.frame_count <= 2, counter.frame_count
    assert not torch._dynamo.utils.counters["graph_break"]
