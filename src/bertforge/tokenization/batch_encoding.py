"""The transformers-style call of a tokenizer: ``tokenizer("text", return_tensors="pt")`` -> model inputs.

Owns `BatchEncoding` (a dict of ``input_ids``, ``token_type_ids`` and ``attention_mask`` that also reads
as attributes, so ``model(**tokenizer(...))`` works as it does with transformers) and the conversion of
encodings to lists, numpy arrays or torch tensors. The encoding itself is `Tokenizer.encode_batch`'s.

This package never imports torch (it loads without it): ``return_tensors="pt"`` converts with the torch a
caller already imported (a caller asking for torch tensors has, through the model or torch itself), and says
so when none is loaded.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from bertforge.errors import InputError
from bertforge.tokenization.encoding import Encoding

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")
TENSOR_KINDS = ("pt", "np")


class BatchEncoding(dict):
    """Model inputs by name (``input_ids``, ``token_type_ids``, ``attention_mask``), readable as attributes;
    `encodings` keeps the `Encoding` of every text (offsets, word ids)."""

    def __init__(self, data: dict[str, Any], encodings: list[Encoding]):
        super().__init__(data)
        self.encodings = encodings

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"BatchEncoding has no {name!r}; it holds {list(self)}") from None


def as_batch(text: str | Sequence[str], pair: str | Sequence[str] | None) -> tuple[list[str], list[str] | None, bool]:
    """(texts, pairs, single): the call's arguments as lists, and whether one text (not a list) was given."""
    single = isinstance(text, str)
    if single:
        if pair is not None and not isinstance(pair, str):
            raise InputError("a single text takes a single pair text (a str); give lists for both to encode a batch")
        return [text], None if pair is None else [pair], True
    if not isinstance(text, Sequence) or not all(isinstance(item, str) for item in text):
        raise InputError("the tokenizer takes a text (str) or a list of texts, optionally with text_pair "
                         "(a str, or a list as long as the texts)")
    if isinstance(pair, str):
        raise InputError("a list of texts takes a list of pair texts as long as it; give text_pair=[...]")
    return list(text), None if pair is None else list(pair), False


def batch_encoding(encodings: list[Encoding], single: bool, return_tensors: str | None) -> BatchEncoding:
    """The model inputs of `encodings`: lists (one text: flat lists), or [B, T] arrays of `return_tensors`."""
    if return_tensors is not None and return_tensors not in TENSOR_KINDS:
        raise InputError(f"return_tensors={return_tensors!r} is not supported; choose 'pt' (torch), 'np' (numpy) "
                         "or None (lists)")
    columns = {"input_ids": [e.ids for e in encodings], "token_type_ids": [e.type_ids for e in encodings],
               "attention_mask": [e.attention_mask for e in encodings]}
    if return_tensors is None:
        data = {name: rows[0] if single else rows for name, rows in columns.items()}
        return BatchEncoding(data, encodings)
    lengths = {len(e) for e in encodings}
    if len(lengths) > 1:
        raise InputError(f"texts of {min(lengths)} to {max(lengths)} tokens do not make one tensor; pass "
                         "padding=True (pad to the longest) or padding='max_length' with max_length")
    arrays = {name: np.asarray(rows, dtype=np.int64).reshape(len(encodings), -1) for name, rows in columns.items()}
    if return_tensors == "np":
        return BatchEncoding(arrays, encodings)
    torch = sys.modules.get("torch")
    if torch is None:
        raise InputError("return_tensors='pt' needs torch: import torch (or a bertforge model) first, or use "
                         "return_tensors='np'")
    return BatchEncoding({name: torch.from_numpy(array) for name, array in arrays.items()}, encodings)
