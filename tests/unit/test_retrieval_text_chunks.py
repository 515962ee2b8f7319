"""`bertforge embed --chunk`: long texts cut into overlapping token windows whose character spans map back to
exactly the chunk's text; one row per chunk, with its record's id; search returns each hit's span."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertforge import cli
from bertforge.errors import ConfigError
from bertforge.inference.pipelines import load_pipeline
from bertforge.inference.wire_inputs import EmbedText
from bertforge.retrieval import embed_corpus as E
from bertforge.retrieval import store
from bertforge.retrieval import vector_search as S
from bertforge.retrieval.text_chunks import chunk_spans
from bertforge.tokenization import Tokenizer

TEXT = ("The lighthouse keeper's log, kept since 1887, records storms, ships and birds. "
        "On the night of the great gale, the lamp failed twice; the keeper climbed   the tower in the dark. "
        "Naïve visitors ask whether it is haunted: no, says the log, only draughty.")


@pytest.fixture(scope="module")
def tokenizer(tiny_minilm_model):
    return Tokenizer.from_pretrained(tiny_minilm_model)


def test_text_chunks_spans_map_back_to_the_exact_substring_of_each_window(tokenizer):
    encoding = tokenizer.encode(TEXT, add_special_tokens=False)
    offsets, tokens = encoding.offsets, encoding.tokens
    chunks = chunk_spans(tokenizer, TEXT, 16, 4)
    assert len(chunks) == 1 + -(-(len(tokens) - 16) // 12)  # windows 12 tokens apart, the last ends at the end
    assert [c.token_start for c in chunks[:-1]] == list(range(0, 12 * (len(chunks) - 1), 12))
    assert chunks[-1].token_end == len(tokens) and all(c.token_end - c.token_start == 16 for c in chunks[:-1])
    assert chunks[0].start == 0 and chunks[-1].end == len(TEXT)
    whole_words = 0
    for chunk in chunks:
        assert (chunk.start, chunk.end) == (offsets[chunk.token_start][0], offsets[chunk.token_end - 1][1])
        if not tokens[chunk.token_start].startswith("##"):  # a window starting at a word: its substring
            whole_words += 1                                # tokenizes to exactly the window's tokens
            assert tokenizer.encode(TEXT[chunk.start:chunk.end], add_special_tokens=False).tokens == \
                tokens[chunk.token_start:chunk.token_end]
    assert whole_words >= 2
    assert chunk_spans(tokenizer, "short text", 16)[0].end == len("short text")
    assert len(chunk_spans(tokenizer, "short text", 16)) == 1
    with pytest.raises(ConfigError, match="less than --chunk"):
        chunk_spans(tokenizer, TEXT, 8, 8)


def test_text_chunks_embed_writes_a_row_per_chunk_and_search_returns_the_span(tiny_minilm_model, tmp_path, capsys):
    texts = [TEXT, "A short line about the sea.", TEXT.upper()]
    (tmp_path / "c.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    manifest = E.embed_corpus(tiny_minilm_model, tmp_path / "c.txt", tmp_path / "v", device="cpu", shard_size=2, embedding=E.EmbedSettings(normalize=True, chunk=20, chunk_overlap=5))
    tokenizer = Tokenizer.from_pretrained(tiny_minilm_model)
    expected = [(number, c) for number, text in enumerate(texts) for c in chunk_spans(tokenizer, text, 20, 5)]
    assert store.embed_settings(manifest).chunking == {"chunk": 20, "chunk_overlap": 5, "late": False} and manifest["count"] == len(expected)
    index = S.VectorIndex(tmp_path / "v")
    rows = np.arange(index.count)[None, :]
    assert index.spans_at(rows)[0] == [[number, c.start, c.end] for number, c in expected]
    assert index.ids_at(rows)[0] == [str(number + 1) for number, _ in expected]  # the record's id (its line)
    # each row's vector is its chunk's text embedded alone
    pipeline = load_pipeline(tiny_minilm_model, "embed", device="cpu")
    alone = pipeline.encode([texts[number][c.start:c.end] for number, c in expected], normalize=True)
    np.testing.assert_allclose(np.concatenate([np.load(tmp_path / "v" / s["vectors"]) for s in index.shards]),
                               alone, atol=1e-5)
    query = texts[0][expected[1][1].start:expected[1][1].end]
    assert cli.main(["search", "--index", str(tmp_path / "v"), "--query", query, "--top-k", "2", "--show-text",
                     "--device", "cpu"]) == 0
    best = json.loads(capsys.readouterr().out)["hits"][0]
    assert best["id"] == "1" and best["span"] == [expected[1][1].start, expected[1][1].end]
    assert best["text"] == query == texts[0][best["span"][0]:best["span"][1]]
    # a resume with another chunking is refused, naming it
    with pytest.raises(ConfigError, match="chunk 20 -> 30; chunk_overlap 5 -> 0"):
        E.embed_corpus(tiny_minilm_model, tmp_path / "c.txt", tmp_path / "v", device="cpu", shard_size=2, embedding=E.EmbedSettings(normalize=True, chunk=30))
    with pytest.raises(ConfigError, match="does not fit the model's window"):
        E.embed_corpus(tiny_minilm_model, tmp_path / "c.txt", tmp_path / "w", device="cpu", embedding=E.EmbedSettings(chunk=10_000))


def test_text_chunks_late_chunking_pools_each_chunk_from_one_pass_over_its_window(tiny_minilm_model, tmp_path):
    texts = [TEXT, "A short line about the sea."]
    (tmp_path / "c.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    manifest = E.embed_corpus(tiny_minilm_model, tmp_path / "c.txt", tmp_path / "v", device="cpu", max_length=24, embedding=E.EmbedSettings(normalize=True, chunk=8, chunk_overlap=2, late_chunking=True))
    pipeline = load_pipeline(tiny_minilm_model, "embed", device="cpu", max_length=24)
    tokens = pipeline.tokenizer.encode(TEXT, add_special_tokens=False).tokens
    assert len(tokens) > 44  # the long text takes three passes of 22 tokens
    index = S.VectorIndex(tmp_path / "v")
    spans = index.spans_at(np.arange(index.count)[None, :])[0]
    assert store.embed_settings(manifest).chunking["late"] and [s[0] for s in spans].count(1) == 1
    vectors = np.load(tmp_path / "v" / index.shards[0]["vectors"])
    # chunk by chunk: the mean of its tokens' vectors in the pass over its 22-token window, normalized
    options = pipeline.check_options({"normalize": True})
    checked = 0
    encoding = pipeline.tokenizer.encode(TEXT, add_special_tokens=False)
    offsets = encoding.offsets
    for first in range(0, len(tokens), 22):
        ids = encoding.ids[first:first + 22]
        hidden = np.asarray(pipeline.run_parsed([EmbedText(ids=tuple(ids))], {**options, "token_vectors": True})[0]
                            ["embedding"])  # [CLS] + 22 tokens + [SEP]
        for row, (record, start, end) in enumerate(spans):
            a = next(i for i, o in enumerate(offsets) if o[0] == start)
            b = next(i for i, o in enumerate(offsets) if o[1] == end and i >= a) + 1
            if record == 0 and first <= a < first + 22:
                mean = hidden[1 + a - first:1 + b - first].mean(0)
                np.testing.assert_allclose(vectors[row], mean / np.linalg.norm(mean), atol=1e-5)
                assert TEXT[start:end] and b - a <= 8
                checked += 1
    assert checked == sum(1 for s in spans if s[0] == 0) >= 6
    alone = pipeline.encode([TEXT[spans[1][1]:spans[1][2]]], normalize=True)[0]
    assert float(alone @ vectors[1]) < 0.9999  # the chunk saw its context: not the chunk embedded alone
    with pytest.raises(ConfigError, match="add --chunk TOKENS"):
        E.embed_corpus(tiny_minilm_model, tmp_path / "c.txt", tmp_path / "w", device="cpu", embedding=E.EmbedSettings(late_chunking=True))


class CountingProgress:
    """An `embed_corpus.EmbedProgress` that keeps what it is told: the total, and every advance."""

    def __init__(self) -> None:
        self.total, self.done, self.advances = None, None, []

    def start(self, total: int, done: int) -> None:
        self.total, self.done = total, done

    def advance(self, texts: int) -> None:
        self.advances.append(texts)

    def truncated(self, texts: int) -> None:
        raise AssertionError(f"{texts} chunks cut: a chunk fits the window")


def test_text_chunks_progress_counts_texts_not_chunks(tiny_minilm_model, tmp_path):
    texts = [TEXT, "A short line about the sea.", TEXT.upper()]  # the long ones make several chunks each
    (tmp_path / "c.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    for name, options in (("chunk", {}), ("late", {"late_chunking": True})):
        progress = CountingProgress()
        manifest = E.embed_corpus(tiny_minilm_model, tmp_path / "c.txt", tmp_path / name, device="cpu",
                                  shard_size=2, batch_size=2, max_length=24,
                                  progress=progress, embedding=E.EmbedSettings(chunk=8, chunk_overlap=2, **options))
        assert manifest["count"] > 2 * len(texts)  # more rows than texts: the bar must not count rows
        assert (progress.total, progress.done) == (len(texts), 0)
        assert sum(progress.advances) == len(texts), (name, progress.advances)
        assert len(progress.advances) >= 2 and all(step > 0 for step in progress.advances)
