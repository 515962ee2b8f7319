"""The WordPiece vocabulary: `vocab.txt` reading, writing, and token <-> id lookup.

`vocab.txt` holds one token per line; a token's id is its 0-based line number. This is the format of Google's
released checkpoints and of Hugging Face BERT directories, so a saved vocabulary is usable by either.

`check_fits_embeddings` is the loading check of a vocabulary against the model it came with: a token id must
index a row of the embedding table, and a table much larger than the vocabulary means a truncated file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from bertforge.constants import UNK_TOKEN
from bertforge.errors import CheckpointError, DataError
from bertforge.storage import read_json, write_text

log = logging.getLogger(__name__)

# Released checkpoints may pad the embedding table beyond vocab.txt to a round size (NVIDIA's BERT to a
# multiple of 8: 30528 rows for 30522 tokens; others to 64 or 128). Fewer rows than this without a token are
# such padding; more mean a truncated vocab.txt or one of another model. Google's and Hugging Face's own
# releases match exactly (bert-base-uncased 30522, bert-base-chinese 21128, multilingual 119547).
PADDING_ROWS = 128
# Hugging Face's list of tokens added to a vocabulary after training (their ids follow vocab.txt's).
ADDED_TOKENS_NAME = "added_tokens.json"


class Vocab:
    """An ordered set of tokens; a token's id is its position.

    Args:
        tokens: the tokens in id order. No duplicates, no empty strings, and `unk_token` must be present.
        unk_token: the token that stands for anything out of vocabulary.

    Raises:
        DataError: on a duplicate or empty token, or when `unk_token` is missing.
    """

    def __init__(self, tokens: Iterable[str], unk_token: str = UNK_TOKEN):
        self._tokens = list(tokens)
        self._index = _index_tokens(self._tokens, source=None)
        if unk_token not in self._index:
            raise DataError(f"the vocabulary has no unknown token {unk_token!r}; add it as a line of its own")
        self.unk_token = unk_token

    @classmethod
    def load(cls, path: str | os.PathLike, unk_token: str = UNK_TOKEN) -> Vocab:
        """Read a `vocab.txt` (UTF-8, one token per line; a trailing newline and CRLF endings are accepted).

        Raises:
            DataError: naming the file (and line) when it is missing, unreadable, not UTF-8, empty, has an
                empty line or a duplicate token, or lacks `unk_token`.
        """
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise DataError("vocabulary file not found; pass the path of a vocab.txt", path) from None
        except IsADirectoryError:
            raise DataError("is a directory, expected a vocab.txt file", path) from None
        except OSError as error:
            raise DataError(f"cannot read the vocabulary file ({error.strerror})", path) from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            line = data.count(b"\n", 0, error.start) + 1
            raise DataError("the vocabulary file is not valid UTF-8", path, line) from None
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        tokens = [line[:-1] if line.endswith("\r") else line for line in lines]
        if not tokens:
            raise DataError("the vocabulary file is empty; it needs one token per line", path)
        _index_tokens(tokens, source=path)
        if unk_token not in tokens:
            raise DataError(
                f"the vocabulary has no unknown token {unk_token!r}; add it as a line of its own "
                "or set unk_token in tokenizer_config.json",
                path,
            )
        vocab = cls.__new__(cls)
        vocab._tokens = tokens
        vocab._index = {token: index for index, token in enumerate(tokens)}
        vocab.unk_token = unk_token
        return vocab

    def save(self, path: str | os.PathLike) -> None:
        """Write `vocab.txt` atomically (temporary file in the same directory, then rename)."""
        write_text(Path(path), "".join(token + "\n" for token in self._tokens))

    @property
    def unk_id(self) -> int:
        """Id of the unknown token."""
        return self._index[self.unk_token]

    @property
    def tokens(self) -> list[str]:
        """All tokens in id order (a copy)."""
        return list(self._tokens)

    def token_to_id(self, token: str) -> int | None:
        """Id of `token`, or None when it is not in the vocabulary."""
        return self._index.get(token)

    def id_to_token(self, index: int) -> str:
        """Token with id `index`.

        Raises:
            IndexError: when `index` is outside ``[0, len(self))``.
        """
        if not 0 <= index < len(self._tokens):
            raise IndexError(f"token id {index} is outside the vocabulary of {len(self._tokens)} tokens")
        return self._tokens[index]

    def as_dict(self) -> dict[str, int]:
        """Token -> id mapping (a copy)."""
        return dict(self._index)

    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, token: object) -> bool:
        return token in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self._tokens)

    def __getitem__(self, token: str) -> int:
        return self._index[token]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Vocab):
            return NotImplemented
        return self._tokens == other._tokens and self.unk_token == other.unk_token

    def __repr__(self) -> str:
        return f"Vocab({len(self._tokens)} tokens, unk_token={self.unk_token!r})"


def check_fits_embeddings(tokens: int, vocab_size: int, vocab_file: str | os.PathLike) -> None:
    """Whether the `vocab_file` of `tokens` lines belongs to a model whose embedding table has `vocab_size`
    rows. The tokens of an added_tokens.json beside it (Hugging Face's, which this tokenizer does not read)
    may account for rows beyond vocab.txt, with a warning.

    Raises:
        CheckpointError: more tokens than rows (their ids would index past the table), or more than
            `PADDING_ROWS` rows without a token and no added tokens to account for them (a truncated file).
    """
    fix = "copy in the vocab.txt the model was trained with"
    added = count_added_tokens(Path(vocab_file).parent / ADDED_TOKENS_NAME, tokens)
    if tokens > vocab_size:
        raise CheckpointError(f"{vocab_file}: {tokens} tokens, but config.json's vocab_size is {vocab_size}: ids "
                              f"{vocab_size}..{tokens - 1} would index past the embedding table; this vocabulary "
                              f"belongs to another model: {fix}")
    spare = vocab_size - tokens
    if spare == 0:
        return
    if added and tokens + added <= vocab_size and spare - added < PADDING_ROWS:
        log.warning("%s: %d tokens for vocab_size %d; the other %d are added tokens (added_tokens.json), which "
                    "bertforge's tokenizer does not read: text holding them is split into word pieces", vocab_file,
                    tokens, vocab_size, added)
        return
    if spare < PADDING_ROWS:
        log.info("%s: %d tokens for vocab_size %d: the last %d embedding rows are padding", vocab_file, tokens,
                 vocab_size, spare)
        return
    raise CheckpointError(f"{vocab_file}: {tokens} tokens, but config.json's vocab_size is {vocab_size} ({spare} "
                          f"rows without a token): the vocabulary is truncated or belongs to another model; {fix} "
                          f"(a released vocabulary matches vocab_size, or pads it by fewer than {PADDING_ROWS} rows)")


def count_added_tokens(file: Path, tokens: int) -> int:
    """How many ids at or after `tokens` an added_tokens.json ({token: id}) assigns; 0 without a readable one."""
    if not file.is_file():
        return 0
    try:
        table = read_json(file, what="added tokens file")
    except ValueError:
        return 0
    return sum(1 for i in table.values() if isinstance(i, int) and i >= tokens) if isinstance(table, dict) else 0


def _index_tokens(tokens: list[str], source: Path | None) -> dict[str, int]:
    """Token -> id, refusing empty and duplicate tokens (errors give 1-based line numbers)."""
    index: dict[str, int] = {}
    for position, token in enumerate(tokens):
        if token == "":
            raise DataError(
                "empty line in the vocabulary; every line must hold one token", source, position + 1
            )
        if "\n" in token:
            raise DataError(f"token {token!r} contains a newline", source, position + 1)
        previous = index.setdefault(token, position)
        if previous != position:
            raise DataError(
                f"duplicate token {token!r} (first on line {previous + 1}); every token must appear once",
                source,
                position + 1,
            )
    return index
