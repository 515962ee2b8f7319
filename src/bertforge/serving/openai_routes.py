"""OpenAI's embeddings API: `POST /v1/embeddings` and `GET /v1/models` (+ `GET /v1/models/{model}`), with
the request, response and error shapes the OpenAI API reference documents, so OpenAI clients and the RAG
frameworks built on them (`base_url=http://host:port/v1`) work unchanged.

- `input`: a string, a list of strings, a list of token ids or a list of such lists. Token ids are ids of
  the served model's own vocabulary (OpenAI's tiktoken ids mean nothing to a BERT model: clients that
  pre-tokenize, e.g. LangChain's `OpenAIEmbeddings`, need that switched off — docs/serving.md).
- `model`: the served model's name; with one model served, any name answers with it.
- `encoding_format`: "float" (lists of numbers) or "base64" (the little-endian float32 bytes, base64).
- `dimensions`: the first d dimensions, renormalized to unit length, for a model trained for it
  (`EmbedPipeline.matryoshka_dims`); other models refuse any d but their full width (400).
- An input longer than the model's window is cut to it (`ServerSettings.auto_truncate`, the default: the
  RAG clients that send long chunks cannot ask for it), and `usage.truncated_inputs` says how many were (an
  extra key OpenAI's clients keep); a server started with `--auto-truncate false` refuses it (400, naming the
  limit), as OpenAI does. Refusals answer OpenAI's `{"error": {"message", "type", "param", "code"}}` with
  OpenAI's statuses (400 for an invalid request where our own routes say 422).

Vectors come from the `embed` pipeline through the model's scheduler (`InferenceService.run`) with the
model's own pooling and normalization (a sentence-transformers directory's).
"""

from __future__ import annotations

import base64
import time
from typing import Annotated, Any, Literal

from bertforge.serving.model_service import ModelSet, RequestError, read_body, refusal  # isort: skip

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from bertforge.inference.pipelines import EmbedText
from bertforge.inference.wire_inputs import truncated_count
from bertforge.serving.guards import note_model
from bertforge.serving.wire_schemas import (
    ANY_MODEL,
    INPUTS,
    SERVES,
    WIRE_CONFIG,
    Dimensions,
    Text,
    TokenIds,
    WireModel,
    check_body,
    register,
    request_body,
)

# When the server started: the `created` time of every served model.
STARTED = int(time.time())


@register
class EmbeddingsRequest(WireModel):
    """OpenAI's create-embeddings request."""

    input: Text | Annotated[list[Text], INPUTS] | TokenIds | Annotated[list[TokenIds], INPUTS] = Field(
        description="text, list of texts, token ids (of this model's vocabulary), or a list of such lists")
    model: str = Field(description="a served model's name (GET /v1/models)")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Dimensions | None = Field(
        None, description="keep the first d dimensions, renormalized (models trained with Matryoshka widths)")
    user: str | None = Field(None, description="accepted and ignored")


class EmbeddingObject(BaseModel):
    model_config = WIRE_CONFIG
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str
    index: int


class Usage(BaseModel):
    model_config = WIRE_CONFIG
    prompt_tokens: int
    total_tokens: int
    truncated_inputs: int = Field(description="inputs cut to the model's window (bertforge's; OpenAI has none)")


class EmbeddingsResponse(BaseModel):
    model_config = WIRE_CONFIG
    object: Literal["list"] = "list"
    data: list[EmbeddingObject]
    model: str
    usage: Usage


class ModelObject(BaseModel):
    model_config = WIRE_CONFIG
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    model_config = WIRE_CONFIG
    object: Literal["list"] = "list"
    data: list[ModelObject]


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail


ERRORS = {status: {"model": OpenAIError, "description": text} for status, text in (
    (400, "invalid request (bad field, input too long, dimensions not offered)"),
    (404, "model not served"), (413, "request too large"), (429, "queue full"), (503, "overloaded"))}


def embedding_inputs(value: str | list[Any]) -> list[str | tuple[int, ...]]:
    """OpenAI's `input` as a list of texts and token-id tuples."""
    if isinstance(value, str):
        return [value]
    if value and isinstance(value[0], int):
        return [tuple(value)]
    return [tuple(item) if isinstance(item, list) else item for item in value]


def check_length(text: str, max_chars: int, where: str) -> str:
    """A text of at most `max_chars` characters (`ServerSettings.max_chars`), checked before any tokenization;
    RequestError (413) naming the field."""
    if len(text) > max_chars:
        raise RequestError(413, f"{where} has {len(text)} characters; this server accepts at most {max_chars} "
                                "per text", param=where.split("[")[0].split(".")[0])
    return text


def check_ids(ids: tuple[int, ...], vocab_size: int, where: str) -> tuple[int, ...]:
    """Token ids of the model's vocabulary; RequestError (422) naming the first one outside it."""
    outside = next((i for i in ids if i >= vocab_size), None)
    if outside is not None:
        raise RequestError(422, f"{where} holds token id {outside}, outside this model's vocabulary of {vocab_size}",
                           param=where.split("[")[0])
    return ids


def shorten(vectors: np.ndarray, dimensions: int | None, widths: tuple[int, ...],
            renormalize: bool = True) -> np.ndarray:
    """The first `dimensions` of each vector (Matryoshka), renormalized to unit length unless told not to
    (TEI's `normalize: false`), where the model allows it."""
    full = vectors.shape[1]
    if dimensions is None or dimensions == full:
        return vectors
    if not widths:
        raise RequestError(400, f"this model's embeddings have {full} dimensions and were not trained to be cut "
                                f"(no Matryoshka widths in its finetuning.json); omit dimensions or send {full}",
                           param="dimensions")
    if dimensions > full:
        raise RequestError(400, f"dimensions={dimensions} is more than the model's {full}", param="dimensions")
    cut = vectors[:, :dimensions]
    return cut / np.maximum(np.linalg.norm(cut, axis=1, keepdims=True), 1e-12) if renormalize else cut


def encode_vector(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.astype(np.float32).tolist()


async def create_embeddings(models: ModelSet, request: Request) -> JSONResponse:
    try:
        body = await read_body(request, models.first.settings)
        # OpenAI answers 400 for every invalid request (our routes: 422).
        call = check_body(EmbeddingsRequest, body, status=400)
        service = models.pick(call.model, "embed", lenient=True)
        note_model(request.scope, service.model_name)
        pipeline = service.pipelines["embed"]
        items = embedding_inputs(call.input)
        service.check_count(len(items), "input", status=400)
        parsed = []
        truncate, fix = service.truncation()
        for index, item in enumerate(items):
            if isinstance(item, str):
                check_length(item, service.settings.max_chars, f"input[{index}]")
                parsed.append(EmbedText(text=service.parse("embed", item, f"input[{index}]"), truncate=truncate,
                                        fix=fix))
            else:
                parsed.append(EmbedText(ids=check_ids(item, pipeline.tokenizer.vocab_size, f"input[{index}]"),
                                        truncate=truncate, fix=fix))
        with service.scheduler.incoming():
            results = await service.run("embed", parsed, pipeline.check_options({}), request)
        vectors = shorten(np.asarray([r["embedding"] for r in results], dtype=np.float32), call.dimensions,
                          pipeline.matryoshka_dims)
        tokens = sum(r["tokens"] for r in results)
        payload = {"object": "list", "model": service.model_name,
                   "data": [{"object": "embedding", "embedding": encode_vector(v, call.encoding_format), "index": i}
                            for i, v in enumerate(vectors)],
                   "usage": {"prompt_tokens": tokens, "total_tokens": tokens,
                             "truncated_inputs": truncated_count(results)}}
        response = JSONResponse(payload)
    except RequestError as error:
        status = 400 if error.status == 422 else error.status
        response = refusal(request, status, error.message, param=error.param, code=error.code,
                           headers=error.headers)
    return response


def model_object(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": STARTED, "owned_by": "bertforge"}


def add_openai_routes(app: FastAPI, models: ModelSet) -> list[str]:
    """The OpenAI routes (embeddings only where some model serves embed: every BERT does)."""
    added = []
    if models.serving("embed"):
        async def embeddings(request: Request) -> JSONResponse:
            return await create_embeddings(models, request)

        app.add_api_route("/v1/embeddings", embeddings, methods=["POST"], response_model=EmbeddingsResponse,
                          summary="OpenAI: create embeddings", responses=ERRORS,
                          openapi_extra=request_body(EmbeddingsRequest,
                                                     {"input": ["A man is eating food."], "model": models.names[0]}))
        added.append("POST /v1/embeddings")

    @app.get("/v1/models", response_model=ModelList, summary="OpenAI: the served models")
    async def list_models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [model_object(name) for name in models.names]})

    @app.get("/v1/models/{model}", response_model=ModelObject, summary="OpenAI: one served model",
             responses={404: {"model": OpenAIError, "description": "model not served"}},
             openapi_extra={SERVES: ANY_MODEL})
    async def retrieve_model(model: str, request: Request) -> JSONResponse:
        if model not in models.services:
            return refusal(request, 404, f"model {model!r} is not served here; served models: {models.names}",
                           param="model", code="model_not_found")
        return JSONResponse(model_object(model))

    return added + ["GET /v1/models", "GET /v1/models/{model}"]
