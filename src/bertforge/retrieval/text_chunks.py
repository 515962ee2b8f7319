"""Long texts as overlapping chunks for `bertforge embed --chunk`: where each chunk starts and ends, in
tokens and in characters of the original text.

Owns: cutting one text into windows of at most `chunk` tokens that overlap by `overlap` tokens
(`chunk_spans`, the project's one windowing rule, `tokenization.windows.window_spans`, with a stride of
chunk - overlap), and mapping each window back to the characters it covers through the tokenizer's offsets,
so `text[start:end]` is exactly the chunk's text (the first character of its first token to the last of its
last token; what lies between two tokens, spaces, stays inside). A text with no token (only characters the
tokenizer drops) is one chunk spanning it all.

Late chunking (`late_chunk_vectors`, `embed --late-chunking`): the text runs through the encoder once, in
windows as long as the model's (prompt, [CLS] and [SEP] included; consecutive, not overlapping), and each
chunk's vector is the mean of its own tokens' output vectors in that pass, so every chunk has seen the
context around it. Chunks are cut inside each window (a chunk never straddles two passes).

Progress (`per_text`): `embed` shows texts done, but the model runs chunks (or late chunking's passes), more of
them than texts; each batch advances the display by its share of the texts, so a shard adds up to its texts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.errors import ConfigError
from bertforge.inference.wire_inputs import EmbedText
from bertforge.tokenization.windows import window_spans


@dataclass(frozen=True)
class Chunk:
    """One window of a text: tokens [token_start, token_end) of its encoding without special tokens, and
    characters [start, end) of the text."""

    token_start: int
    token_end: int
    start: int
    end: int


def check_chunking(chunk: int | None, overlap: int | None) -> None:
    """ConfigError for a chunk size or overlap that cannot cut a text."""
    if chunk is None:
        if overlap is not None:
            raise ConfigError("--chunk-overlap needs --chunk TOKENS (the chunk size)")
        return
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ConfigError(f"--chunk must be a positive number of tokens, got {chunk!r}")
    overlap = 0 if overlap is None else overlap
    if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap < chunk:
        raise ConfigError(f"--chunk-overlap must be at least 0 and less than --chunk ({chunk}), got {overlap!r}")


def chunk_spans(tokenizer, text: str, chunk: int, overlap: int = 0) -> list[Chunk]:
    """The chunks of `text`: windows of `chunk` tokens, each starting `chunk - overlap` tokens after the one
    before, the last ending at the last token (`window_spans`), with their character spans."""
    check_chunking(chunk, overlap)
    offsets = tokenizer.encode(text, add_special_tokens=False).offsets  # [(start, end)] per token
    if not offsets:
        return [Chunk(0, 0, 0, len(text))]
    return [Chunk(first, first + size, offsets[first][0], offsets[first + size - 1][1])
            for first, size in window_spans(len(offsets), chunk, chunk - overlap)]


def per_text(on_batch: Callable[[int], None] | None, texts: int, rows: int) -> Callable[[int], None] | None:
    """`on_batch` (told texts done) for a model run of `rows` inputs made from `texts` texts: each batch of n
    rows tells it the texts that n rows stand for, rounded down as they add up, so the last batch brings the
    sum to exactly `texts` (a progress total counts texts; counting rows ran past it)."""
    if on_batch is None or texts == rows:
        return on_batch
    ran = told = 0

    def advance(count: int) -> None:
        nonlocal ran, told
        ran += count
        now = ran * texts // rows
        if now > told:
            on_batch(now - told)
            told = now
    return advance


def late_chunk_vectors(pipeline, options: dict, prompt: str, texts: list[str], chunk: int, overlap: int = 0,
                       on_batch=None) -> tuple[np.ndarray, list[list[Chunk]], int]:
    """(vectors [rows, H] float32, each text's chunks, tokens run): late chunking of `texts` (module
    docstring) with an embed pipeline's mean pooling (`options`: its checked options; normalize applies).
    `on_batch(texts)` after each model batch, in texts (`per_text`)."""
    check_chunking(chunk, overlap)
    if options["pooling"] != "mean":
        raise ConfigError(f"late chunking averages each chunk's token vectors; it needs --pooling mean, not "
                          f"{options['pooling']!r}")
    prompt_ids = list(pipeline.tokenizer.encode(prompt, add_special_tokens=False).ids) if prompt else []
    room = pipeline.max_length - 2 - len(prompt_ids)
    if chunk > room:
        raise ConfigError(f"--chunk {chunk} does not fit one pass of {pipeline.max_length} tokens with the prompt, "
                          f"[CLS] and [SEP]; use --chunk {room} or less")
    passes, chunks = [], []  # passes: EmbedText inputs; chunks: per text, (pass, chunk)
    for text in texts:
        encoding = pipeline.tokenizer.encode(text, add_special_tokens=False)
        ids, offsets = list(encoding.ids), encoding.offsets
        if not ids:
            raise ConfigError("a text without any token cannot be late-chunked")
        mine = []
        for first, size in window_spans(len(ids), room, room):
            passes.append(EmbedText(ids=tuple(prompt_ids + ids[first:first + size])))
            for start, length in window_spans(size, chunk, chunk - overlap):
                a, b = first + start, first + start + length
                mine.append((len(passes) - 1, Chunk(a, b, offsets[a][0], offsets[b - 1][1]), first))
        chunks.append(mine)
    _, outputs = pipeline.stream(passes, {**options, "token_vectors": True},
                                 on_batch=per_text(on_batch, len(texts), len(passes)))
    shift = 1 + len(prompt_ids)  # [CLS] and the prompt come before the text's first token
    rows = []
    for mine in chunks:
        for which, c, first in mine:
            rows.append(outputs[which][shift + c.token_start - first:shift + c.token_end - first].mean(0))
    vectors = torch.stack(rows)
    if options["normalize"]:
        vectors = F.normalize(vectors, dim=-1)
    tokens = sum(len(item.ids) + 2 for item in passes)
    return vectors.numpy().astype(np.float32), [[c for _, c, _ in mine] for mine in chunks], tokens


__all__ = ["Chunk", "check_chunking", "chunk_spans", "late_chunk_vectors", "per_text"]
