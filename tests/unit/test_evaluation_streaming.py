"""Tokenization off the critical path (`evaluation.streaming`): the model runs batches while a thread makes the
next ones; outputs equal the all-features-first path and come back in input order."""

from __future__ import annotations

import random
import string
import threading

import pytest
import torch

from bertforge.errors import InputError
from bertforge.evaluation import run_features, run_streamed
from bertforge.evaluation.streaming import budget_batches, padding_batches
from bertforge.families.embedding import FAMILY as EMBEDDING
from bertforge.inference import pipelines as P
from bertforge.model.bert import BertModel
from bertforge.model.config import BertConfig
from bertforge.tokenization import Tokenizer, TokenizerConfig
from bertforge.tokenization.vocab import Vocab

WORDS = "the cat sat on mat paris is capital of france john smith lives in london where does live".split()
FP32 = 1e-5


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    letters = [c for c in string.ascii_lowercase if c not in WORDS]
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *".,?!", *letters,
              *("##" + c for c in string.ascii_lowercase)]
    return Tokenizer(Vocab(tokens), TokenizerConfig(model_max_length=64))


@pytest.fixture(scope="module")
def pipeline(tokenizer) -> P.EmbedPipeline:
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=64, max_position_embeddings=64))
    return P.EmbedPipeline(model, tokenizer, device="cpu", batch_size=8)


def texts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(1, 30))) for _ in range(count)]


def test_budget_batches_sort_by_length_and_respect_rows_and_tokens():
    lengths = [5, 30, 2, 9, 9, 40, 3, 2]
    batches = budget_batches(lengths, max_rows=3, max_tokens=30)
    assert [i for batch in batches for i in batch] == sorted(range(8), key=lambda i: lengths[i])
    for batch in batches:
        assert len(batch) <= 3 and (len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 30)
    assert [5] in batches  # longer than the budget: a batch of its own
    assert budget_batches([4] * 10, max_rows=100, max_tokens=16) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_padding_batches_never_pad_short_windows_to_a_long_ones_length():
    # A server call: 48 short requests (16 tokens) beside 2 windows of a large request (128 tokens). Cut by
    # rows only, the second batch padded 16 short windows to 128 tokens (2,816 padded tokens for 1,024 real).
    lengths = [16] * 24 + [128] + [16] * 24 + [128]
    batches = padding_batches(lengths, max_rows=32)
    assert [i for batch in batches for i in batch] == sorted(range(50), key=lambda i: lengths[i])
    assert sum(len(batch) * max(lengths[i] for i in batch) for batch in batches) == sum(lengths) == 1024
    # Lengths that grow a little at a time stay in full batches (splitting costs a call of its own).
    assert [len(batch) for batch in padding_batches([10 + i // 4 for i in range(64)], max_rows=32)] == [32, 32]


def test_pipeline_forward_runs_short_and_long_windows_in_separate_batches(pipeline):
    short, long = [pipeline.parse(" ".join(["cat"] * 3)) for _ in range(12)], [pipeline.parse(" ".join(WORDS * 3))]
    features = pipeline.features(short + long + short[:3])
    shapes = []
    original = pipeline.family_forward

    def recorded(options):
        forward = original(options)
        return lambda engine, batch: shapes.append(tuple(batch.input_ids.shape)) or forward(engine, batch)

    pipeline.family_forward = recorded
    try:
        outputs = pipeline.forward(features, pipeline.check_options({}))
    finally:
        del pipeline.family_forward
    assert len(outputs) == len(features)
    assert sum(rows * width for rows, width in shapes) == sum(len(feature) for feature in features)


def test_run_streamed_equals_features_first_in_input_order(pipeline):
    items = [pipeline.parse(text) for text in texts(150)]
    options = pipeline.check_options({})
    forward = pipeline.family_forward(options)

    def streamed(overlap):
        return run_streamed(pipeline.model, items, pipeline.features, forward, batch_size=8, max_batch_tokens=96,
                            pad_token_id=0, device="cpu", chunk=32, overlap=overlap)

    features, outputs = streamed(True)
    same_features, same_outputs = streamed(False)
    assert [f.example_index for f in features] == list(range(150)) == [f.example_index for f in same_features]
    assert all(torch.equal(a, b) for a, b in zip(outputs, same_outputs, strict=True))  # the same batches
    reference = run_features(pipeline.model, pipeline.features(items), forward, batch_size=8, pad_token_id=0)
    assert all(torch.allclose(a, b, atol=FP32) for a, b in zip(outputs, reference, strict=True))
    vectors = pipeline.encode(texts(150))
    alone = [pipeline.encode([text])[0] for text in texts(150)[:40:7]]
    assert all(abs(vectors[7 * i] - vector).max() < FP32 for i, vector in enumerate(alone))


def test_run_streamed_runs_the_model_before_everything_is_tokenized(pipeline):
    events, lock = [], threading.Lock()
    options = pipeline.check_options({})

    def make_features(chunk):
        with lock:
            events.append("features")
        return pipeline.features(chunk)

    def forward(model, batch):
        with lock:
            events.append("model")
        return EMBEDDING.forward(model, batch, options=options)

    items = [pipeline.parse(text) for text in texts(40)]
    run_streamed(pipeline.model, items, make_features, forward, batch_size=2, max_batch_tokens=10_000,
                 pad_token_id=0, device="cpu", chunk=2)
    # 20 chunks of one batch each, at most a few ahead in the queue: the model starts long before the last.
    assert events.count("features") == 20 and events.index("model") < 10
    assert len(events) - 1 - events[::-1].index("features") > events.index("model")


def test_run_streamed_raises_the_feature_thread_errors(pipeline):
    def broken(chunk):
        raise InputError("input 3: too long")

    with pytest.raises(InputError, match="input 3: too long"):
        run_streamed(pipeline.model, ["a", "b"], broken, lambda model, batch: [], batch_size=2,
                     max_batch_tokens=100, pad_token_id=0, device="cpu")


def test_pipeline_max_batch_tokens_is_checked(tokenizer):
    model = BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=64, max_position_embeddings=64))
    with pytest.raises(InputError, match="max_batch_tokens must be a positive integer"):
        P.EmbedPipeline(model, tokenizer, device="cpu", max_batch_tokens=0)
    assert P.EmbedPipeline(model, tokenizer, device="cpu", batch_size=4).max_batch_tokens == 4 * 64
