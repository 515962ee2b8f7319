"""How a corpus's texts become a vector folder's vectors: `EmbedSettings`, what the folder's manifest stores
(`store`) and what a resume or an addition must match.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bertforge.errors import ConfigError
from bertforge.inference.wire_inputs import AUTO_TRUNCATE
from bertforge.retrieval.text_chunks import check_chunking
from bertforge.retrieval.token_rows import TOKEN_DTYPES
from bertforge.retrieval.vector_quantization import QUANTIZED_DTYPES

DTYPES = ("float32", "float16", *QUANTIZED_DTYPES)


@dataclass(frozen=True)
class EmbedSettings:
    """How a corpus's texts become a folder's vectors: what the manifest stores, and what a resume must match.

    Args:
        pooling, normalize: embedding options (None: the model's, e.g. a sentence-transformers directory's);
            for sparse vectors `pooling` is the SPLADE pooling (max, sum) and `normalize` must stay None.
        prompt_name, prompt: a prefix before every text (`EmbedPipeline.prompt_text`; default: the model's).
            The manifest stores the prefix itself, as `prompt`.
        dtype: on disk (computed in float32): "float32", "float16", "int8" (calibrated on the first records) or
            "binary" (sign bits, plus int8 codes for rescoring); sparse vectors are float32 weights.
        sparse: SPLADE vectors of a masked-LM model (the embed-sparse task) as compressed rows.
        multi_vector: a ColBERT model's vectors, one per token (the embed-multi-vector task, documents' role), as
            `token_rows.TokenRows`; dtype float32 or float16.
        max_terms: sparse only: keep each text's largest that many weights.
        chunk, chunk_overlap: cut every text into windows of `chunk` tokens overlapping by `chunk_overlap`,
            one row each (`text_chunks`). late_chunking: the whole text runs through the model once and each
            chunk is the mean of its tokens' vectors (dense, mean pooling).
        truncate: a text longer than the model's window is cut to it and counted (`wire_inputs`' rule); False
            refuses the run before any model work (`embed_corpus.check_fit`).

    Raises:
        ConfigError: a setting that is invalid or does not apply to this kind of vectors (names the flag).
    """

    pooling: str | None = None
    normalize: bool | None = None
    prompt_name: str | None = None
    prompt: str | None = None
    dtype: str = "float32"
    sparse: bool = False
    max_terms: int | None = None
    chunk: int | None = None
    chunk_overlap: int | None = None
    late_chunking: bool = False
    truncate: bool = AUTO_TRUNCATE
    multi_vector: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.truncate, bool):
            raise ConfigError(f"truncate must be true or false, got {self.truncate!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype {self.dtype!r} is not supported; use one of {DTYPES}")
        if self.sparse and self.dtype != "float32":
            raise ConfigError(f"sparse vectors are stored as float32 weights of their non-zero terms; remove --dtype "
                              f"{self.dtype} (or --max-terms N keeps fewer terms)")
        if self.sparse and self.normalize is not None:
            raise ConfigError("sparse vectors are scored by their dot product as the model made them; remove "
                              "--normalize / --no-normalize")
        if not self.sparse and self.max_terms is not None:
            raise ConfigError("--max-terms prunes sparse vectors; add --sparse (a masked-LM model) or remove it")
        check_chunking(self.chunk, self.chunk_overlap)
        if self.multi_vector:
            given = [flag for flag, value in (("--sparse", self.sparse), ("--pooling", self.pooling),
                                              ("--normalize", self.normalize), ("--chunk", self.chunk),
                                              ("--max-terms", self.max_terms)) if value not in (None, False)]
            if given:
                raise ConfigError(f"{given[0]} does not apply to --multi-vector (a ColBERT model's unit vector per "
                                  "token, cut to its document length); remove it")
            if self.dtype not in TOKEN_DTYPES:
                raise ConfigError(f"--multi-vector stores float32 or float16 token vectors; remove --dtype {self.dtype}")
        if self.late_chunking and (self.chunk is None or self.sparse):
            raise ConfigError("--late-chunking pools dense token vectors per chunk: add --chunk TOKENS"
                              if self.chunk is None else "--late-chunking applies to dense vectors; remove it or "
                              "--sparse")

    @property
    def kind(self) -> str:
        """"sparse", "multi-vector" or "dense"."""
        return "sparse" if self.sparse else "multi-vector" if self.multi_vector else "dense"

    @property
    def chunking(self) -> dict[str, Any] | None:
        """{"chunk", "chunk_overlap", "late"} of a chunked run, else None."""
        if self.chunk is None:
            return None
        return {"chunk": self.chunk, "chunk_overlap": self.chunk_overlap or 0, "late": self.late_chunking}

    def options(self) -> dict[str, Any]:
        """The family options given (those left None take the model's): pooling, normalize, max_terms."""
        return {name: value for name, value in (("pooling", self.pooling), ("normalize", self.normalize),
                                                ("max_terms", self.max_terms)) if value is not None}


__all__ = ["DTYPES", "EmbedSettings"]
