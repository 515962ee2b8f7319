"""Sparse (SPLADE) vectors in the Python API: `encode_sparse` (texts -> `metrics.sparse.SparseRows` through an
`embed-sparse` pipeline, the sparse counterpart of `EmbedPipeline.encode`). Each text keeps only its non-zero
terms (its `max_terms` largest when pruned). How a folder stores them (compressed rows, one file per array) is
`store`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bertforge.errors import InputError
from bertforge.metrics.sparse import SparseRows

SPARSE_TASK = "embed-sparse"


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


__all__ = ["SPARSE_TASK", "encode_sparse", "encode_sparse_parsed"]
