"""Training a WordPiece vocabulary on our own normalisation and pre-tokenisation.

The `tokenizers` library's WordPiece trainer does the counting and merging (fast, in Rust), but it never sees
raw text: every line is first normalised and split into words by `PreTokenizer` (Google's cleaning, casing,
accent stripping, CJK isolation and punctuation splitting), and the trainer gets those words joined by
spaces with a plain whitespace splitter. So the vocabulary is learned from exactly the words `Tokenizer`
will later segment, with none of the Rust normaliser's differences (it drops every ``C*`` character and
shifts a CJK range).

The vocabulary lists ``[PAD]``, then ``[unused0]`` .. ``[unusedN-1]`` (room for task tokens later, as in
Google's vocabularies), then ``[UNK]``, ``[CLS]``, ``[SEP]``, ``[MASK]``, then the learned tokens in a
canonical order (`canonical_order`), so that the same pieces always get the same ids.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from bertforge.constants import CLS_TOKEN, MASK_TOKEN, PAD_TOKEN, SEP_TOKEN, UNK_TOKEN
from bertforge.errors import ConfigError, DataError
from bertforge.tokenization.normalizer import Normalizer
from bertforge.tokenization.pretokenizer import PreTokenizer
from bertforge.tokenization.tokenizer import Tokenizer
from bertforge.tokenization.vocab import Vocab
from bertforge.tokenization.wordpiece import CONTINUATION_PREFIX

# How many distinct characters the trainer keeps as single-character tokens. English: roughly what Google's
# English vocabularies hold; Chinese: every character seen, so no ideograph of the corpus becomes [UNK].
ALPHABET_LIMITS: dict[str, int | None] = {"en": 1000, "zh": None}


def build_vocab(
    files_or_texts: Iterable[str | os.PathLike],
    vocab_size: int,
    *,
    do_lower_case: bool = True,
    strip_accents: bool | None = None,
    tokenize_chinese_chars: bool = True,
    lang: str = "en",
    min_frequency: int = 2,
    num_unused: int = 0,
    limit_alphabet: int | None = None,
    show_progress: bool = False,
) -> Vocab:
    """Learn a WordPiece vocabulary from text.

    Args:
        files_or_texts: each item is a file (a `pathlib.Path`/`os.PathLike`, or a `str` without a newline
            that names an existing file; read as UTF-8, line by line) or else a text.
        vocab_size: total size, special and unused tokens included.
        do_lower_case, strip_accents, tokenize_chinese_chars: the normalisation (use the same values in the
            `TokenizerConfig` that goes with the vocabulary).
        lang: ``"en"`` keeps the 1000 most frequent characters; ``"zh"`` keeps every character seen.
        min_frequency: a pair must occur this often to be merged into a longer token.
        num_unused: ``[unusedK]`` placeholders reserved after ``[PAD]``.
        limit_alphabet: override the language's character limit (None: use `lang`'s).
        show_progress: let the trainer draw progress bars.

    Returns:
        The vocabulary, ids in the order described in the module docstring.

    Raises:
        ConfigError: an argument is out of range. DataError: a file is missing or not UTF-8.
    """
    from tokenizers import Tokenizer as TrainerTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    if lang not in ALPHABET_LIMITS:
        raise ConfigError(f"lang must be one of {sorted(ALPHABET_LIMITS)}, got {lang!r}")
    if num_unused < 0:
        raise ConfigError(f"num_unused must be >= 0, got {num_unused}")
    unused = [f"[unused{index}]" for index in range(num_unused)]
    specials = [PAD_TOKEN, *unused, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN]
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= len(specials):
        raise ConfigError(
            f"vocab_size must be an integer larger than the {len(specials)} special and unused tokens, "
            f"got {vocab_size!r}"
        )
    if min_frequency < 1:
        raise ConfigError(f"min_frequency must be >= 1, got {min_frequency}")
    pretokenizer = PreTokenizer(Normalizer(do_lower_case, strip_accents), tokenize_chinese_chars)
    options = {
        "vocab_size": vocab_size,
        "min_frequency": min_frequency,
        "special_tokens": specials,
        "continuing_subword_prefix": CONTINUATION_PREFIX,
        "show_progress": show_progress,
    }
    alphabet = limit_alphabet if limit_alphabet is not None else ALPHABET_LIMITS[lang]
    if alphabet is not None:
        options["limit_alphabet"] = alphabet
    trainer = trainers.WordPieceTrainer(**options)
    model = TrainerTokenizer(
        models.WordPiece(unk_token=UNK_TOKEN, continuing_subword_prefix=CONTINUATION_PREFIX)
    )
    # Our words never contain whitespace, so splitting on it hands the trainer exactly our words.
    model.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    lines = (" ".join(pretokenizer.words(line)) for line in _lines(files_or_texts))
    model.train_from_iterator(lines, trainer=trainer)
    learned = model.get_vocab()
    tokens = sorted(learned, key=learned.__getitem__)
    if tokens[: len(specials)] != specials:
        raise RuntimeError(
            f"the WordPiece trainer did not put the special tokens first: {tokens[: len(specials)]}"
        )
    return Vocab(specials + canonical_order(tokens[len(specials):]))


def canonical_order(pieces: list[str]) -> list[str]:
    """The learned pieces in an order that depends only on which pieces there are.

    The trainer numbers pieces in hash-map order, which changes from one process to the next (upstream:
    huggingface/tokenizers#1794), so the same corpus gave the same pieces under different ids. WordPiece
    segmentation depends only on the set, so fixing the order costs nothing: single characters first, then
    ``##`` characters, then longer word-initial pieces, then longer ``##`` pieces, each group by code point.
    """
    def key(piece: str) -> tuple[int, str]:
        continuation = piece.startswith(CONTINUATION_PREFIX) and len(piece) > len(CONTINUATION_PREFIX)
        body = piece[len(CONTINUATION_PREFIX):] if continuation else piece
        return (0 if len(body) == 1 else 2) + int(continuation), piece

    return sorted(pieces, key=key)


def unk_rate(tokenizer: Tokenizer, texts: Iterable[str]) -> float:
    """Fraction of the tokens of `texts` that are the unknown token (0.0 when there are no tokens)."""
    unk = tokenizer.unk_token_id
    unknown = 0
    total = 0
    for text in texts:
        ids, _ = tokenizer.encode_words(text)
        total += len(ids)
        unknown += ids.count(unk)
    return unknown / total if total else 0.0


def _lines(files_or_texts: Iterable[str | os.PathLike]) -> Iterator[str]:
    """Lines of every file and text, in order."""
    if isinstance(files_or_texts, (str, os.PathLike)):
        files_or_texts = [files_or_texts]
    for item in files_or_texts:
        if isinstance(item, os.PathLike):
            yield from _file_lines(Path(item))
        elif not isinstance(item, str):
            raise DataError(f"build_vocab takes file paths or texts, got {type(item).__name__}")
        elif "\n" not in item and os.path.isfile(item):
            yield from _file_lines(Path(item))
        else:
            yield from item.split("\n")


def _file_lines(path: Path) -> Iterator[str]:
    """Lines of a UTF-8 file; errors name the file (and line)."""
    try:
        stream = path.open("rb")
    except OSError as error:
        raise DataError(f"cannot read the training text ({error.strerror})", path) from None
    with stream:
        # Decoding line by line (not through a text stream's read-ahead) pins an error to its line.
        for number, raw in enumerate(stream, start=1):
            try:
                # A byte-order mark opening the file (Windows editors write one) is not text.
                yield raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError:
                raise DataError("not valid UTF-8", path, number) from None
