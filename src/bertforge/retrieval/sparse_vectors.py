"""Sparse (SPLADE) vectors in the Python API and on disk.

Owns: `encode_sparse` (texts -> `metrics.sparse.SparseRows` through an `embed-sparse` pipeline, the sparse
counterpart of `EmbedPipeline.encode`), the arrays a sparse shard stores (`sparse_arrays`) and reading them
back (`read_sparse_shard`).

A sparse shard of `bertforge embed --sparse` is compressed rows, one file per array, as numpy writes them:
`indptr-00000.npy` ([n + 1] int64, row i's entries are indptr[i]:indptr[i+1]), `terms-00000.npy` (int32 term
ids, ascending within a row) and `weights-00000.npy` (float32, > 0), beside the dense shards' `ids-00000.jsonl`
and progress records. Each text keeps only its non-zero terms (its `max_terms` largest when pruned).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.errors import ConfigError, InputError
from bertforge.metrics.sparse import SparseRows

SPARSE_TASK = "embed-sparse"
# kind in a shard record -> its file name (.format(shard index))
SPARSE_FILES = {"indptr": "indptr-{:05d}.npy", "terms": "terms-{:05d}.npy", "weights": "weights-{:05d}.npy"}


def check_sparse_pipeline(pipeline: Any) -> None:
    if getattr(pipeline, "task", None) != SPARSE_TASK:
        raise InputError(f"sparse vectors come from an {SPARSE_TASK} pipeline (load_pipeline(model, "
                         f"{SPARSE_TASK!r})), not {getattr(pipeline, 'task', type(pipeline).__name__)!r}")


def encode_sparse_parsed(pipeline: Any, parsed: Sequence[Any], options: dict[str, Any],
                         on_batch: Any = None, features: Any = None) -> tuple[SparseRows, int]:
    """(rows, tokens run) of inputs already validated by `pipeline.parse` (prompts included), options already
    checked (`pipeline.check_options`); `on_batch(texts)` after each model batch; `features`: the feature step
    as the caller wraps it (`Pipeline.stream`)."""
    from bertforge.inference.pipelines import feature_tokens

    width = pipeline.config.vocab_size
    if not parsed:
        return SparseRows.from_vectors([], width), 0
    made, outputs = pipeline.stream(parsed, options, on_batch=on_batch, features=features)
    return SparseRows.from_vectors(outputs, width), sum(feature_tokens(feature) for feature in made)


def encode_sparse(pipeline: Any, texts: Sequence[str], *, prompt_name: str | None = None, prompt: str | None = None,
                  **options: Any) -> SparseRows:
    """Sparse vectors of `texts` as compressed rows (one per text, in order), without JSON lists in between.

    Args:
        pipeline: an `embed-sparse` pipeline (`load_pipeline(model_dir, "embed-sparse")`).
        texts: the texts.
        prompt_name, prompt: a prefix before every text (`Pipeline.prompt_text`; default: the model's).
        **options: the family's options: pooling, activation, max_terms (keep each text's largest that many
            weights; 0 keeps all).

    Returns:
        `SparseRows` of width the vocabulary size: `.dense()` for small sets, `.row(i)` for (terms, weights).
    """
    check_sparse_pipeline(pipeline)
    prefix = pipeline.prompt_text(prompt_name, prompt)
    checked = pipeline.check_options(options)
    return encode_sparse_parsed(pipeline, [prefix + pipeline.parse(t) for t in texts], checked)[0]


def sparse_arrays(rows: SparseRows) -> dict[str, np.ndarray]:
    """The arrays one sparse shard stores: {"indptr", "terms", "weights"}."""
    return {"indptr": rows.indptr.astype(np.int64), "terms": rows.indices.astype(np.int32),
            "weights": rows.values.astype(np.float32)}


def read_sparse_shard(directory: Path, record: dict[str, Any], width: int) -> SparseRows:
    """The rows of one sparse shard (its progress record names the files), checked."""
    try:
        arrays = {kind: np.load(directory / record[kind], allow_pickle=False) for kind in SPARSE_FILES}
        rows = SparseRows(arrays["indptr"], arrays["terms"], arrays["weights"], width)
    except (OSError, ValueError, KeyError, InputError) as error:
        raise ConfigError(f"{directory}: sparse shard {record.get('index')} is unreadable ({error}); rerun "
                          "`bertforge embed --sparse` to rewrite it") from None
    if len(rows) != record["count"]:
        raise ConfigError(f"{directory}: sparse shard {record['index']} holds {len(rows)} rows, its record says "
                          f"{record['count']}; rerun `bertforge embed --sparse` to rewrite it")
    return rows


__all__ = ["SPARSE_FILES", "SPARSE_TASK", "encode_sparse", "encode_sparse_parsed", "read_sparse_shard",
           "sparse_arrays"]
