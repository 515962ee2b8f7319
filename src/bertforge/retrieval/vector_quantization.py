"""Compressed vectors for `bertforge embed --dtype int8|binary` and how `search` scores them.

Owns: the calibration ranges of int8 (`calibrate`: per-dimension minimum and maximum over a calibration
sample, kept in the manifest beside the shards), the two codes (`quantize_int8`, `quantize_binary`), and the
scores of float queries against coded documents (`int8_scores`, `binary_scores`, `rescore`).

The idea is sentence-transformers' `quantize_embeddings` with rescoring: documents are stored coded, queries
stay float32, and the score is asymmetric, the float query against the coded document:

- int8 (4x smaller than float32): each dimension's calibrated range [min, max] is cut into 256 steps; a value
  is stored as its nearest step (values outside the range clip to its ends). The score is the dot product of
  the float query with the dequantized document (`int8_scores`), computed without dequantizing:
  q . (lo + (c + 128) * step) = (q * step) . c + q . (lo + 128 * step).
- binary (32x smaller): each dimension's sign, 8 to a byte (`np.packbits`). The whole index is scanned with
  the float query against the documents' signs as +-1 (`binary_scores`; the same order as Hamming distance
  when the query is coded too, but finer), then the best `rescore_multiplier` x k candidates are rescored with
  the float query against their int8 codes (stored beside the bits, memory-mapped, only the candidates' rows
  read) and ranked by that score, which approximates the float dot product as int8's does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bertforge.errors import ConfigError

QUANTIZED_DTYPES = ("int8", "binary")
# The corpus's first records, embedded once more before the shards, whose vectors calibrate the int8 ranges.
DEFAULT_CALIBRATION_SIZE = 1_000
# Binary: candidates rescored per hit wanted (sentence-transformers' default is 2; measured in docs/benchmarks.md).
DEFAULT_RESCORE_MULTIPLIER = 4
LEVELS = 255  # int8 steps between a dimension's min and max


def calibrate(vectors: np.ndarray) -> dict[str, Any]:
    """The int8 calibration of a sample [n, D]: per-dimension min and max (JSON lists, exact float32 values)."""
    if len(vectors) == 0:
        raise ConfigError("int8 calibration needs at least one vector")
    sample = np.asarray(vectors, dtype=np.float32)
    return {"min": sample.min(0).tolist(), "max": sample.max(0).tolist(), "sample": len(sample)}


def ranges(calibration: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(lo [D], step [D]) float32 of a calibration; a constant dimension gets step 1 (every code is lo)."""
    lo = np.asarray(calibration["min"], dtype=np.float32)
    step = (np.asarray(calibration["max"], dtype=np.float32) - lo) / LEVELS
    return lo, np.where(step > 0, step, 1.0).astype(np.float32)


def quantize_int8(vectors: np.ndarray, calibration: dict[str, Any]) -> np.ndarray:
    """int8 codes [n, D] of float vectors: the nearest of 256 steps of each dimension's range, clipped."""
    lo, step = ranges(calibration)
    codes = np.clip(np.rint((np.asarray(vectors, dtype=np.float32) - lo) / step), 0, LEVELS)
    return (codes - 128).astype(np.int8)


def dequantize_int8(codes: np.ndarray, calibration: dict[str, Any]) -> np.ndarray:
    """The float32 vectors [n, D] int8 codes stand for."""
    lo, step = ranges(calibration)
    return lo + (codes.astype(np.float32) + 128) * step


def quantize_binary(vectors: np.ndarray) -> np.ndarray:
    """Sign bits [n, ceil(D / 8)] uint8 (1: > 0), 8 dimensions a byte, the first in the high bit."""
    return np.packbits(np.asarray(vectors) > 0, axis=-1)


def int8_scores(queries: np.ndarray, codes: np.ndarray, calibration: dict[str, Any]) -> np.ndarray:
    """[Q, n] dot products of float queries [Q, D] with the dequantized int8 documents [n, D]."""
    lo, step = ranges(calibration)
    offset = queries @ (lo + 128 * step)  # [Q]
    return (queries * step) @ codes.astype(np.float32).T + offset[:, None]


def binary_scores(queries: np.ndarray, bits: np.ndarray, dim: int) -> np.ndarray:
    """[Q, n] dot products of float queries [Q, D] with the documents' signs as +-1 [n, D]."""
    signs = np.unpackbits(bits, axis=-1, count=dim).astype(np.float32) * 2 - 1  # [n, D]
    return queries @ signs.T


def rescore(queries: np.ndarray, rows: np.ndarray, codes_of: Any, calibration: dict[str, Any]) -> np.ndarray:
    """[Q, C] int8 scores of each query's candidate rows [Q, C]; `codes_of(sorted unique rows)` gives their
    int8 codes [U, D] (read from the memory-mapped shards)."""
    unique, where = np.unique(rows, return_inverse=True)
    codes = codes_of(unique)  # [U, D]
    scores = int8_scores(queries, codes, calibration)  # [Q, U]
    return np.take_along_axis(scores, where.reshape(rows.shape), axis=1)


def coded(vectors: np.ndarray, dtype: str, calibration: dict[str, Any] | None) -> dict[str, np.ndarray]:
    """What a shard of float32 vectors [n, D] stores as `dtype`: {"vectors": ...} (float32, float16 or int8
    codes; binary: sign bits, with "codes": their int8 codes for rescoring)."""
    if dtype in ("float32", "float16"):
        return {"vectors": np.ascontiguousarray(vectors, dtype=dtype)}
    if calibration is None:
        raise ConfigError(f"dtype {dtype!r} needs an int8 calibration")
    codes = quantize_int8(vectors, calibration)
    return {"vectors": codes} if dtype == "int8" else {"vectors": quantize_binary(vectors), "codes": codes}


__all__ = ["DEFAULT_CALIBRATION_SIZE", "DEFAULT_RESCORE_MULTIPLIER", "QUANTIZED_DTYPES", "binary_scores",
           "calibrate", "coded", "dequantize_int8", "int8_scores", "quantize_binary", "quantize_int8", "rescore"]
