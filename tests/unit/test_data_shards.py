"""Tests of `bertforge.data.shards` and `bertforge.data.preparation`: prepare_corpus output, determinism,
resume, held-out split, bad data dirs."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from bertforge.configuration import shared_data_root
from bertforge.data.preparation import prepare_corpus
from bertforge.data.shards import (
    FORMAT_VERSION,
    INDEX_NAME,
    ShardIndex,
    SplitReader,
    token_dtype,
    vocab_checksum,
)
from bertforge.errors import ConfigError, DataError
from bertforge.tokenization import Tokenizer, Vocab

DATA = shared_data_root()
WORDS = "the cat sat on mat and dog ran to park it was sunny day bird saw fly away big small red blue".split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tiny_tokenizer(extra: list[str] = ()) -> Tokenizer:
    return Tokenizer(Vocab([*SPECIALS, *WORDS, ".", *extra]))


def write_corpus(path: Path, documents: int = 40, seed: int = 0) -> Path:
    """Google-format text: one sentence per line, a blank line between documents."""
    rng = random.Random(seed)
    blocks = []
    for _ in range(documents):
        sentences = [" ".join(rng.choices(WORDS, k=rng.randint(3, 12))).capitalize() + "." for _ in
                     range(rng.randint(2, 12))]
        blocks.append("\n".join(sentences))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    return path


def directory_bytes(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def test_shards_prepare_writes_index_and_readable_instances(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    tokenizer = tiny_tokenizer()
    report = prepare_corpus(corpus, tokenizer, tmp_path / "data", max_seq_length=32, shard_size=2000)
    assert report.documents == 40 and report.instances > 40 and report.shards_written >= 3
    assert report.peak_rss_mb > 0 and report.mb_per_s > 0 and report.unk_tokens == 0
    index = ShardIndex.load(tmp_path / "data")
    assert index.vocab_size == tokenizer.vocab_size
    assert index.vocab_checksum == vocab_checksum(tokenizer)
    reader = SplitReader(index, "train")
    assert len(reader) == report.instances
    tokens = np.load(tmp_path / "data" / "train-00000-00.tokens.npy")
    assert tokens.dtype == np.uint16
    labels = []
    for number in range(len(reader)):
        ids, word_starts, b_start, label = reader.instance(number)
        assert ids[0] == tokenizer.cls_token_id and ids[b_start - 1] == tokenizer.sep_token_id
        assert ids[-1] == tokenizer.sep_token_id and len(ids) <= 32 and len(word_starts) == len(ids)
        labels.append(label)
    assert 0.3 < np.mean(labels) < 0.7
    stored = json.loads((tmp_path / "data" / INDEX_NAME).read_text())
    assert stored["format_version"] == FORMAT_VERSION and stored["complete"] is True
    assert stored["corpus"]["documents"] == 40


def test_shards_contiguous_rows_are_full_but_each_shards_last_and_hold_every_token_once(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    tokenizer = tiny_tokenizer()
    report = prepare_corpus(corpus, tokenizer, tmp_path / "data", max_seq_length=32, shard_size=2000,
                            heldout_documents=4, contiguous=True)
    index = ShardIndex.load(tmp_path / "data")
    assert index.settings["contiguous"] is True
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    text_tokens = 0
    for split in ("train", "heldout"):
        for record in index.shards(split):
            rows = np.load(tmp_path / "data" / f"{record['name']}.instances.npy")
            tokens = np.load(tmp_path / "data" / f"{record['name']}.tokens.npy").astype(np.int64)
            lengths = rows[:, 2] - rows[:, 0]
            assert (lengths[:-1] == 32).all() and 3 <= lengths[-1] <= 32  # padding only after the shard's last
            assert (rows[:, 1] == rows[:, 2]).all()  # no segment B: token types all 0
            assert (tokens[rows[:, 0]] == cls).all() and (tokens[rows[:, 2] - 1] == sep).all()
            # the documents' tokens, and one [SEP] between two documents (none where a row starts anyway)
            inner = np.concatenate([tokens[start + 1:end - 1] for start, _, end, _ in rows])
            separators = int((inner == sep).sum())
            starts_at_a_document = record["documents"] - 1 - separators
            assert 0 <= starts_at_a_document <= len(rows) - 1
            assert inner.size - separators == record["document_tokens"]
            text_tokens += lengths.sum() - 2 * len(rows) - separators
    assert text_tokens == sum(r["document_tokens"] for split in ("train", "heldout") for r in index.shards(split))
    assert report.instances == sum(r["instances"] for r in index.shards("train"))
    with pytest.raises(ConfigError, match="dupe_factor=2 with contiguous instances"):
        prepare_corpus(corpus, tokenizer, tmp_path / "again", contiguous=True, dupe_factor=2)
    # shards without the setting keep their settings (and resume): the key is written only when set
    prepare_corpus(corpus, tokenizer, tmp_path / "pairs", max_seq_length=32, shard_size=2000)
    assert "contiguous" not in ShardIndex.load(tmp_path / "pairs").settings


def test_shards_token_dtype_follows_vocab_size():
    assert token_dtype(30522) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.int32


def test_shards_output_is_deterministic_and_independent_of_workers(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt", documents=30)
    tokenizer = tiny_tokenizer()
    settings = {"max_seq_length": 24, "shard_size": 1500, "dupe_factor": 2, "heldout_fraction": 0.1}
    prepare_corpus(corpus, tokenizer, tmp_path / "one", **settings)
    prepare_corpus(corpus, tokenizer, tmp_path / "again", **settings)
    prepare_corpus(corpus, tokenizer, tmp_path / "two", workers=2, **settings)
    one = directory_bytes(tmp_path / "one")
    assert one == directory_bytes(tmp_path / "again")
    assert one == directory_bytes(tmp_path / "two")
    other = prepare_corpus(corpus, tokenizer, tmp_path / "seed", seed=7, **settings)
    assert other.instances > 0 and directory_bytes(tmp_path / "seed") != one


def test_shards_resume_skips_completed_shards_and_completes_the_rest(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    tokenizer = tiny_tokenizer()
    first = prepare_corpus(corpus, tokenizer, tmp_path / "data", shard_size=2000)
    reference = directory_bytes(tmp_path / "data")
    rerun = prepare_corpus(corpus, tokenizer, tmp_path / "data", shard_size=2000)
    assert rerun.shards_written == 0 and rerun.shards_skipped == first.shards_written
    assert directory_bytes(tmp_path / "data") == reference
    # Simulate a run killed after some shards: the index lists only the first ones and is not complete.
    index_path = tmp_path / "data" / INDEX_NAME
    index = json.loads(index_path.read_text())
    dropped = index["splits"]["train"]["shards"][2:]
    index["splits"]["train"]["shards"] = index["splits"]["train"]["shards"][:2]
    index["complete"] = False
    index_path.write_text(json.dumps(index))
    for record in dropped:
        for path in (tmp_path / "data").glob(record["name"] + ".*"):
            path.unlink()
    with pytest.raises(DataError, match="did not finish"):
        ShardIndex.load(tmp_path / "data")
    resumed = prepare_corpus(corpus, tokenizer, tmp_path / "data", shard_size=2000)
    assert resumed.shards_skipped == 2 and resumed.shards_written == len(dropped)
    assert directory_bytes(tmp_path / "data") == reference


def test_shards_resume_with_other_settings_is_refused_unless_overwriting(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    tokenizer = tiny_tokenizer()
    prepare_corpus(corpus, tokenizer, tmp_path / "data", shard_size=2000)
    with pytest.raises(DataError, match="seed"):
        prepare_corpus(corpus, tokenizer, tmp_path / "data", shard_size=2000, seed=1)
    report = prepare_corpus(corpus, tokenizer, tmp_path / "data", shard_size=5000, seed=1, resume=False)
    assert report.shards_skipped == 0
    assert ShardIndex.load(tmp_path / "data").settings["seed"] == 1
    assert not (tmp_path / "data" / "train-00005-00.tokens.npy").exists()  # the old extra shards are gone


def test_shards_old_format_version_is_a_clear_error(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt", documents=5)
    prepare_corpus(corpus, tiny_tokenizer(), tmp_path / "data")
    index_path = tmp_path / "data" / INDEX_NAME
    index = json.loads(index_path.read_text())
    index["format_version"] = 0
    index_path.write_text(json.dumps(index))
    with pytest.raises(DataError, match="format version 0"):
        ShardIndex.load(tmp_path / "data")
    with pytest.raises(DataError, match="format version 0"):
        prepare_corpus(corpus, tiny_tokenizer(), tmp_path / "data")
    with pytest.raises(DataError, match="not a prepared"):
        ShardIndex.load(tmp_path)


def test_shards_vocab_mismatch_is_detected(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt", documents=5)
    prepare_corpus(corpus, tiny_tokenizer(), tmp_path / "data")
    index = ShardIndex.load(tmp_path / "data")
    index.check_vocab(tiny_tokenizer())
    with pytest.raises(DataError, match="different vocabulary"):
        index.check_vocab(Tokenizer(Vocab([*SPECIALS, *reversed(WORDS), "."])))
    with pytest.raises(DataError, match="vocabulary"):
        index.check_vocab(tiny_tokenizer(extra=["extra"]))


def test_shards_heldout_documents_are_exact_and_separate(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt", documents=40)
    report = prepare_corpus(corpus, tiny_tokenizer(), tmp_path / "data", heldout_documents=4, shard_size=1000)
    assert report.heldout_documents == 4 and report.documents == 36
    assert report.heldout_instances > 0
    assert len(SplitReader(ShardIndex.load(tmp_path / "data"), "heldout")) == report.heldout_instances
    fraction = prepare_corpus(corpus, tiny_tokenizer(), tmp_path / "fraction", heldout_fraction=0.25)
    assert fraction.heldout_documents == 10
    with pytest.raises(ConfigError, match="not both"):
        prepare_corpus(corpus, tiny_tokenizer(), tmp_path / "x", heldout_fraction=0.1, heldout_documents=2)
    with pytest.raises(ConfigError, match="nothing to train"):
        prepare_corpus(corpus, tiny_tokenizer(), tmp_path / "x", heldout_documents=40)


def test_shards_bad_inputs_and_settings(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(DataError, match="no text found"):
        prepare_corpus(empty, tiny_tokenizer(), tmp_path / "data")
    corpus = write_corpus(tmp_path / "corpus.txt", documents=3)
    for bad in ({"workers": 0}, {"shard_size": 0}, {"max_seq_length": 3}, {"dupe_factor": 0}, {"seed": -1}):
        with pytest.raises(ConfigError):
            prepare_corpus(corpus, tiny_tokenizer(), tmp_path / "data", **bad)
    with pytest.raises(ConfigError, match="segmenter cannot be sent"):
        prepare_corpus(corpus, tiny_tokenizer(), tmp_path / "data", workers=2, segmenter=lambda text: [text])


def test_shards_unknown_tokens_and_empty_documents_are_reported(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Zebra quokka the cat.\nXylophone yak sat.\n\n\u200b\n\nThe dog ran.\nThe cat sat.\n")
    report = prepare_corpus(corpus, tiny_tokenizer(), tmp_path / "data")
    assert report.unk_tokens == 4
    assert report.empty_documents == 1
    assert any("[UNK]" in warning for warning in report.warnings)
    assert any("no token" in warning for warning in report.warnings)


@pytest.mark.skipif(not (DATA / "pretrain_zh").is_dir(), reason="shared pretraining data not available")
def test_shards_real_chinese_slice_with_segmenter_word_starts(tmp_path):
    lines = (DATA / "pretrain_zh" / "xiyouji.txt").read_text(encoding="utf-8").splitlines()[:80]
    corpus = tmp_path / "xiyouji_slice.txt"
    corpus.write_text("\r\n".join(lines), encoding="utf-8")
    characters = sorted({char for line in lines for char in line if "\u4e00" <= char <= "\u9fff"})
    tokenizer = tiny_tokenizer(extra=characters + list("，。：；！？“”、（）《》"))

    def pairs(text):  # a stand-in segmenter: two-character words
        return [text[i:i + 2] for i in range(0, len(text), 2)]

    report = prepare_corpus(corpus, tokenizer, tmp_path / "data", segmenter=pairs, max_seq_length=64)
    assert report.instances > 20 and report.corpus["formats"][str(corpus)] == "text"
    reader = SplitReader(ShardIndex.load(tmp_path / "data"), "train")
    ids, word_starts, _, _ = reader.instance(0)
    assert 0 < word_starts.mean() < 1  # characters were grouped into words


@pytest.mark.skipif(not (DATA / "pretrain_en").is_dir(), reason="shared pretraining data not available")
def test_shards_real_english_slice_with_bert_vocab(tmp_path, minilm_path):
    lines = (DATA / "pretrain_en" / "books" / "pg84_frankenstein.txt").read_text(encoding="utf-8").splitlines()
    corpus = tmp_path / "frankenstein_slice.txt"
    corpus.write_text("\n".join(lines[:1500]), encoding="utf-8")
    tokenizer = Tokenizer.from_pretrained(minilm_path)
    report = prepare_corpus(corpus, tokenizer, tmp_path / "data", heldout_fraction=0.1)
    assert report.instances > 100 and report.heldout_documents >= 1
    assert report.unk_tokens / max(report.tokens, 1) < 0.01


def _peak_rss_of_child(script: str, log: Path) -> tuple[float, str]:
    """Run `script` in a fresh interpreter; its peak RSS in MiB (from wait4) and its output."""
    with open(log, "w") as handle:
        process = subprocess.Popen([sys.executable, "-c", script], stdout=handle, stderr=subprocess.STDOUT)
        _, _, usage = os.wait4(process.pid, 0)
    return usage.ru_maxrss / 1024.0, log.read_text()


@pytest.mark.slow
@pytest.mark.skipif(not (DATA / "pretrain_en").is_dir(), reason="shared pretraining data not available")
def test_shards_peak_memory_does_not_grow_with_corpus_size(tmp_path, minilm_path):
    four = tmp_path / "four"
    for copy in range(4):
        (four / f"copy{copy}").parent.mkdir(parents=True, exist_ok=True)
        (four / f"copy{copy}").symlink_to(DATA / "pretrain_en", target_is_directory=True)
    script = textwrap.dedent("""
        import sys
        from bertforge.data.preparation import prepare_corpus
        from bertforge.tokenization import Tokenizer
        report = prepare_corpus(sys.argv[1], Tokenizer.from_pretrained(sys.argv[2]), sys.argv[3])
        print(report.summary())
    """)
    peaks = {}
    for name, corpus in (("one", DATA / "pretrain_en"), ("four", four)):
        run = script.replace("sys.argv[1]", repr(str(corpus))).replace("sys.argv[2]", repr(str(minilm_path)))
        run = run.replace("sys.argv[3]", repr(str(tmp_path / f"out_{name}")))
        peaks[name], output = _peak_rss_of_child(run, tmp_path / f"{name}.log")
        assert "instances" in output, output
    assert peaks["four"] / peaks["one"] <= 1.2, peaks
