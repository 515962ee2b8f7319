"""The one place that lays out special tokens: ``[CLS] A [SEP]`` and ``[CLS] A [SEP] B [SEP]``.

A post-processor in the sense of the `tokenizers` library: it takes the token ids of one or two segments
and adds what BERT expects around them, with segment (token type) ids 0 for ``[CLS] A [SEP]`` and 1 for
``B [SEP]``. The tokenizer's `encode`, every family's feature builder and the pretraining instance writer
assemble inputs through it, so the layout cannot drift between training and serving.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PostProcessor:
    """Special-token layout for a vocabulary's [CLS] and [SEP] ids."""

    cls_id: int
    sep_id: int

    @staticmethod
    def added(pair: bool) -> int:
        """How many special tokens a single segment (2) or a pair (3) gets."""
        return 3 if pair else 2

    def ids(self, first: Sequence[int]) -> list[int]:
        """The input ids of ``[CLS] first [SEP]`` (a single segment's token types are all 0)."""
        return [self.cls_id, *first, self.sep_id]

    def assemble(self, first: Sequence[int], second: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
        """(input ids, token type ids) of ``[CLS] first [SEP] (second [SEP])``."""
        ids = [self.cls_id, *first, self.sep_id]
        types = [0] * len(ids)
        if second is not None:
            ids += [*second, self.sep_id]
            types += [1] * (len(second) + 1)
        return ids, types

    def positions(self, first: int, second: int | None = None) -> tuple[int, int | None]:
        """Where the first token of each segment lands: (1, first + 2) — for mapping tokens back."""
        return 1, (None if second is None else first + 2)
