"""The BERT tokenizer: Google-exact WordPiece ids with character offsets, pairs, truncation and padding.

`Tokenizer` reproduces Google's original `FullTokenizer` (see `normalizer`, `pretokenizer`, `wordpiece`) and
adds what fine-tuning and serving need: exact character offsets into the original text, word ids, the
``[CLS] A [SEP] B [SEP]`` layout (`postprocessor`), truncation (longest-first, or one side with overflow windows `doc_stride` apart),
padding, decoding, and `save_pretrained` / `from_pretrained` on a directory that Hugging Face `transformers`
also loads (`vocab.txt`, `tokenizer_config.json`, `special_tokens_map.json`).

Speed comes from caching, not from approximations: text is cut into chunks (runs between separators, see
`pretokenizer`) with one regular expression, and the full analysis of a chunk (ids, word boundaries, offsets
relative to the chunk) is memoised, so a repeated word costs one dict lookup. Strings such as ``"[SEP]"``
inside raw text are ordinary text (Google's behaviour): raw input never injects control tokens.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from itertools import accumulate, chain
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal

from bertforge.constants import (
    CLS_TOKEN,
    MASK_TOKEN,
    PAD_TOKEN,
    SEP_TOKEN,
    TOKENIZER_CONFIG_NAME,
    UNK_TOKEN,
    VOCAB_NAME,
)
from bertforge.errors import CheckpointError, ConfigError, DataError, InputError
from bertforge.storage import write_text
from bertforge.tokenization.normalizer import Normalizer
from bertforge.tokenization.postprocessor import PostProcessor
from bertforge.tokenization.pretokenizer import ASCII_WORD, PreTokenizer, is_plain_ascii
from bertforge.tokenization.vocab import Vocab
from bertforge.tokenization.windows import window_spans
from bertforge.tokenization.wordpiece import CONTINUATION_PREFIX, WordPiece

log = logging.getLogger(__name__)

SPECIAL_TOKENS_MAP_NAME = "special_tokens_map.json"
# Google's own config file; a directory with it and vocab.txt but no tokenizer config is a Google release.
GOOGLE_CONFIG_NAME = "bert_config.json"
# Google's casing by model name (`validate_case_matches_checkpoint` in google-research/bert tokenization.py,
# generalised from its list of names to their prefixes): lower-cased models, then cased ones.
GOOGLE_LOWER_CASED = ("uncased_", "chinese_", "multilingual_L", "multi_uncased")
GOOGLE_CASED = ("cased_", "multi_cased_")
# The class name `transformers.AutoTokenizer` looks up to load a directory we saved.
HF_TOKENIZER_CLASS = "BertTokenizer"
# Memoised chunks / words before the caches are emptied (bounded memory on endless corpora).
CACHE_LIMIT = 500_000

Truncation = Literal["longest_first", "only_first", "only_second"]
Padding = Literal["max_length", "longest"]
_TRUNCATIONS = ("longest_first", "only_first", "only_second")
_PADDINGS = ("max_length", "longest")
_SPECIAL_FIELDS = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@dataclass
class TokenizerConfig:
    """How text becomes tokens; the field names are the keys of `tokenizer_config.json`.

    Attributes:
        do_lower_case: lower-case text before WordPiece (the "uncased" checkpoints).
        strip_accents: remove accents (NFD, drop combining marks). None follows `do_lower_case` (Google).
        tokenize_chinese_chars: make each CJK ideograph its own word (Google's default).
        max_input_chars_per_word: longer words become the unknown token (Google 200; Hugging Face slow 100).
        model_max_length: the longest sequence the model accepts (position embeddings); the default
            `max_length` when truncation is requested.
        unk_token, sep_token, pad_token, cls_token, mask_token: the special token strings.
    """

    do_lower_case: bool = True
    strip_accents: bool | None = None
    tokenize_chinese_chars: bool = True
    max_input_chars_per_word: int = 200
    model_max_length: int = 512
    unk_token: str = UNK_TOKEN
    sep_token: str = SEP_TOKEN
    pad_token: str = PAD_TOKEN
    cls_token: str = CLS_TOKEN
    mask_token: str = MASK_TOKEN

    def __post_init__(self) -> None:
        for name in ("do_lower_case", "tokenize_chinese_chars"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"tokenizer {name} must be true or false, got {getattr(self, name)!r}")
        if self.strip_accents is not None and not isinstance(self.strip_accents, bool):
            raise ConfigError(
                f"tokenizer strip_accents must be true, false or null (follow do_lower_case), "
                f"got {self.strip_accents!r}"
            )
        for name in ("max_input_chars_per_word", "model_max_length"):
            value = getattr(self, name)
            if isinstance(value, float) and value.is_integer():
                value = int(value)
                setattr(self, name, value)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"tokenizer {name} must be a positive integer, got {value!r}")
        for name in _SPECIAL_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"tokenizer {name} must be a non-empty string, got {value!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TokenizerConfig:
        """Build from a `tokenizer_config.json` mapping, ignoring keys this tokenizer does not use.

        Hugging Face files carry many other keys (``tokenizer_class``, ``never_split``,
        ``added_tokens_decoder`` ...); special tokens written as ``{"content": "[UNK]", ...}`` objects are
        accepted.
        """
        known = {item.name for item in fields(cls)}
        values = {}
        for key, value in data.items():
            if key not in known:
                continue
            if key in _SPECIAL_FIELDS and isinstance(value, dict) and "content" in value:
                value = value["content"]
            values[key] = value
        return cls(**values)

    @classmethod
    def load(cls, path: str | os.PathLike) -> TokenizerConfig:
        """Read a `tokenizer_config.json`.

        Raises:
            CheckpointError: the file is missing. DataError: it is not a JSON object. ConfigError: a field is
            out of range (the message names the file).
        """
        path = Path(path)
        data = _read_json(path)
        try:
            return cls.from_dict(data)
        except ConfigError as error:
            raise ConfigError(f"{path}: {error}") from None

    def to_dict(self) -> dict[str, Any]:
        """The `tokenizer_config.json` content, including the class name `transformers` loads it with."""
        return {**asdict(self), "tokenizer_class": HF_TOKENIZER_CLASS}

    def save(self, path: str | os.PathLike) -> None:
        """Write `tokenizer_config.json` atomically."""
        write_text(Path(path), json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n")


@dataclass
class Encoding:
    """One encoded sequence (or sequence pair), aligned position by position.

    All lists have the same length L (tokens including specials and padding).

    Attributes:
        ids: token ids, [L].
        type_ids: segment ids, [L]: 0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]`` (padding 0).
        tokens: token strings, [L].
        offsets: ``(start, end)`` character span of each token in its original text; ``(0, 0)`` for special
            and padding tokens. For B tokens the span is in the pair text.
        word_ids: index of the punctuation-split word a token belongs to within its sequence, None for
            special and padding tokens.
        sequence_ids: 0 for tokens of the first text, 1 for the pair text, None for special and padding.
        special_tokens_mask: 1 for special and padding tokens, else 0.
        attention_mask: 1 for real tokens (specials included), 0 for padding.
        overflowing: further windows of a truncated sequence (see `Tokenizer.encode`), each an Encoding.
    """

    ids: list[int]
    type_ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    word_ids: list[int | None]
    sequence_ids: list[int | None]
    special_tokens_mask: list[int]
    attention_mask: list[int]
    overflowing: list[Encoding] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


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
# chunk's length when it is a single token covering all of it (else 0).
ChunkAnalysis = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], int]
def google_do_lower_case(name: str) -> bool | None:
    """Whether Google's model called `name` (its directory, e.g. "uncased_L-12_H-768_A-12") lower-cases
    text: True / False by Google's rule, None when the name says nothing. The whole-word-masking releases'
    `wwm_` prefix is looked through."""
    name = name.removeprefix("wwm_")
    if name.startswith(GOOGLE_CASED):
        return False
    if name.startswith(GOOGLE_LOWER_CASED):
        return True
    return None


def _google_config(directory: Path, do_lower_case: bool | None) -> TokenizerConfig:
    """The tokenizer settings of a Google directory, which records none: casing from its name."""
    source = "given"
    if do_lower_case is None:
        do_lower_case = google_do_lower_case(directory.resolve().name)
        source = f"Google's rule for the name {directory.resolve().name!r}"
        if do_lower_case is None:
            do_lower_case = TokenizerConfig.do_lower_case
            source = f"the default: the name {directory.resolve().name!r} does not say (Google's rule)"
    values: dict[str, Any] = {"do_lower_case": do_lower_case}
    try:
        positions = json.loads((directory / GOOGLE_CONFIG_NAME).read_text(encoding="utf-8")).get(
            "max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        positions = None
    if isinstance(positions, int) and not isinstance(positions, bool) and positions > 0:
        values["model_max_length"] = positions
    log.info("%s: Google directory without %s; do_lower_case=%s (%s); pass do_lower_case= to override",
             directory, TOKENIZER_CONFIG_NAME, do_lower_case, source)
    return TokenizerConfig(**values)


# Per sequence: token ids, absolute (start, end) offsets, word ids.
SequenceTokens = tuple[list[int], list[tuple[int, int]], list[int]]

_ids_of = itemgetter(0)
_flags_of = itemgetter(1)


def _analysis(ids: list[int], flags: list[int], starts: list[int], ends: list[int]) -> ChunkAnalysis:
    whole = ends[0] if len(ids) == 1 and starts[0] == 0 else 0
    return tuple(ids), tuple(flags), tuple(starts), tuple(ends), whole


class Tokenizer:
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
            getattr(self.config, name) for name in _SPECIAL_FIELDS if getattr(self.config, name) not in vocab
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
        directory = Path(directory)
        if not directory.is_dir():
            raise CheckpointError(f"{directory}: tokenizer directory not found")
        config_path = directory / TOKENIZER_CONFIG_NAME
        vocab_path = directory / VOCAB_NAME
        google = not config_path.is_file() and (directory / GOOGLE_CONFIG_NAME).is_file()
        for path in (vocab_path,) if google else (vocab_path, config_path):
            if not path.is_file():
                raise CheckpointError(
                    f"{path}: missing; a tokenizer directory needs {VOCAB_NAME} and {TOKENIZER_CONFIG_NAME} "
                    "(write the config with TokenizerConfig(do_lower_case=...).save(path))"
                )
        if google:
            config = _google_config(directory, do_lower_case)
        else:
            config = TokenizerConfig.load(config_path)
            if do_lower_case is not None:
                config = replace(config, do_lower_case=do_lower_case)
        vocab = Vocab.load(vocab_path, unk_token=config.unk_token)
        try:
            return cls(vocab, config)
        except ConfigError as error:
            raise ConfigError(f"{directory}: {error}") from None

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write `vocab.txt`, `tokenizer_config.json` and `special_tokens_map.json` (each atomically)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.vocab.save(directory / VOCAB_NAME)
        self.config.save(directory / TOKENIZER_CONFIG_NAME)
        special = {name: getattr(self.config, name) for name in _SPECIAL_FIELDS}
        write_text(directory / SPECIAL_TOKENS_MAP_NAME, json.dumps(special, indent=2) + "\n")

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
        return sorted({self.vocab[getattr(self.config, name)] for name in _SPECIAL_FIELDS})

    # ---------------------------------------------------------------------------------- tokenization
    def _analyze_word(self, word: str) -> ChunkAnalysis:
        """`_analyze_chunk` of one normalised word: its WordPiece ids and spans (memoised by `_words`)."""
        pieces = self._wordpiece.tokenize(word)
        return _analysis(
            [piece[0] for piece in pieces],
            [1] + [0] * (len(pieces) - 1),
            [piece[1] for piece in pieces],
            [piece[2] for piece in pieces],
        )

    def _analyze_chunk(self, chunk: str) -> ChunkAnalysis:
        """Ids, word-start flags and chunk-relative token spans of one chunk (memoised by `_chunks`)."""
        words = self._words
        ids: list[int] = []
        flags: list[int] = []
        starts: list[int] = []
        ends: list[int] = []
        if is_plain_ascii(chunk):
            # Fast path: no cleaning, one-to-one lower-casing, no accents, and the words tile the chunk.
            text = chunk.lower() if self.config.do_lower_case else chunk
            if text.isalnum():
                return words[text]
            base = 0
            for piece in ASCII_WORD.findall(text):
                word_ids, word_flags, word_starts, word_ends, whole = words[piece]
                ids += word_ids
                flags += word_flags
                if whole:
                    starts.append(base)
                    ends.append(base + whole)
                else:
                    starts += [base + start for start in word_starts]
                    ends += [base + end for end in word_ends]
                base += len(piece)
            return _analysis(ids, flags, starts, ends)
        for word in self._pretokenizer.split_chunk(chunk):
            word_ids, word_flags, word_starts, word_ends, _ = words[word.text]
            ids += word_ids
            flags += word_flags
            for begin, end in zip(word_starts, word_ends):
                start, stop = word.span(begin, end)
                starts.append(start)
                ends.append(stop)
        return _analysis(ids, flags, starts, ends)

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
        """Ids, absolute offsets and word ids of one text, without special tokens."""
        if not isinstance(text, str):
            raise InputError(f"text to tokenize must be a string, got {type(text).__name__}")
        chunks = self._chunks
        ids: list[int] = []
        flags: list[int] = []
        offsets: list[tuple[int, int]] = []
        for match in self._chunk_finditer(self._keys(text)):
            chunk_ids, chunk_flags, starts, ends, whole = chunks[match.group()]
            ids += chunk_ids
            flags += chunk_flags
            base = match.start()
            if whole:
                # Most chunks are one token spanning the whole chunk: skip the per-token loop.
                offsets.append((base, base + whole))
            else:
                offsets += [(base + start, base + end) for start, end in zip(starts, ends)]
        word_ids = list(accumulate(flags, initial=-1))
        del word_ids[0]
        return ids, offsets, word_ids

    def tokenize(self, text: str) -> list[str]:
        """The WordPiece tokens of `text` (no special tokens), e.g. ``["un", "##aff", "##able"]``."""
        ids, _ = self.encode_words(text)
        return list(map(self._id_to_token.__getitem__, ids))

    def pre_tokenize(self, text: str) -> list[tuple[str, int, int]]:
        """Google's basic tokenization: ``(normalised word, start, end)`` per punctuation-split word."""
        return self._pretokenizer.pre_tokenize(text)

    # ------------------------------------------------------------------------------------- encoding
    def encode(
        self,
        text: str,
        pair: str | None = None,
        *,
        add_special_tokens: bool = True,
        max_length: int | None = None,
        truncation: Truncation | bool | None = None,
        doc_stride: int | None = None,
        return_overflowing: bool = False,
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
                ``"only_second"`` shorten one side only and support `return_overflowing`.
            doc_stride: with `return_overflowing`, the step between the starts of consecutive windows over
                the truncated side, in tokens (Google's doc_stride; default half a window). The windows are
                those of `tokenization.windows.window_spans`, the rule every family uses.
            return_overflowing: keep the cut-off part as further windows in ``.overflowing``, each again
                ``[CLS] A [SEP] B [SEP]``.
            padding: ``"max_length"`` pads to `pad_to`, else `max_length`, else `model_max_length`;
                ``"longest"`` (or True) pads the windows of this call to the longest one.
            pad_to: explicit target length for ``padding="max_length"``.

        Returns:
            The Encoding of the first window; later windows are in its `overflowing` list.

        Raises:
            InputError: the input is too long without truncation, the budget left after special tokens and
                the untruncated side is empty, `doc_stride` is not positive, or an option is invalid.
        """
        first = self._encode_sequence(text)
        if pair is None and max_length is None and not (truncation or padding or return_overflowing):
            # The common single-text call: nothing to cut or pad.
            return self._assemble(first, None, add_special_tokens)
        truncation = _check_truncation(truncation)
        padding = _check_padding(padding)
        second = self._encode_sequence(pair) if pair is not None else None
        windows = self._truncate(
            first, second, add_special_tokens, max_length, truncation, doc_stride, return_overflowing
        )
        encodings = [self._assemble(a, b, add_special_tokens) for a, b in windows]
        if padding == "max_length":
            target = pad_to or max_length or self.config.model_max_length
            for encoding in encodings:
                self._pad(encoding, target)
        elif padding == "longest":
            target = max(len(encoding) for encoding in encodings)
            for encoding in encodings:
                self._pad(encoding, target)
        head = encodings[0]
        head.overflowing = encodings[1:]
        return head

    def encode_batch(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        *,
        add_special_tokens: bool = True,
        max_length: int | None = None,
        truncation: Truncation | bool | None = None,
        doc_stride: int | None = None,
        return_overflowing: bool = False,
        padding: Padding | bool = False,
        pad_to: int | None = None,
    ) -> list[Encoding]:
        """`encode` over a batch; ``padding="longest"`` pads every encoding and window to the longest.

        Raises:
            InputError: `pairs` is given with a different length than `texts`, or as for `encode`.
        """
        if isinstance(texts, str):
            raise InputError("encode_batch takes a list of texts; use encode for a single text")
        if pairs is not None and len(pairs) != len(texts):
            raise InputError(f"encode_batch got {len(texts)} texts but {len(pairs)} pairs; they must match")
        padding = _check_padding(padding)
        per_item_padding: Padding | bool = "max_length" if padding == "max_length" else False
        encodings = [
            self.encode(
                text,
                None if pairs is None else pairs[position],
                add_special_tokens=add_special_tokens,
                max_length=max_length,
                truncation=truncation,
                doc_stride=doc_stride,
                return_overflowing=return_overflowing,
                padding=per_item_padding,
                pad_to=pad_to,
            )
            for position, text in enumerate(texts)
        ]
        if padding == "longest" and encodings:
            everything = [window for encoding in encodings for window in (encoding, *encoding.overflowing)]
            target = max(len(window) for window in everything)
            for window in everything:
                self._pad(window, target)
        return encodings

    def _truncate(
        self,
        first: SequenceTokens,
        second: SequenceTokens | None,
        add_special_tokens: bool,
        max_length: int | None,
        truncation: Truncation | None,
        doc_stride: int | None,
        return_overflowing: bool,
    ) -> list[tuple[SequenceTokens | None, SequenceTokens | None]]:
        """Cut the sequences to fit; returns the (first, second) token slices of each window."""
        special = (3 if second is not None else 2) if add_special_tokens else 0
        length_a = len(first[0])
        length_b = len(second[0]) if second is not None else 0
        total = length_a + length_b + special
        if doc_stride is not None and (isinstance(doc_stride, bool) or doc_stride < 1):
            raise InputError(f"doc_stride must be a positive number of tokens, got {doc_stride!r}")
        if truncation is None:
            if return_overflowing:
                raise InputError(
                    "return_overflowing needs truncation='only_first', 'only_second' or 'longest_first'"
                )
            if max_length is not None and total > max_length:
                raise InputError(
                    f"the input has {total} tokens (special tokens included), "
                    f"more than max_length={max_length}; "
                    "pass truncation='longest_first' (or 'only_first'/'only_second') or a larger max_length"
                )
            return [(first, second)]
        if max_length is None:
            max_length = self.config.model_max_length
        budget = max_length - special
        if budget < 1:
            raise InputError(
                f"max_length={max_length} leaves no room for text after {special} special tokens"
            )
        if truncation == "longest_first":
            if second is None:
                return _windows(first, budget, doc_stride, return_overflowing, lambda part: (part, None))
            if return_overflowing:
                raise InputError(
                    "return_overflowing with a text pair needs truncation='only_first' or 'only_second', "
                    "so the windows advance over one sequence"
                )
            # Google's _truncate_seq_pair: pop from the longer sequence, from the second when equal.
            while length_a + length_b > budget:
                if length_a > length_b:
                    length_a -= 1
                else:
                    length_b -= 1
            return [(_slice(first, 0, length_a), _slice(second, 0, length_b))]
        if truncation == "only_first":
            room = budget - length_b
            if room < 1:
                raise InputError(
                    f"truncation='only_first' cannot fit: the second sequence alone has {length_b} "
                    f"tokens and max_length={max_length}; use 'longest_first' or 'only_second'"
                )
            return _windows(first, room, doc_stride, return_overflowing, lambda part: (part, second))
        if second is None:
            raise InputError(
                "truncation='only_second' needs a text pair; use 'only_first' or 'longest_first'"
            )
        room = budget - length_a
        if room < 1:
            raise InputError(
                f"truncation='only_second' cannot fit: the first sequence alone has {length_a} tokens and "
                f"max_length={max_length}; shorten it (e.g. a max question length) or use 'longest_first'"
            )
        return _windows(second, room, doc_stride, return_overflowing, lambda part: (first, part))

    def _assemble(
        self,
        first: SequenceTokens,
        second: SequenceTokens | None,
        add_special_tokens: bool,
    ) -> Encoding:
        ids_a, offsets_a, words_a = first
        ids_b, offsets_b, words_b = second if second is not None else ([], [], [])
        if add_special_tokens:
            # The layout comes from the post-processor; the other lists follow it position by position.
            ids, type_ids = self.post_processor.assemble(ids_a, None if second is None else ids_b)
            offsets = [(0, 0), *offsets_a, (0, 0)]
            word_ids: list[int | None] = [None, *words_a, None]
            sequence_ids: list[int | None] = [None, *([0] * len(ids_a)), None]
            special = [1, *([0] * len(ids_a)), 1]
            if second is not None:
                offsets += [*offsets_b, (0, 0)]
                word_ids += [*words_b, None]
                sequence_ids += [*([1] * len(ids_b)), None]
                special += [*([0] * len(ids_b)), 1]
        else:
            ids = [*ids_a, *ids_b]
            type_ids = [0] * len(ids_a) + [1] * len(ids_b)
            offsets = [*offsets_a, *offsets_b]
            word_ids = [*words_a, *words_b]
            sequence_ids = [0] * len(ids_a) + [1] * len(ids_b)
            special = [0] * len(ids)
        return Encoding(
            ids=ids,
            type_ids=type_ids,
            tokens=list(map(self._id_to_token.__getitem__, ids)),
            offsets=offsets,
            word_ids=word_ids,
            sequence_ids=sequence_ids,
            special_tokens_mask=special,
            attention_mask=[1] * len(ids),
        )

    def _pad(self, encoding: Encoding, target: int) -> None:
        missing = target - len(encoding.ids)
        if missing <= 0:
            return
        encoding.ids += [self._pad_id] * missing
        encoding.type_ids += [0] * missing
        encoding.tokens += [self.config.pad_token] * missing
        encoding.offsets += [(0, 0)] * missing
        encoding.word_ids += [None] * missing
        encoding.sequence_ids += [None] * missing
        encoding.special_tokens_mask += [1] * missing
        encoding.attention_mask += [0] * missing

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


def _slice(sequence: SequenceTokens, start: int, end: int) -> SequenceTokens:
    return sequence[0][start:end], sequence[1][start:end], sequence[2][start:end]


def _windows(
    sequence: SequenceTokens,
    room: int,
    doc_stride: int | None,
    return_overflowing: bool,
    place: Callable[[SequenceTokens], tuple[SequenceTokens | None, SequenceTokens | None]],
) -> list[tuple[SequenceTokens | None, SequenceTokens | None]]:
    """Windows of at most `room` tokens over `sequence`, `doc_stride` apart (`windows.window_spans`)."""
    length = len(sequence[0])
    if not return_overflowing or length <= room:
        return [place(_slice(sequence, 0, min(length, room)))]
    return [place(_slice(sequence, start, start + size)) for start, size in window_spans(length, room, doc_stride)]


def _check_truncation(truncation: Truncation | bool | None) -> Truncation | None:
    if truncation is True:
        return "longest_first"
    if truncation is None or truncation is False:
        return None
    if truncation not in _TRUNCATIONS:
        raise InputError(f"truncation must be one of {_TRUNCATIONS}, True or None, got {truncation!r}")
    return truncation


def _check_padding(padding: Padding | bool) -> Padding | None:
    if padding is True:
        return "longest"
    if padding is False or padding is None:
        return None
    if padding not in _PADDINGS:
        raise InputError(f"padding must be one of {_PADDINGS}, True or False, got {padding!r}")
    return padding


def _read_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as error:
        raise DataError(f"cannot read the file ({error})", path) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise DataError(f"invalid JSON: {error.msg} (column {error.colno})", path, error.lineno) from None
    if not isinstance(data, dict):
        raise DataError(f"expected a JSON object, got {type(data).__name__}", path)
    return data
