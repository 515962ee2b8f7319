"""What the scheduler decides about a request before it joins the queue, in the event loop and cheaply.

Two questions are answered here without tokenizing anything:

- **Can it fit the token budget at all?** `token_floor` is a lower bound of the tokens a request makes after
  windowing, read from its characters in linear time (C-speed string operations; for plain ASCII text one
  pass of `bytes.split`; for other text first `quick_floor`, bytes passes that count ASCII words and CJK
  ideographs, and only if that is not already over the limit a regular expression). A request whose floor
  is over `max_request_tokens` is refused at once, so a refused request of megabytes costs milliseconds, not
  seconds of tokenizing and windowing on the model thread while other clients wait. The floor is exact as a
  bound, never an estimate: a request under it is windowed and counted exactly on the model thread as before.
- **When to retry a refused one?** Nothing here decides acceptance by speed: a request within the static
  limits is accepted whatever the model's speed, and only a full queue refuses (`Scheduler.submit`).
  `Throughput` keeps the recent rate of model calls (tokens per second) and `estimate_tokens` a rough size
  of a request not windowed yet, only to turn the work ahead in the queue, counted in tokens, into the
  seconds of that refusal's Retry-After.

Why the floor holds: a window holds every token of the text it windows at least once, plus [CLS] and [SEP].
Google's tokenizer splits words at its separators (`tokenization.normalizer.separator_characters`: whitespace
that cleaning keeps) and never deletes a letter, digit or underscore (cleaning deletes controls and, with
accent stripping, combining marks only). So every separator-delimited chunk holding one such character gives at
least one token. Only the families that window a text (classification, tagging, extractive QA) get a floor;
the others truncate their inputs to one window, so their size is bounded by the window anyway. Which text a
family windows is the family's to say (`Family.windowed_texts`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from bertforge.tokenization.normalizer import separator_characters

# Rough characters per token of a waiting request (English WordPiece is about 4); only for estimates.
CHARS_PER_TOKEN = 4
# Special tokens every window holds ([CLS] and [SEP]).
SPECIAL_TOKENS = 2
# The weight of the newest model call in the throughput average.
THROUGHPUT_SMOOTHING = 0.2
# Printable ASCII with tab, newline and carriage return: an ASCII text of only these has no character that
# cleaning deletes, so its `bytes.split()` chunks are exactly the tokenizer's words.
_PLAIN_ASCII = bytes(range(32, 127)) + b"\t\n\r"
_WHITESPACE_TO_SPACE = bytes.maketrans(b"\t\n\r", b"   ")
# For `quick_floor`: tab, newline and carriage return read as spaces; ASCII controls (deleted by cleaning) and
# every non-ASCII byte dropped, so a chunk left non-empty holds a printable ASCII character.
_QUICK_DELETE = bytes([*range(0, 9), 11, 12, *range(14, 32), 127, *range(128, 256)])
# UTF-8 lead bytes of U+5000..U+9FFF: CJK unified ideographs only, each one token of its own.
_CJK_LEADS = (0xE5, 0xE9)
SPACE = ord(" ")


@lru_cache(maxsize=1)
def word_pattern() -> re.Pattern[str]:
    """A chunk between separators that holds a letter, digit or underscore (matched from that character on)."""
    separators = "".join(f"\\U{ord(char):08x}" for char in separator_characters())
    return re.compile(f"\\w[^{separators}]*")


def space_chunks(raw: bytes) -> int:
    """The non-empty chunks of `raw` between spaces: the spaces followed by something else, counted in two
    vectorized passes (no bytes object per chunk)."""
    if not raw:
        return 0
    space = np.frombuffer(raw, dtype=np.uint8) == SPACE
    return int(np.count_nonzero(space[:-1] & ~space[1:])) + (not space[0])


def word_floor(text: str, enough: int | None = None) -> int:
    """At least this many WordPiece tokens come from `text` (see the module docstring); counting may stop
    once past `enough`."""
    if text.isascii():
        raw = text.encode("ascii")
        if not raw.translate(None, _PLAIN_ASCII):  # nothing deleted by cleaning: chunks are words
            if b"\t" in raw or b"\n" in raw or b"\r" in raw:  # (memchr each) other separators: as spaces
                raw = raw.translate(_WHITESPACE_TO_SPACE)
            return space_chunks(raw)
    count = 0
    for count, _ in enumerate(word_pattern().finditer(text), start=1):
        if enough is not None and count > enough:
            break
    return count


def quick_floor(text: str) -> int:
    """A lower bound of the WordPiece tokens of `text` from bytes operations only (a few C-speed passes, no
    per-character Python), weaker than `word_floor` for text without ASCII or CJK characters.

    Why it holds: splitting on ASCII separators only gives chunks that are unions of the tokenizer's words; a
    chunk holding a printable ASCII character (never deleted, never a separator) gives at least one token
    there; and a CJK ideograph is a token of its own, wherever it stands (one more than its chunk's ASCII word).
    """
    if text.isascii():
        return word_floor(text)
    raw = text.encode("utf-8")
    kept = raw.translate(_WHITESPACE_TO_SPACE, _QUICK_DELETE)
    codes = np.frombuffer(raw, dtype=np.uint8)
    return space_chunks(kept) + int(np.count_nonzero((codes >= _CJK_LEADS[0]) & (codes <= _CJK_LEADS[1])))


def token_floor(family: Any, parsed: Sequence[Any], limit: int) -> int:
    """A lower bound of the tokens `parsed` makes after windowing in `family` (0 when the family does not
    window: `Family.windowed_texts`); counting stops once past `limit`. Costs nothing for a request whose
    characters are within the limit."""
    windowed = getattr(family, "windowed_texts", None)
    if windowed is None:
        return 0
    texts = [windowed(item) for item in parsed]
    if sum(len(text) for item in texts for text in item) + SPECIAL_TOKENS * len(parsed) <= limit:
        return 0  # a token holds at least one character: this request cannot be over the limit
    # First the quick bound of every text (bytes passes: milliseconds for megabytes); only a request it
    # does not already put over the limit has its non-ASCII texts counted again by the regular expression
    # (for ASCII text the quick bound is `word_floor` already).
    quick: list[list[int]] = []
    total = 0
    for item in texts:
        quick.append([quick_floor(text) for text in item])
        total += SPECIAL_TOKENS + sum(quick[-1]) if item else 0
        if total > limit:
            return total
    floor = 0
    for item, counts in zip(texts, quick):
        if item:
            floor += SPECIAL_TOKENS + sum(count if text.isascii() else max(count, word_floor(text, limit - floor))
                                          for text, count in zip(item, counts))
        if floor > limit:
            break
    return floor


def strings_of(value: Any) -> Iterator[str]:
    """Every string inside a parsed input (a string, a dataclass, a mapping or a sequence of them)."""
    if isinstance(value, str):
        yield value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from strings_of(getattr(value, field.name))
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings_of(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from strings_of(item)


def estimate_tokens(parsed: Sequence[Any]) -> int:
    """A rough size of a request (its characters / `CHARS_PER_TOKEN`, plus the special tokens), for the
    Retry-After estimate and to skip the token floor of small requests: never used to refuse a request."""
    return sum(sum(len(text) for text in strings_of(item)) // CHARS_PER_TOKEN + SPECIAL_TOKENS for item in parsed)


class Throughput:
    """The recent speed of the model: an exponential average of tokens per second over model calls. Only for
    estimates (the Retry-After of a refusal): never to decide whether a request is accepted."""

    def __init__(self, smoothing: float = THROUGHPUT_SMOOTHING):
        self.smoothing = smoothing
        self.tokens_per_s: float | None = None  # None until a call has been timed

    def record(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        rate = tokens / seconds
        previous = self.tokens_per_s
        self.tokens_per_s = rate if previous is None else previous + self.smoothing * (rate - previous)

    def seconds_for(self, tokens: float) -> float | None:
        """Expected seconds to run `tokens` tokens at the recent rate (None before any call was timed)."""
        if self.tokens_per_s is None:
            return None
        return tokens / self.tokens_per_s
