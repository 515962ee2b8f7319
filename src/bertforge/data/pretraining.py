"""Documents to pretraining instances: ``[CLS] A [SEP] B [SEP]`` with a next-sentence label, or, for masked LM
alone, rows of consecutive text (`create_contiguous_instances`, RoBERTa's and ModernBERT's way).

This is the instance logic of Google's `create_pretraining_data.py` (`create_instances_from_document` and
`truncate_seq_pair`), re-implemented with the same random decisions in the same order:

- The target length is ``max_seq_length - 3``; with probability `short_seq_prob` a document uses a random
  target in ``[2, max_seq_length - 3]`` instead, so the model also sees short sequences.
- Contiguous sentences are collected into a chunk until it reaches the target; segment A is the first
  random number of sentences of the chunk.
- With probability 0.5, or when the chunk holds one sentence, segment B is taken from a random start in a
  random *other* document (NSP label 1, `NSP_IS_RANDOM`) and the chunk's unused sentences go back into the
  document for the next instance; otherwise B is the rest of the chunk (label 0, `NSP_IS_NEXT`).
- The pair is trimmed one token at a time from the longer segment, from its front or back at random.

One deliberate difference in scope: Google draws the random document from every document given to one run,
which needs the whole corpus in memory. Here the candidates are the documents of one *group* (the documents of
one output shard, a few megabytes of text, see `data.shards`), so memory is bounded whatever the corpus size.
A group holds hundreds of documents, so "another document" is still almost always another text.

Tokens travel with word-start flags (1 = first piece of a word), taken from the tokenizer's word ids or, for
Chinese whole-word masking, from a word segmenter (`jieba_segmenter` or any callable text -> words).
Functions here are pure: randomness comes only from the `random.Random` passed in.
"""

from __future__ import annotations

import logging
import random
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bertforge.constants import NSP_IS_NEXT, NSP_IS_RANDOM
from bertforge.errors import ConfigError
from bertforge.tokenization.normalizer import is_cjk
from bertforge.tokenization.postprocessor import PostProcessor

log = logging.getLogger(__name__)

Segmenter = Callable[[str], Sequence[str]]
# Tries Google makes to find a random document other than the current one before it accepts any.
RANDOM_DOCUMENT_TRIES = 10


@dataclass
class Sentence:
    """One tokenized sentence.

    Attributes:
        ids: token ids (array of int32).
        word_starts: one byte per token, 1 where a word starts (the first piece of a word).
    """

    ids: array
    word_starts: bytes

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class Instance:
    """One pretraining example, special tokens included.

    Attributes:
        ids: ``[CLS] A [SEP] B [SEP]`` token ids (int32 array), length <= max_seq_length.
        word_starts: one byte per token, 1 where a word starts; 1 for the special tokens.
        segment_b_start: index of the first token of B (token type 1 from here to the end).
        nsp_label: `NSP_IS_NEXT` (0) when B follows A in the document, `NSP_IS_RANDOM` (1) otherwise.
    """

    ids: array
    word_starts: bytes
    segment_b_start: int
    nsp_label: int


def _cjk_char(token: str) -> bool:
    return len(token) == 1 and is_cjk(ord(token))


def segment_word_starts(tokens: Sequence[str], word_starts: bytearray, words: Sequence[str]) -> None:
    """Merge single-CJK-character tokens into the words a segmenter found, in place.

    BERT makes every CJK character a word of its own; Chinese whole-word masking needs the real words. A
    multi-character word of the segmenter that appears as consecutive single-character tokens gets one word
    start (the longest match wins), as in the Chinese-BERT-wwm recipe. Matching on token strings keeps the
    token ids exactly those of the plain tokenizer.

    Args:
        tokens: the token strings of one sentence.
        word_starts: their word-start flags, updated in place.
        words: the segmenter's words for the same sentence.
    """
    vocabulary = {word for word in words if len(word) > 1 and all(is_cjk(ord(char)) for char in word)}
    if not vocabulary:
        return
    longest = max(map(len, vocabulary))
    position = 0
    while position < len(tokens):
        matched = 1
        if _cjk_char(tokens[position]):
            for length in range(min(longest, len(tokens) - position), 1, -1):
                piece = tokens[position:position + length]
                if all(map(_cjk_char, piece)) and "".join(piece) in vocabulary:
                    for inner in range(position + 1, position + length):
                        word_starts[inner] = 0
                    matched = length
                    break
        position += matched


def tokenize_document(sentences: Sequence[str], tokenizer: Any, segmenter: Segmenter | None = None) -> list[Sentence]:
    """Tokenize the sentences of one document, dropping those that produce no token.

    Args:
        sentences: the document's sentences.
        tokenizer: anything with ``encode_words(text) -> (ids, word_ids)`` (and ``convert_ids_to_tokens`` when
            a segmenter is given), e.g. `bertforge.tokenization.Tokenizer`.
        segmenter: optional ``text -> words`` callable for Chinese whole-word masking.

    Returns:
        The tokenized sentences, in order.
    """
    result = []
    for text in sentences:
        ids, word_ids = tokenizer.encode_words(text)
        if not ids:
            continue
        starts = bytearray(map(int.__ne__, word_ids, [-1, *word_ids[:-1]]))
        if segmenter is not None:
            segment_word_starts(tokenizer.convert_ids_to_tokens(ids), starts, segmenter(text))
        result.append(Sentence(array("i", ids), bytes(starts)))
    return result


def jieba_segmenter() -> Segmenter:
    """jieba's precise-mode word segmenter (``jieba.lcut``), imported only when asked for.

    jieba's dictionary is loaded here, once per process, with jieba's own log lines ("Building prefix dict
    from the default dictionary ...", "Loading model cost ...") silenced: they go to stderr through jieba's
    handler, again through the root handler of a console set up by `logging.basicConfig`, and once more in
    every `prepare --workers N` process. A run shows one line of ours instead, the first time only.

    Raises:
        ConfigError: jieba is not installed (``pip install 'bertforge[zh]'``).
    """
    try:
        import jieba  # noqa: F401
    except ImportError:
        raise ConfigError(
            "Chinese whole-word masking needs a word segmenter: install jieba (pip install 'bertforge[zh]') "
            "or pass segmenter=<your text -> words function>"
        ) from None
    seconds = _load_jieba()
    if seconds is not None:
        log.info("jieba word segmenter ready (dictionary loaded in %.1f s)", seconds)
    return JiebaSegmenter()


_JIEBA: Any = None  # the jieba module once its dictionary is loaded in this process


def _load_jieba() -> float | None:
    """Load jieba's dictionary quietly in this process; the seconds it took, or None if it was loaded already."""
    global _JIEBA
    if _JIEBA is not None:
        return None
    import jieba

    jieba.setLogLevel(logging.WARNING)
    started = time.perf_counter()
    jieba.initialize()
    _JIEBA = jieba
    return time.perf_counter() - started


class JiebaSegmenter:
    """``text -> words`` with jieba; picklable, so `prepare --workers N` sends it to worker processes, where the
    first call loads the dictionary as quietly as `jieba_segmenter` does in the main process."""

    def __init__(self) -> None:
        # The name `prepare` records in its shard settings, as it did for `jieba.lcut` itself: shards prepared
        # before this class existed still resume.
        self.__qualname__ = "Tokenizer.lcut"

    def __call__(self, text: str) -> list[str]:
        if _JIEBA is None:
            _load_jieba()
        return _JIEBA.lcut(text)


def _concatenate(sentences: Sequence[Sentence]) -> tuple[array, bytearray]:
    ids = array("i")
    starts = bytearray()
    for sentence in sentences:
        ids.extend(sentence.ids)
        starts.extend(sentence.word_starts)
    return ids, starts


def _truncate_pair(length_a: int, length_b: int, max_tokens: int, rng: random.Random) -> tuple[int, int, int, int]:
    """How many tokens to drop from the front and back of A and of B (Google's `truncate_seq_pair`).

    The longer segment loses one token per step, from the front or the back with equal chance, until the
    pair fits; only the counts are tracked so that nothing is copied per step.

    Returns:
        ``(a_front, a_back, b_front, b_back)``.
    """
    a_front = a_back = b_front = b_back = 0
    while length_a + length_b > max_tokens:
        front = rng.random() < 0.5
        if length_a > length_b:
            length_a -= 1
            a_front += front
            a_back += not front
        else:
            length_b -= 1
            b_front += front
            b_back += not front
    return a_front, a_back, b_front, b_back


def _trim(ids: array, starts: bytearray, front: int, back: int) -> tuple[array, bytearray]:
    end = len(ids) - back
    return ids[front:end], starts[front:end]


def create_instances(
    documents: Sequence[Sequence[Sentence]],
    document_index: int,
    *,
    max_seq_length: int,
    short_seq_prob: float,
    special: PostProcessor,
    rng: random.Random,
) -> list[Instance]:
    """All instances of one document (Google's `create_instances_from_document`).

    Args:
        documents: the tokenized documents random segments B may come from (the current group).
        document_index: which of them to turn into instances.
        max_seq_length: the longest instance, special tokens included (>= 5).
        short_seq_prob: the chance that this document uses a random shorter target length.
        special: the tokenizer's post-processor, which lays out ``[CLS] A [SEP] B [SEP]``.
        rng: the only source of randomness.

    Returns:
        The instances, in document order.
    """
    document = documents[document_index]
    max_tokens = max_seq_length - 3
    target_length = max_tokens
    if rng.random() < short_seq_prob:
        target_length = rng.randint(2, max_tokens)
    instances = []
    chunk: list[Sentence] = []
    chunk_length = 0
    position = 0
    while position < len(document):
        chunk.append(document[position])
        chunk_length += len(document[position])
        if position == len(document) - 1 or chunk_length >= target_length:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            ids_a, starts_a = _concatenate(chunk[:a_end])
            if len(chunk) == 1 or rng.random() < 0.5:
                nsp_label = NSP_IS_RANDOM
                target_b_length = target_length - len(ids_a)
                for _ in range(RANDOM_DOCUMENT_TRIES):
                    random_index = rng.randint(0, len(documents) - 1)
                    if random_index != document_index:
                        break
                random_document = documents[random_index]
                random_start = rng.randint(0, len(random_document) - 1)
                taken = []
                taken_length = 0
                for sentence in random_document[random_start:]:
                    taken.append(sentence)
                    taken_length += len(sentence)
                    if taken_length >= target_b_length:
                        break
                ids_b, starts_b = _concatenate(taken)
                # The sentences of the chunk not used for A go back for the next instance.
                position -= len(chunk) - a_end
            else:
                nsp_label = NSP_IS_NEXT
                ids_b, starts_b = _concatenate(chunk[a_end:])
            a_front, a_back, b_front, b_back = _truncate_pair(len(ids_a), len(ids_b), max_tokens, rng)
            ids_a, starts_a = _trim(ids_a, starts_a, a_front, a_back)
            ids_b, starts_b = _trim(ids_b, starts_b, b_front, b_back)
            ids = array("i", special.assemble(ids_a, ids_b)[0])
            segment_b_start = len(ids_a) + special.added(False)  # after [CLS] A [SEP]
            word_starts = b"\x01" + bytes(starts_a) + b"\x01" + bytes(starts_b) + b"\x01"
            instances.append(Instance(ids, word_starts, segment_b_start, nsp_label))
            chunk = []
            chunk_length = 0
        position += 1
    return instances


def create_contiguous_instances(documents: Sequence[Sequence[Sentence]], *, max_seq_length: int,
                                special: PostProcessor) -> list[Instance]:
    """Rows of consecutive text for masked LM alone (RoBERTa's FULL-SENTENCES, as ModernBERT trains): no
    sentence pairs, no NSP label.

    The documents' tokens run on in order, one ``[SEP]`` between two documents, and are cut every
    ``max_seq_length - 2`` tokens, across sentence and document boundaries, into ``[CLS] chunk [SEP]``: every
    row is full but the last of the documents given (one group: a shard's text), so no step pays for padding
    inside the text. A chunk that would begin with the separator begins after it (its ``[CLS]`` marks the
    start), and a chunk's first token counts as a word start (whole-word masking) even inside a word.

    Args:
        documents: the tokenized documents, in order.
        max_seq_length: the length of every row but the last, special tokens included (>= 3).
        special: the tokenizer's post-processor.

    Returns:
        Instances whose segment B is empty (`segment_b_start` = the row's length: token types all 0) and whose
        `nsp_label` is `NSP_IS_NEXT`, a placeholder no objective reads (NSP refuses these shards).
    """
    width = max_seq_length - special.added(False)
    ids, starts = array("i"), bytearray()
    separators = set()  # where a document separator was put (the text itself may hold [SEP]'s id)
    for document in documents:
        if ids and document:
            separators.add(len(ids))
            ids.append(special.sep_id)
            starts.append(1)
        for sentence in document:
            ids.extend(sentence.ids)
            starts.extend(sentence.word_starts)
    instances = []
    position = 0
    while position < len(ids):
        if position in separators:
            position += 1
            continue
        chunk, chunk_starts = ids[position:position + width], bytearray(starts[position:position + width])
        chunk_starts[0] = 1
        row = array("i", special.ids(chunk))
        instances.append(Instance(row, b"\x01" + bytes(chunk_starts) + b"\x01", len(row), NSP_IS_NEXT))
        position += width
    return instances


def validate_instance_settings(max_seq_length: int, short_seq_prob: float, dupe_factor: int) -> None:
    """Check the instance settings; raise ConfigError naming the field and the allowed range."""
    if isinstance(max_seq_length, bool) or not isinstance(max_seq_length, int) or max_seq_length < 5:
        raise ConfigError(f"max_seq_length must be an integer >= 5 ([CLS] A [SEP] B [SEP]), got {max_seq_length!r}")
    if isinstance(short_seq_prob, bool) or not isinstance(short_seq_prob, int | float) \
            or not 0.0 <= short_seq_prob <= 1.0:
        raise ConfigError(f"short_seq_prob must be a probability in [0, 1], got {short_seq_prob!r}")
    if isinstance(dupe_factor, bool) or not isinstance(dupe_factor, int) or dupe_factor < 1:
        raise ConfigError(f"dupe_factor must be a positive integer, got {dupe_factor!r}")
