"""A tokenizer's files: `tokenizer_config.json` (`TokenizerConfig`), `vocab.txt`, `special_tokens_map.json`.

Owns reading and writing a tokenizer directory in the layout Hugging Face `transformers` also loads, and
reading Google's release directories (`vocab.txt` + `bert_config.json`, no tokenizer config), whose casing
follows Google's rule on the directory name (`google_do_lower_case`). `Tokenizer.from_pretrained` and
`save_pretrained` are thin wrappers over `read_directory` and `write_directory`.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from bertforge.constants import (
    CLS_TOKEN,
    MASK_TOKEN,
    PAD_TOKEN,
    SEP_TOKEN,
    TOKENIZER_CONFIG_NAME,
    UNK_TOKEN,
    VOCAB_NAME,
)
from bertforge.errors import CheckpointError, ConfigError, DataError
from bertforge.storage import verify_checksum, write_text
from bertforge.tokenization.vocab import Vocab

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
# The config fields naming special tokens, as in `special_tokens_map.json`.
SPECIAL_FIELDS = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


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
        for name in SPECIAL_FIELDS:
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
            if key in SPECIAL_FIELDS and isinstance(value, dict) and "content" in value:
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
    log.info("%s: Google directory without %s; do_lower_case=%s (%s); to override it pass --casing lower|cased "
             "(bertforge convert), or do_lower_case= from Python",
             directory, TOKENIZER_CONFIG_NAME, do_lower_case, source)
    return TokenizerConfig(**values)


def read_directory(directory: str | os.PathLike, do_lower_case: bool | None = None) -> tuple[Vocab, TokenizerConfig]:
    """The vocabulary and settings of a tokenizer directory (see `Tokenizer.from_pretrained`).

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
    for path in (vocab_path, config_path):
        if path.is_file():
            verify_checksum(path)  # against the checksums.json a bertforge save wrote beside them, if any
    if google:
        config = _google_config(directory, do_lower_case)
    else:
        config = TokenizerConfig.load(config_path)
        if do_lower_case is not None:
            config = replace(config, do_lower_case=do_lower_case)
    return Vocab.load(vocab_path, unk_token=config.unk_token), config


def write_directory(directory: str | os.PathLike, vocab: Vocab, config: TokenizerConfig) -> None:
    """Write `vocab.txt`, `tokenizer_config.json` and `special_tokens_map.json` (each atomically)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab.save(directory / VOCAB_NAME)
    config.save(directory / TOKENIZER_CONFIG_NAME)
    special = {name: getattr(config, name) for name in SPECIAL_FIELDS}
    write_text(directory / SPECIAL_TOKENS_MAP_NAME, json.dumps(special, indent=2) + "\n")


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
