"""The answers of the model routes: their size bounded before the model runs, their bytes made off the event loop.

Size. What a route answers grows with what it is asked, far beyond the request: vectors (inputs x width), token
vectors (`/embed_all`, embed's `token_vectors`, `/v1/embed-multi-vector`: tokens x width), sparse vectors (inputs x terms; a SPLADE model
that is untrained, or trained badly, gives weight to the whole vocabulary, 30k terms a text), attention maps
(layers x heads x tokens^2). `bound_answer` counts an answer's bytes at the most each number takes
(`NUMBER_BYTES`, `SPARSE_TERM_BYTES`, `WEIGHT_BYTES`: an upper bound, so an answer admitted is never larger) and
refuses one over `max_answer_bytes` with a 413 that names the limit and its flag, before any model call: vectors
and sparse vectors from the request alone, token vectors from the windows' tokens as the scheduler admits the
request (a `TokenLimit` on the job), attention maps once their one text is tokenized (both a `TokenLimit` the scheduler checks as it admits).
Sparse vectors keep at most `max_sparse_terms` terms each (the family's top-k pruning, `families.sparse.prune`,
which runs with the model): by default their 256 largest weights.

Bytes. `respond` makes the JSON in a worker thread and answers it as bytes, so a large answer costs its own
client time and no one else's: the event loop keeps answering `/health`, `/ready` and every other request
while it is written. Numbers are written by orjson, float arrays as the shortest decimal of their float32
value (as text-embeddings-inference writes them; read back as float32 they are the exact values), large
arrays `BLOCK` numbers at a time so the thread writing them gives the interpreter's lock back between blocks.
A route marks its arrays: `Floats` (vectors, token vectors, weights; `decimals` rounds, as attention maps are)
and `SparseTerms` (TEI's ``[{"index", "value"}]`` of one sparse vector).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from bertforge.families.colbert import ColBERT
from bertforge.families.embedding import Embedding, vector_width
from bertforge.families.sparse import SparseEmbedding
from bertforge.inference.attention import AttentionSteps
from bertforge.serving.envelopes import RequestError, serve_extra_missing

try:
    import orjson
    from fastapi.responses import Response
except ImportError as missing:  # the serve extra is optional; say how to get it when it is needed
    raise serve_extra_missing(missing) from None

# The most bytes one float32 takes in an answer: its shortest decimal is at most 16 characters
# ("-0.0000011458033", "-1961229700000.0"), then a comma.
NUMBER_BYTES = 17
# One term of a sparse vector in TEI's shape, at most: {"index":250001,"value":<number>}, and a comma (our own
# shape, parallel "indices" and "values" lists, takes less).
SPARSE_TERM_BYTES = len('{"index":,"value":}') + 6 + NUMBER_BYTES
# One attention weight: a probability rounded to 4 decimals ("0.1234") and a comma.
WEIGHT_BYTES = 7
# What an answer adds around each input's numbers, at most (OpenAI's {"object": "embedding", "index": ...}).
ITEM_BYTES = 64
# Numbers written at once: a few milliseconds with the interpreter's lock held.
BLOCK = 1 << 16
FLAG = "raise it with `bertforge serve --max-answer-bytes`"
NUMPY = orjson.OPT_SERIALIZE_NUMPY

# A bound checked once the scheduler has windowed a request: its windows' token counts -> a refusal or None.
TokenLimit = Callable[[list[int]], str | None]


# --- size -----------------------------------------------------------------------------------------------

def over_budget(size: int, limit: int, what: str) -> str | None:
    """The refusal of an answer of about `size` bytes under the budget `limit` (0: none), or None."""
    if not limit or size <= limit:
        return None
    return (f"the answer would be up to {size:,} bytes ({what}); this server answers at most {limit:,} bytes per "
            f"request (max_answer_bytes; {FLAG}), so send fewer or shorter inputs")


def check_size(size: int, limit: int, what: str, param: str | None = None) -> None:
    """413 for an answer of up to `size` bytes over the budget `limit`."""
    refused = over_budget(size, limit, what)
    if refused is not None:
        raise RequestError(413, refused, param=param)


def sparse_terms(options: Mapping[str, Any], cap: int) -> int:
    """The terms each sparse vector keeps: the request's `max_terms` (0: every term) under the server's cap
    `cap` (`max_sparse_terms`, 0: none); 413 for a request asking for more than the cap."""
    asked = options.get("max_terms") or 0
    if cap and asked > cap:
        raise RequestError(413, f"max_terms={asked} is more than this server keeps per sparse vector "
                                f"(max_sparse_terms={cap}; raise it with `bertforge serve --max-sparse-terms`)",
                           param="parameters")
    return min(asked or cap, cap) if cap else asked


@lru_cache(maxsize=8)
def longest_token_bytes(tokenizer: Any) -> int:
    """The JSON of the longest vocabulary entry, with its comma: what the `tokens` option adds per term."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))
    return max((len(orjson.dumps(token)) for token in tokens), default=2) + 1


def bound_answer(pipeline: Any, options: dict[str, Any], inputs: int, *, max_answer_bytes: int,
                 max_sparse_terms: int) -> tuple[dict[str, Any], TokenLimit | None]:
    """(the options the model runs with, a bound for the scheduler to check once tokens are known) of a
    request of `inputs` inputs to `pipeline`; RequestError (413) when the answer is over `max_answer_bytes`
    whatever the tokens. Sparse vectors get `max_terms` at most `max_sparse_terms`."""
    if isinstance(pipeline, AttentionSteps):  # one window per text: its tokens decide the maps' size
        config = pipeline.encoder.config
        return options, lambda tokens: attention_refusal(config.num_hidden_layers, config.num_attention_heads,
                                                         max(tokens, default=0), max_answer_bytes)
    family = getattr(pipeline, "family", None)  # (a stand-in pipeline of a test may have none)
    if isinstance(family, SparseEmbedding):
        terms = sparse_terms(options, max_sparse_terms)
        options = {**options, "max_terms": terms}
        kept = terms or pipeline.config.vocab_size
        per_term = SPARSE_TERM_BYTES + (longest_token_bytes(pipeline.tokenizer) if options.get("tokens") else 0)
        check_size(inputs * (kept * per_term + ITEM_BYTES), max_answer_bytes,
                   f"{inputs} sparse vectors of up to {kept:,} terms; max_sparse_terms caps the terms")
        return options, None
    if isinstance(family, ColBERT):  # a vector per token, its marker's too; a query's filled to its length
        width, length = pipeline.model.dimension, pipeline.model.colbert.query_length

        def multi_vectors(tokens: list[int]) -> str | None:
            count = sum(max(t + 1, length if options["role"] == "query" else 0) for t in tokens)
            return over_budget(count * width * NUMBER_BYTES + len(tokens) * ITEM_BYTES, max_answer_bytes,
                               f"{count:,} token vectors of {width} numbers, from {len(tokens)} inputs")
        return options, multi_vectors
    if not isinstance(family, Embedding):
        return options, None
    width = vector_width(pipeline.config.hidden_size, options["pooling"])
    if not options.get("token_vectors"):
        check_size(inputs * (width * NUMBER_BYTES + ITEM_BYTES), max_answer_bytes,
                   f"{inputs} vectors of {width} numbers")
        return options, None

    def token_vectors(tokens: list[int]) -> str | None:  # one window per input: its tokens' vectors
        count = sum(tokens)
        return over_budget(count * width * NUMBER_BYTES + len(tokens) * ITEM_BYTES, max_answer_bytes,
                           f"{count:,} token vectors of {width} numbers, from {len(tokens)} inputs")
    return options, token_vectors


def attention_refusal(layers: int, heads: int, tokens: int, limit: int) -> str | None:
    """The refusal of attention maps of `tokens` tokens (layers x heads x tokens^2 weights) over `limit`."""
    size = layers * heads * tokens * (tokens * WEIGHT_BYTES + 3) + ITEM_BYTES + tokens * ITEM_BYTES
    return over_budget(size, limit, f"{layers} layers x {heads} heads x {tokens}^2 attention weights")


# --- bytes ----------------------------------------------------------------------------------------------

class Floats:
    """Numbers written as float32's shortest decimal (nested lists, or an array); `decimals`: rounded first.
    (Not a dataclass: orjson would write a dataclass as an object.)"""

    __slots__ = ("values", "decimals")

    def __init__(self, values: Any, decimals: int | None = None):
        self.values, self.decimals = values, decimals

    def array(self) -> np.ndarray:
        if self.decimals is None:
            return np.ascontiguousarray(self.values, dtype=np.float32)
        return np.round(np.asarray(self.values, dtype=np.float64), self.decimals)


class SparseTerms:
    """One sparse vector in TEI's shape: ``[{"index": i, "value": w}, ...]`` in the order given."""

    __slots__ = ("indices", "values")

    def __init__(self, indices: Sequence[int], values: Sequence[float]):
        self.indices, self.values = indices, values


def vectors_of(results: Sequence[Mapping[str, Any]], field: str = "embedding") -> np.ndarray:
    """The results' vectors as one float32 array [N, D], made a row at a time: one call converting 2,048 lists
    of floats would hold the interpreter's lock (and so the event loop) for a tenth of a second."""
    if not results:
        return np.zeros((0, 0), dtype=np.float32)
    return np.stack([np.asarray(result[field], dtype=np.float32) for result in results])


def array_json(array: np.ndarray) -> bytes:
    """The JSON of a numeric array (nested lists), at most `BLOCK` numbers per call into orjson."""
    if array.size <= BLOCK or array.ndim == 0:
        return orjson.dumps(array, option=NUMPY)
    if array.ndim == 1:
        pieces = [orjson.dumps(array[start:start + BLOCK], option=NUMPY)[1:-1]
                  for start in range(0, len(array), BLOCK)]
    else:
        row = array[0].size
        if row > BLOCK:
            pieces = [array_json(part) for part in array]
        else:
            step = BLOCK // row
            pieces = [orjson.dumps(array[start:start + step], option=NUMPY)[1:-1]
                      for start in range(0, len(array), step)]
    return b"[" + b",".join(pieces) + b"]"


def sparse_json(terms: SparseTerms) -> bytes:
    if not len(terms.indices):
        return b"[]"
    numbers = orjson.dumps(np.asarray(terms.values, dtype=np.float32), option=NUMPY)[1:-1].split(b",")
    return b"[" + b",".join(b'{"index":%d,"value":%s}' % pair for pair in zip(terms.indices, numbers)) + b"]"


def fragment(value: Any) -> orjson.Fragment:
    """orjson's hook for the marked arrays: their JSON, already written."""
    if isinstance(value, Floats):
        return orjson.Fragment(array_json(value.array()))
    if isinstance(value, SparseTerms):
        return orjson.Fragment(sparse_json(value))
    if isinstance(value, np.ndarray):  # one orjson does not take as it is (not contiguous, float16 ...)
        return orjson.Fragment(array_json(np.ascontiguousarray(value, dtype=np.float32)))
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def encode(answer: Any) -> bytes:
    """The JSON bytes of `answer` (a JSON value that may hold `Floats`, `SparseTerms` and numpy arrays; or a
    function making one, called here)."""
    if callable(answer):
        answer = answer()
    return orjson.dumps(answer, default=fragment, option=NUMPY)


async def respond(answer: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """The response of `answer` (see `encode`), made in a worker thread: never on the event loop."""
    body = await asyncio.to_thread(encode, answer)
    return Response(body, status_code=status, headers=dict(headers or {}), media_type="application/json")


def task_outputs(family: Any, results: list[Any]) -> list[Any]:
    """Our routes' results of `family` with their vectors marked as float32 numbers (`Floats`): the weights of
    sparse vectors, the vectors (or token vectors) of the embedding family."""
    field = "values" if isinstance(family, SparseEmbedding) else "embedding" if isinstance(family, Embedding) else None
    if field is None:
        return results
    return [{**result, field: Floats(result[field])} if field in result else result for result in results]


__all__ = ["BLOCK", "Floats", "NUMBER_BYTES", "SPARSE_TERM_BYTES", "SparseTerms", "TokenLimit", "WEIGHT_BYTES",
           "attention_refusal", "bound_answer", "check_size", "encode", "respond", "sparse_terms", "task_outputs",
           "vectors_of"]
