"""The BERT tokenizer: Google-exact WordPiece ids with character offsets, pairs, truncation and padding.

`Tokenizer` reproduces Google's original `FullTokenizer` (see `normalizer`, `pretokenizer`, `wordpiece`) and
adds what fine-tuning and serving need: exact character offsets into the original text, word ids, the
``[CLS] A [SEP] B [SEP]`` layout, truncation and padding (`encoding`), decoding, and `save_pretrained` /
`from_pretrained` on a directory that Hugging Face `transformers` also loads (`tokenizer_files`). Long
inputs that must be kept whole are windowed by `pairs.pair_windows`, from the token ids this class gives.

Speed comes from caching, not from approximations: text is cut into chunks (runs between separators, see
`pretokenizer`) with one regular expression, and the full analysis of a chunk (ids, word boundaries, offsets
relative to the chunk) is memoised, so a repeated word costs one dict lookup. Token spans travel as flat
lists of ints (no tuple per token for the garbage collector to walk), `Encoding` lays out the lists a caller
reads when read, and `encode_batch` pauses the garbage collector, whose collections otherwise cost a batch of
a book's lines about a fifth more time. Strings such as ``"[SEP]"``
inside raw text are ordinary text (Google's behaviour): raw input never injects control tokens.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Sequence
from itertools import accumulate, chain
from operator import itemgetter
from typing import Any

from bertforge.errors import ConfigError, InputError
from bertforge.tokenization.batch_encoding import BatchEncoding, as_batch, batch_encoding
from bertforge.tokenization.encoding import (
    Encoding,
    Padding,
    SequenceTokens,
    Truncation,
    assemble,
    check_padding,
    check_truncation,
    pad,
    truncate,
)
from bertforge.tokenization.normalizer import Normalizer
from bertforge.tokenization.postprocessor import PostProcessor
from bertforge.tokenization.pretokenizer import SIMPLE_WORD, PreTokenizer, is_simple
from bertforge.tokenization.tokenizer_files import (
    SPECIAL_FIELDS,
    TokenizerConfig,
    read_directory,
    write_directory,
)
from bertforge.tokenization.vocab import Vocab
from bertforge.tokenization.wordpiece import CONTINUATION_PREFIX, WordPiece

# Memoised chunks / words before the caches are emptied (bounded memory on endless corpora).
CACHE_LIMIT = 500_000


class _Memo(dict):
    """A dict that fills itself from a function on a miss and empties itself when full."""

    __slots__ = ("_compute", "_limit")

    def __init__(self, compute: Callable[[str], Any], limit: int = CACHE_LIMIT):
        super().__init__()
        self._compute = compute
        self._limit = limit

    def __missing__(self, key: str) -> Any:
        if len(self) >= self._limit:
            self.clear()
        value = self._compute(key)
        self[key] = value
        return value


# Per chunk: token ids, 1 where a token starts a word, token starts and ends relative to the chunk, and the
# chunk's length when it is a single token covering all of it (else 0). The spans are flat: start, end of the
# first token, start, end of the second, ... (one tuple of ints; shifting all of them by a base is one map).
ChunkAnalysis = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]

_ids_of = itemgetter(0)
_flags_of = itemgetter(1)


def _analysis(ids: list[int], flags: list[int], spans: list[int]) -> ChunkAnalysis:
    whole = spans[1] if len(ids) == 1 and spans[0] == 0 else 0
    return tuple(ids), tuple(flags), tuple(spans), whole


class SequenceEncoder:
    """What every tokenizer does after tokenizing: one text or a pair fitted to a length, laid out by the
    post-processor (``[CLS] A [SEP] B [SEP]``), padded, batched, and called as transformers' tokenizers are.

    A subclass supplies `_encode_sequence` (ids, absolute spans and word starts of one text, no special
    tokens), `post_processor`, `config` (`model_max_length`, `pad_token`), `_id_to_token` and `_pad_id`:
    Google's WordPiece (`Tokenizer`) and a `tokenizer.json` run by the `tokenizers` library
    (`tokenizer_json.JsonTokenizer`) share this, so both lay out, cut and pad alike.
    """

    post_processor: PostProcessor
    config: Any
    _id_to_token: Sequence[str]
    _pad_id: int

    def _encode_sequence(self, text: str) -> SequenceTokens:
        raise NotImplementedError

    def mask_token_strips(self) -> tuple[bool, bool]:
        """(left, right): whether the mask token written in text takes the spaces before (after) it with it, as
        transformers' tokenizers read it (a tokenizer.json's `lstrip` / `rstrip`); WordPiece drops spaces anyway."""
        return False, False

    # ------------------------------------------------------------------------------------- encoding
    def encode(
        self,
        text: str,
        pair: str | None = None,
        *,
        add_special_tokens: bool = True,
        max_length: int | None = None,
        truncation: Truncation | bool | None = None,
        padding: Padding | bool = False,
        pad_to: int | None = None,
    ) -> Encoding:
        """Encode a text, or a pair as ``[CLS] A [SEP] B [SEP]``.

        Args:
            text: first sequence (raw text).
            pair: optional second sequence.
            add_special_tokens: add ``[CLS]``/``[SEP]``.
            max_length: length limit including special tokens. Defaults to `model_max_length` when truncation
                is requested; without truncation, exceeding an explicit `max_length` is an error (never a
                silent cut).
            truncation: ``"longest_first"`` (or True) removes tokens one at a time from the end of the longer
                sequence (the second on ties, as Google's fine-tuning code does); ``"only_first"`` /
                ``"only_second"`` shorten one side only. To keep a long input whole in several windows,
                encode without special tokens and use `tokenization.pairs.pair_windows`.
            padding: ``"max_length"`` pads to `pad_to`, else `max_length`, else `model_max_length`;
                ``"longest"`` (or True) pads to the longest encoding of an `encode_batch` call (one text
                is its own longest).
            pad_to: explicit target length for ``padding="max_length"``.

        Raises:
            InputError: the input is too long without truncation, the budget left after special tokens and
                the untruncated side is empty, or an option is invalid.
        """
        if pair is None and max_length is None and not (truncation or padding):
            return self._encode_plain(text, add_special_tokens)  # the common single-text call
        first = self._encode_sequence(text)
        truncation = check_truncation(truncation)
        padding = check_padding(padding)
        second = self._encode_sequence(pair) if pair is not None else None
        special = self.post_processor.added(second is not None) if add_special_tokens else 0
        first, second = truncate(first, second, special=special, max_length=max_length, truncation=truncation,
                                 default_length=self.config.model_max_length)
        encoding = assemble(self.post_processor, self._id_to_token, first, second, add_special_tokens)
        if padding == "max_length":
            self._pad(encoding, pad_to or max_length or self.config.model_max_length)
        return encoding

    def _encode_plain(self, text: str, add_special_tokens: bool) -> Encoding:
        """`encode` of one text with nothing to cut or pad (no pair, no length limit, no padding)."""
        return assemble(self.post_processor, self._id_to_token, self._encode_sequence(text), None, add_special_tokens)

    def encode_batch(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        *,
        add_special_tokens: bool = True,
        max_length: int | None = None,
        truncation: Truncation | bool | None = None,
        padding: Padding | bool = False,
        pad_to: int | None = None,
    ) -> list[Encoding]:
        """`encode` over a batch; ``padding="longest"`` pads every encoding to the longest.

        The cyclic garbage collector is paused for the batch (its state restored after): each text allocates
        a few lists, none in a reference cycle, and the collections they trigger, each walking every encoding
        made so far, cost a batch of a book's lines 20-25% more time (benchmarks/tokenizer_speed.py). (A
        `contextlib.contextmanager` around the loop measured slower than this try/finally on CPython 3.11,
        0.62 against 0.39 CPU seconds for one book.)

        Raises:
            InputError: `pairs` is given with a different length than `texts`, or as for `encode`.
        """
        if isinstance(texts, str):
            raise InputError("encode_batch takes a list of texts; use encode for a single text")
        if pairs is not None and len(pairs) != len(texts):
            raise InputError(f"encode_batch got {len(texts)} texts but {len(pairs)} pairs; they must match")
        padding = check_padding(padding)
        per_item_padding: Padding | bool = "max_length" if padding == "max_length" else False
        collecting = gc.isenabled()
        gc.disable()
        try:
            if pairs is None and max_length is None and not (truncation or per_item_padding):
                plain = self._encode_plain  # the common batch: single texts, nothing to cut or pad
                encodings = [plain(text, add_special_tokens) for text in texts]
            else:
                encodings = [
                    self.encode(
                        text,
                        None if pairs is None else pairs[position],
                        add_special_tokens=add_special_tokens,
                        max_length=max_length,
                        truncation=truncation,
                        padding=per_item_padding,
                        pad_to=pad_to,
                    )
                    for position, text in enumerate(texts)
                ]
        finally:
            if collecting:
                gc.enable()
        if padding == "longest" and encodings:
            target = max(len(encoding) for encoding in encodings)
            for encoding in encodings:
                self._pad(encoding, target)
        return encodings

    def __call__(
        self,
        text: str | Sequence[str],
        text_pair: str | Sequence[str] | None = None,
        *,
        add_special_tokens: bool = True,
        padding: Padding | bool = False,
        truncation: Truncation | bool | None = None,
        max_length: int | None = None,
        return_tensors: str | None = None,
    ) -> BatchEncoding:
        """Model inputs as transformers' tokenizers give them: ``model(**tokenizer("text", return_tensors="pt"))``.

        Args:
            text: a text or a list of texts; text_pair: its pair text (or one per text).
            padding, truncation, max_length, add_special_tokens: as for `encode_batch`.
            return_tensors: None for lists (flat lists for one text), "pt" for torch or "np" for numpy
                [B, T] int64 arrays (one text is a batch of one).

        Returns:
            `BatchEncoding` with ``input_ids``, ``token_type_ids`` and ``attention_mask``.
        """
        texts, pairs, single = as_batch(text, text_pair)
        encodings = self.encode_batch(texts, pairs, add_special_tokens=add_special_tokens, max_length=max_length,
                                      truncation=truncation, padding=padding)
        return batch_encoding(encodings, single, return_tensors)

    def _pad(self, encoding: Encoding, target: int) -> None:
        pad(encoding, target, self._pad_id, self.config.pad_token)



class Tokenizer(SequenceEncoder):
    """Google BERT tokenizer with offsets.

    Args:
        vocab: the WordPiece vocabulary; must contain every special token of `config`.
        config: normalisation and special-token settings (defaults: uncased, Google's 200-character cap).

    Raises:
        ConfigError: a special token of `config` is not in `vocab`.
    """

    def __init__(self, vocab: Vocab, config: TokenizerConfig | None = None):
        self.vocab = vocab
        self.config = config if config is not None else TokenizerConfig()
        missing = [
            getattr(self.config, name) for name in SPECIAL_FIELDS if getattr(self.config, name) not in vocab
        ]
        if missing:
            raise ConfigError(
                f"special tokens {missing} are not in the vocabulary ({len(vocab)} tokens); add them to "
                "vocab.txt or set the matching *_token fields in tokenizer_config.json"
            )
        if vocab.unk_token != self.config.unk_token:
            vocab = Vocab(vocab.tokens, unk_token=self.config.unk_token)
            self.vocab = vocab
        normalizer = Normalizer(self.config.do_lower_case, self.config.strip_accents)
        self._pretokenizer = PreTokenizer(normalizer, self.config.tokenize_chinese_chars)
        self._chunk_finditer = self._pretokenizer.chunk_re.finditer
        self._chunk_findall = self._pretokenizer.chunk_re.findall
        # Lower-casing ASCII text up front is safe (one character to one, no context) and merges cache keys.
        self._lower_ascii = self.config.do_lower_case
        self._wordpiece = WordPiece(vocab.as_dict(), vocab.unk_id, self.config.max_input_chars_per_word)
        self._id_to_token = vocab.tokens
        self._cls_id = vocab[self.config.cls_token]
        self._sep_id = vocab[self.config.sep_token]
        # The special-token layout ([CLS] A [SEP] B [SEP]) of this vocabulary, made once: encode uses it per call.
        self.post_processor = PostProcessor(self._cls_id, self._sep_id)
        self._pad_id = vocab[self.config.pad_token]
        self._words = _Memo(self._analyze_word)
        self._chunks = _Memo(self._analyze_chunk)

    # ----------------------------------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, *, do_lower_case: bool | None = None) -> Tokenizer:
        """Load from a directory holding `vocab.txt` and `tokenizer_config.json` (ours or Hugging Face's).

        A Google release directory (`vocab.txt` and `bert_config.json`, no tokenizer config) records no
        casing: it follows Google's rule on the directory name (`google_do_lower_case`: `uncased_...`,
        `chinese_...`, `multilingual_L...` lower-case, `cased_...`, `multi_cased_...` do not, otherwise the
        default, lower-case) and logs the choice. `do_lower_case` overrides the casing of any directory.

        Raises:
            CheckpointError: the directory or one of the files is missing. DataError / ConfigError: a file is
            malformed (the message names it).
        """
        vocab, config = read_directory(directory, do_lower_case)
        try:
            return cls(vocab, config)
        except ConfigError as error:
            raise ConfigError(f"{directory}: {error}") from None

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write `vocab.txt`, `tokenizer_config.json` and `special_tokens_map.json` (each atomically)."""
        write_directory(directory, self.vocab, self.config)

    # ------------------------------------------------------------------------------------- properties
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def model_max_length(self) -> int:
        return self.config.model_max_length

    @property
    def pad_token_id(self) -> int:
        return self.vocab[self.config.pad_token]

    @property
    def unk_token_id(self) -> int:
        return self.vocab[self.config.unk_token]

    @property
    def cls_token_id(self) -> int:
        return self.vocab[self.config.cls_token]

    @property
    def sep_token_id(self) -> int:
        return self.vocab[self.config.sep_token]

    @property
    def mask_token_id(self) -> int:
        return self.vocab[self.config.mask_token]

    @property
    def all_special_ids(self) -> list[int]:
        """Ids of the five special tokens, ascending."""
        return sorted({self.vocab[getattr(self.config, name)] for name in SPECIAL_FIELDS})

    # ---------------------------------------------------------------------------------- tokenization
    def _analyze_word(self, word: str) -> ChunkAnalysis:
        """`_analyze_chunk` of one normalised word: its WordPiece ids and spans (memoised by `_words`)."""
        index = self._wordpiece.whole(word)
        if index is not None:  # one piece, the whole word (most words of a text): no search, no lists
            return (index,), (1,), (0, len(word)), len(word)
        pieces = self._wordpiece.tokenize(word)
        return _analysis(
            [piece[0] for piece in pieces],
            [1] + [0] * (len(pieces) - 1),
            [bound for piece in pieces for bound in piece[1:]],
        )

    def _analyze_chunk(self, chunk: str) -> ChunkAnalysis:
        """Ids, word-start flags and chunk-relative token spans of one chunk (memoised by `_chunks`)."""
        words = self._words
        ids: list[int] = []
        flags: list[int] = []
        spans: list[int] = []
        if is_simple(chunk):
            # Fast path (ASCII, maybe with typographic punctuation): no cleaning, one-to-one lower-casing, no
            # accents, and the words tile the chunk.
            text = chunk.lower() if self.config.do_lower_case else chunk
            if text.isalnum():
                return words[text]
            base = 0
            for piece in SIMPLE_WORD.findall(text):
                word_ids, word_flags, word_spans, whole = words[piece]
                ids += word_ids
                flags += word_flags
                spans += (base, base + whole) if whole else [base + bound for bound in word_spans]
                base += len(piece)
            return _analysis(ids, flags, spans)
        for word in self._pretokenizer.split_chunk(chunk):
            word_ids, word_flags, word_spans, _ = words[word.text]
            ids += word_ids
            flags += word_flags
            for begin, end in zip(word_spans[::2], word_spans[1::2]):
                spans += word.span(begin, end)
        return _analysis(ids, flags, spans)

    def _keys(self, text: str) -> str:
        if self._lower_ascii and text.isascii():
            return text.lower()
        return text

    def encode_words(self, text: str) -> tuple[list[int], list[int]]:
        """Token ids and word ids of `text`, without special tokens: the fast path for pretraining data.

        Args:
            text: raw text (one sentence or a whole document).

        Returns:
            ``(ids, word_ids)``, two lists of the same length; ``word_ids[i]`` is the index of the
            punctuation-split word token ``i`` belongs to (whole-word masking groups by it).
        """
        analyses = list(map(self._chunks.__getitem__, self._chunk_findall(self._keys(text))))
        ids = list(chain.from_iterable(map(_ids_of, analyses)))
        word_ids = list(accumulate(chain.from_iterable(map(_flags_of, analyses)), initial=-1))
        del word_ids[0]
        return ids, word_ids

    def _encode_sequence(self, text: str) -> SequenceTokens:
        """Ids, absolute token spans (flat) and word-start flags of one text, without special tokens."""
        if not isinstance(text, str):
            raise InputError(f"text to tokenize must be a string, got {type(text).__name__}")
        chunks = self._chunks
        ids: list[int] = []
        flags: list[int] = []
        spans: list[int] = []
        for match in self._chunk_finditer(self._keys(text)):
            chunk_ids, chunk_flags, chunk_spans, whole = chunks[match[0]]
            ids += chunk_ids
            flags += chunk_flags
            base = match.start()
            # Most chunks are one token spanning the whole chunk: no per-token shift.
            spans += (base, base + whole) if whole else map(base.__add__, chunk_spans)
        return ids, spans, flags

    def tokenize(self, text: str) -> list[str]:
        """The WordPiece tokens of `text` (no special tokens), e.g. ``["un", "##aff", "##able"]``."""
        ids, _ = self.encode_words(text)
        return list(map(self._id_to_token.__getitem__, ids))

    def pre_tokenize(self, text: str) -> list[tuple[str, int, int]]:
        """Google's basic tokenization: ``(normalised word, start, end)`` per punctuation-split word."""
        return self._pretokenizer.pre_tokenize(text)

    # ------------------------------------------------------------------------------------- decoding
    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int]:
        """Id of a token (or of each token); unknown tokens give the unknown token's id."""
        unk = self.unk_token_id
        if isinstance(tokens, str):
            found = self.vocab.token_to_id(tokens)
            return unk if found is None else found
        lookup = self.vocab.token_to_id
        return [unk if (found := lookup(token)) is None else found for token in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str]:
        """Token of an id (or of each id).

        Raises:
            InputError: an id is outside ``[0, vocab_size)``.
        """
        if isinstance(ids, int):
            self._check_ids([ids])
            return self._id_to_token[ids]
        ids = list(ids)
        self._check_ids(ids)
        return list(map(self._id_to_token.__getitem__, ids))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids: tokens joined by spaces, ``##`` continuations glued to the previous token.

        The result is the normalised text (lower-cased for uncased vocabularies, punctuation space-separated);
        use `Encoding.offsets` to recover the original characters.

        Args:
            ids: token ids.
            skip_special_tokens: drop the special tokens ([PAD], [UNK], [CLS], [SEP], [MASK]).
        """
        ids = list(ids)
        self._check_ids(ids)
        if skip_special_tokens:
            special = set(self.all_special_ids)
            ids = [index for index in ids if index not in special]
        text = " ".join(map(self._id_to_token.__getitem__, ids))
        return text.replace(" " + CONTINUATION_PREFIX, "")

    def _check_ids(self, ids: list[int]) -> None:
        if ids and (min(ids) < 0 or max(ids) >= len(self._id_to_token)):
            bad = next(index for index in ids if not 0 <= index < len(self._id_to_token))
            raise InputError(f"token id {bad} is outside the vocabulary of {len(self._id_to_token)} tokens")

    def __reduce__(self) -> tuple[type[Tokenizer], tuple[Vocab, TokenizerConfig]]:
        # Pickle (DataLoader workers, multiprocessing) as vocabulary + config; caches are rebuilt on demand.
        return Tokenizer, (self.vocab, self.config)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, config={self.config})"
