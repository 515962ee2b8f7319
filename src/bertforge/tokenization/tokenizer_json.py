"""A `tokenizer.json` (byte-level BPE as ModernBERT's, SentencePiece-style as Gemma's, ...) run by the Rust
`tokenizers` library, behind the interface the pipelines and families use for our WordPiece `Tokenizer`.

The library tokenizes one text (no special tokens) into ids, character offsets into the original text and
word ids; everything after that is ours and shared with `Tokenizer` (`SequenceEncoder`): the one
``[CLS] A [SEP] B [SEP]`` layout (`PostProcessor`, with the file's own [CLS]/[SEP] ids), truncation, padding,
batching. Special tokens come from `tokenizer_config.json` beside the file, else the BERT-style names
([CLS], [SEP], [PAD], [MASK], [UNK]) the ModernBERT family uses; each must be in the file's vocabulary.

Google's WordPiece stays BERT's tokenizer: a `tokenizer.json` describing WordPiece is read into `Tokenizer`
(`checkpoint_format.read_tokenizer` decides). `train_bpe` makes a new byte-level BPE vocabulary with the
same library.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import tokenizers

from bertforge.constants import TOKENIZER_CONFIG_NAME
from bertforge.errors import CheckpointError, ConfigError, InputError
from bertforge.storage import write_text
from bertforge.tokenization.encoding import SequenceTokens
from bertforge.tokenization.postprocessor import PostProcessor
from bertforge.tokenization.tokenizer import SequenceEncoder
from bertforge.tokenization.tokenizer_files import SPECIAL_FIELDS, TokenizerConfig

TOKENIZER_JSON_NAME = "tokenizer.json"
# What transformers' AutoTokenizer loads a directory holding only tokenizer.json with.
HF_FAST_TOKENIZER_CLASS = "PreTrainedTokenizerFast"


def json_model_type(path: Path) -> str | None:
    """The `model.type` of a tokenizer.json ("WordPiece", "BPE", "Unigram", ...), None when it names none."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read as JSON ({exc}); restore the file") from None
    model = data.get("model") if isinstance(data, dict) else None
    return model.get("type") if isinstance(model, dict) else None


class JsonTokenizer(SequenceEncoder):
    """A `tokenizers.Tokenizer` with our special-token layout, offsets, truncation and padding.

    Args:
        backend: the library's tokenizer (its own post-processor and padding are not used: ours are).
        config: special tokens and `model_max_length` (only those fields of `TokenizerConfig` apply).

    Raises:
        ConfigError: a special token of `config` is not in the vocabulary.
    """

    def __init__(self, backend: tokenizers.Tokenizer, config: TokenizerConfig):
        self.backend = backend
        self.config = config
        vocab = backend.get_vocab(with_added_tokens=True)  # token -> id
        missing = [getattr(config, name) for name in SPECIAL_FIELDS if getattr(config, name) not in vocab]
        if missing:
            raise ConfigError(f"special tokens {missing} are not in the tokenizer.json vocabulary ({len(vocab)} "
                              "tokens); set the matching *_token fields in tokenizer_config.json")
        self._token_to_id = vocab
        self._id_to_token = [""] * (max(vocab.values()) + 1)
        for token, index in vocab.items():
            self._id_to_token[index] = token
        self._pad_id = vocab[config.pad_token]
        self.post_processor = PostProcessor(vocab[config.cls_token], vocab[config.sep_token])

    # ----------------------------------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> JsonTokenizer:
        """Load `tokenizer.json` (and `tokenizer_config.json` when present) from a directory.

        Raises:
            CheckpointError: the file is missing or the library cannot read it. ConfigError: a special token
            is missing from its vocabulary (the message names the file).
        """
        folder = Path(directory)
        file = folder / TOKENIZER_JSON_NAME
        if not file.is_file():
            raise CheckpointError(f"{file}: missing; this tokenizer needs its {TOKENIZER_JSON_NAME}")
        try:
            backend = tokenizers.Tokenizer.from_file(str(file))
        except Exception as exc:  # the library raises a bare Exception for every malformed file
            raise CheckpointError(f"{file}: the tokenizers library cannot read it ({exc}); restore the file") from None
        config_file = folder / TOKENIZER_CONFIG_NAME
        stated = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        if not isinstance(stated, dict):
            raise CheckpointError(f"{config_file}: expected a JSON object")
        try:
            config = TokenizerConfig.from_dict({k: v for k, v in stated.items()
                                                if k in SPECIAL_FIELDS or k == "model_max_length"})
            if not isinstance(stated.get("model_max_length"), int) or stated["model_max_length"] > 1 << 20:
                config = replace(config, model_max_length=TokenizerConfig.model_max_length)  # "no limit" 1e30
            return cls(backend, config)
        except ConfigError as error:
            raise ConfigError(f"{config_file if stated else file}: {error}") from None

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write `tokenizer.json` and a `tokenizer_config.json` naming the special tokens (each atomically).

        The file's post-processor adds our [CLS] A [SEP] (B [SEP]) layout when it does not add special tokens
        itself, so transformers' and sentence-transformers' tokenizers on the file give the ids ours give."""
        folder = Path(directory)
        write_text(folder / TOKENIZER_JSON_NAME, with_layout(self.backend, self.config).to_str())
        settings = {name: getattr(self.config, name) for name in (*SPECIAL_FIELDS, "model_max_length")}
        write_text(folder / TOKENIZER_CONFIG_NAME, json.dumps(
            {**settings, "tokenizer_class": HF_FAST_TOKENIZER_CLASS}, indent=2, ensure_ascii=False) + "\n")

    # ------------------------------------------------------------------------------------- properties
    @property
    def vocab(self) -> Mapping[str, int]:
        """token -> id of every entry, added tokens included (as the file spells them: PyLate's "[Q] " keeps
        its space), read-only; answers `in` and `[]` as `Tokenizer.vocab` does."""
        return MappingProxyType(self._token_to_id)

    @property
    def vocab_size(self) -> int:
        """Ids span [0, vocab_size): the embedding table must have at least this many rows."""
        return len(self._id_to_token)

    @property
    def model_max_length(self) -> int:
        return self.config.model_max_length

    @property
    def pad_token_id(self) -> int:
        return self._pad_id

    @property
    def unk_token_id(self) -> int:
        return self._token_to_id[self.config.unk_token]

    @property
    def cls_token_id(self) -> int:
        return self.post_processor.cls_id

    @property
    def sep_token_id(self) -> int:
        return self.post_processor.sep_id

    @property
    def mask_token_id(self) -> int:
        return self._token_to_id[self.config.mask_token]

    @property
    def all_special_ids(self) -> list[int]:
        """Ids of the five special tokens, ascending."""
        return sorted({self._token_to_id[getattr(self.config, name)] for name in SPECIAL_FIELDS})

    # ---------------------------------------------------------------------------------- tokenization
    def _encode_sequence(self, text: str) -> SequenceTokens:
        """Ids, absolute character spans (flat) and word-start flags of one text, without special tokens."""
        if not isinstance(text, str):
            raise InputError(f"text to tokenize must be a string, got {type(text).__name__}")
        encoding = self.backend.encode(text, add_special_tokens=False)
        spans = [bound for span in encoding.offsets for bound in span]
        words = encoding.word_ids
        flags = [int(word is None or index == 0 or word != words[index - 1]) for index, word in enumerate(words)]
        return list(encoding.ids), spans, flags

    def mask_token_strips(self) -> tuple[bool, bool]:
        """(lstrip, rstrip) of the mask token in the file's added tokens (ModernBERT's: the space before it is
        the mask's)."""
        for added in self.backend.get_added_tokens_decoder().values():
            if added.content == self.config.mask_token:
                return bool(added.lstrip), bool(added.rstrip)
        return False, False

    def encode_words(self, text: str) -> tuple[list[int], list[int]]:
        """Token ids and word ids of `text`, without special tokens (see `Tokenizer.encode_words`)."""
        ids, _, flags = self._encode_sequence(text)
        word_ids, word = [], -1
        for flag in flags:
            word += flag
            word_ids.append(word)
        return ids, word_ids

    def tokenize(self, text: str) -> list[str]:
        """The tokens of `text` (no special tokens), as the file spells them (e.g. "Ġworld")."""
        return self.backend.encode(text, add_special_tokens=False).tokens

    def pre_tokenize(self, text: str) -> list[tuple[str, int, int]]:
        """``(word, start, end)`` per word of the file's pre-tokenizer, spans in the original text (the word is
        the text it covers, without the leading space a byte-level BPE counts in it)."""
        ids, spans, flags = self._encode_sequence(text)
        words: list[list[int]] = []
        for index, flag in enumerate(flags):
            start, end = spans[2 * index], spans[2 * index + 1]
            if flag or not words:
                words.append([start, end])
            else:
                words[-1][1] = max(words[-1][1], end)
        return [(text[start:end], start, end) for start, end in words]

    # ------------------------------------------------------------------------------------- decoding
    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int]:
        """Id of a token (or of each token); unknown tokens give the unknown token's id."""
        unk = self.unk_token_id
        if isinstance(tokens, str):
            return self._token_to_id.get(tokens, unk)
        return [self._token_to_id.get(token, unk) for token in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str]:
        """Token of an id (or of each id). Raises InputError for an id outside the vocabulary."""
        single = isinstance(ids, int)
        ids = [ids] if single else list(ids)
        self._check_ids(ids)
        tokens = [self._id_to_token[index] for index in ids]
        return tokens[0] if single else tokens

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids, through the file's decoder."""
        ids = list(ids)
        self._check_ids(ids)
        if skip_special_tokens:
            special = set(self.all_special_ids)
            ids = [index for index in ids if index not in special]
        return self.backend.decode(ids, skip_special_tokens=False)

    def _check_ids(self, ids: list[int]) -> None:
        if ids and (min(ids) < 0 or max(ids) >= len(self._id_to_token)):
            bad = next(index for index in ids if not 0 <= index < len(self._id_to_token))
            raise InputError(f"token id {bad} is outside the vocabulary of {len(self._id_to_token)} tokens")

    def __reduce__(self):
        # Pickle (DataLoader workers, multiprocessing) as the file's JSON + config.
        return _rebuild, (self.backend.to_str(), self.config)

    def __repr__(self) -> str:
        return f"JsonTokenizer(vocab_size={self.vocab_size}, config={self.config})"


def with_layout(backend: tokenizers.Tokenizer, config: TokenizerConfig) -> tokenizers.Tokenizer:
    """`backend` itself when its post-processor adds special tokens, else a copy whose post-processor runs the
    old one (a byte-level offset trim) and then adds [CLS] A [SEP] / [CLS] A [SEP] B [SEP] with `config`'s
    tokens: the layout `PostProcessor` builds, written where other libraries read it."""
    old = backend.post_processor
    if old is not None and old.num_special_tokens_to_add(False) > 0:
        return backend
    vocab = backend.get_vocab(with_added_tokens=True)
    cls, sep = config.cls_token, config.sep_token
    template = tokenizers.processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])])
    copy = tokenizers.Tokenizer.from_str(backend.to_str())
    copy.post_processor = template if old is None else tokenizers.processors.Sequence([old, template])
    return copy


def _rebuild(data: str, config: TokenizerConfig) -> JsonTokenizer:
    return JsonTokenizer(tokenizers.Tokenizer.from_str(data), config)


def train_bpe(texts: Iterable[str], vocab_size: int, *, model_max_length: int = 8192,
              min_frequency: int = 2) -> JsonTokenizer:
    """A new byte-level BPE vocabulary (ModernBERT's kind of tokenizer) trained on `texts` by the `tokenizers`
    library, with BERT-style special tokens first ([PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4)."""
    config = TokenizerConfig(model_max_length=model_max_length)
    specials = [config.pad_token, config.unk_token, config.cls_token, config.sep_token, config.mask_token]
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=config.unk_token))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = tokenizers.decoders.ByteLevel()
    # The offsets of a byte-level token should not count the space it carries.
    backend.post_processor = tokenizers.processors.ByteLevel(trim_offsets=True)
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                             special_tokens=specials,
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(texts, trainer)
    return JsonTokenizer(with_layout(backend, config), config)
