"""Rows of several vectors each (late interaction: a ColBERT model's vector per token), flat: what a multi-vector
shard holds (`store` names its files) and what `multi_vector_search` scores.

Owns: `TokenRows` (the vectors one row after another, and each row's start) and its checks, and the dtypes such
rows are stored in (`TOKEN_DTYPES`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

TOKEN_DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class TokenRows:
    """Rows of several vectors each (late interaction: a vector per token): `tokens` [M, D], row i's vectors
    `tokens[offsets[i]:offsets[i + 1]]` (offsets [n + 1] int64, from 0)."""

    offsets: np.ndarray
    tokens: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def row(self, index: int) -> np.ndarray:
        return self.tokens[self.offsets[index]:self.offsets[index + 1]]

    @classmethod
    def checked(cls, offsets: np.ndarray, tokens: np.ndarray, count: int, dim: int) -> TokenRows:
        """The rows of a shard's stored arrays; ValueError unless they hold `count` rows of `dim`-wide vectors."""
        if not (offsets.ndim == 1 and len(offsets) == count + 1 and offsets[0] == 0 and np.all(np.diff(offsets) >= 0)
                and tokens.ndim == 2 and offsets[-1] == len(tokens) and tokens.shape[1] == dim):
            raise ValueError(f"not {count} rows of {dim}-wide token vectors")
        return cls(offsets, tokens)

    @classmethod
    def from_rows(cls, rows: Sequence[np.ndarray], dim: int, dtype: str = "float32") -> TokenRows:
        """The rows [t_i, D] as one `TokenRows` (in `dtype`)."""
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(row) for row in rows])
        tokens = np.concatenate(rows).astype(dtype) if rows else np.zeros((0, dim), dtype)
        return cls(offsets, np.ascontiguousarray(tokens))


__all__ = ["TOKEN_DTYPES", "TokenRows"]
