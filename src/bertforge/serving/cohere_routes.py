"""The rerank dialects of Cohere and Infinity, each in its own request and answer shape, over the `rerank`
pipeline of a served cross-encoder:

- Cohere v2, `POST /v2/rerank` (`cohere.ClientV2(base_url=...).rerank`): ``{model, query, documents: [str],
  top_n?, max_tokens_per_doc?, return_documents?}`` -> ``{id, results: [{index, relevance_score,
  document?: {text}}], meta: {api_version: {version: "2"}, billed_units: {search_units: 1}}}``, best first;
  each document is cut to its first `max_tokens_per_doc` tokens (Cohere's default 4096) before it is read;
- Cohere v1 (the Cohere body on our `/v1/rerank`, `tei_routes.add_dual_rerank`): ``{id, model, results:
  [{index, relevance_score, document?: {text}}]}``;
- Infinity, `POST /rerank` with ``{query, documents, model?, top_n?, return_documents?, raw_scores?}`` (TEI's
  path; its own body has `texts` instead of `documents`, and `tei_routes` tells the two apart by that field):
  ``{object: "rerank", results: [{relevance_score, index, document?: str}], model, usage:
  {prompt_tokens, total_tokens}, id, created}``, the document as a plain string, as Infinity answers it.

Every dialect reads its query and documents the same way (`rank_documents`): the model named (any name picks
the only reranker served, as those servers ignore it), the documents counted against `max_items`, each text
against `max_chars`, each (query, document) pair cut to the model's window as TEI's `truncate` cuts it, one
request through the model's scheduler. Unknown fields are ignored (listed in ``X-Ignored-Fields``), as those
servers ignore them.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from bertforge.serving.model_service import (  # isort: skip  (first: the serve-extra check)
    InferenceService,
    ModelSet,
    RequestError,
    read_body,
    refusal,
)

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from bertforge.families.reranking import FAMILY as RERANKING
from bertforge.inference.pipelines import TruncatedInput
from bertforge.inference.wire_inputs import query_pairs
from bertforge.serving.guards import note_model
from bertforge.serving.openai_routes import check_length
from bertforge.serving.task_routes import MODEL_PREFIX, TASK_RESPONSES
from bertforge.serving.tei_schemas import CohereDocument
from bertforge.serving.wire_schemas import (
    INPUTS,
    LENIENT_CONFIG,
    Text,
    WireModel,
    lenient_body,
    register,
    request_body,
)

RERANK = RERANKING.task
# What Cohere reads of a document when `max_tokens_per_doc` is not given (its documented default).
COHERE_DOCUMENT_TOKENS = 4096


@register
class CohereV2RerankRequest(WireModel):
    """Cohere's v2 rerank request (unknown fields are ignored, as Cohere's API ignores them)."""

    model_config = LENIENT_CONFIG
    model: str = Field(description="a served reranker's name (with one served, any name answers with it)")
    query: Text
    documents: Annotated[list[Text | CohereDocument], INPUTS]
    top_n: Annotated[int, Field(ge=1)] | None = None
    max_tokens_per_doc: Annotated[int, Field(ge=1)] | None = Field(
        None, description=f"each document is cut to this many tokens first (default {COHERE_DOCUMENT_TOKENS})")
    return_documents: bool = False


@register
class InfinityRerankRequest(WireModel):
    """Infinity's rerank request, as its `/rerank` takes it (unknown fields are ignored)."""

    model_config = LENIENT_CONFIG
    query: Text
    documents: Annotated[list[Text], INPUTS]
    model: str | None = None
    top_n: Annotated[int, Field(ge=1)] | None = None
    return_documents: bool = False
    raw_scores: bool = Field(False, description="the relevant output's logit instead of the relevance in [0, 1]")


class CohereV2Result(BaseModel):
    index: int
    relevance_score: float
    document: dict[str, str] | None = None


class CohereV2RerankResponse(BaseModel):
    id: str
    results: list[CohereV2Result]
    meta: dict[str, Any]


class InfinityResult(BaseModel):
    relevance_score: float
    index: int
    document: str | None = None


class InfinityUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class InfinityRerankResponse(BaseModel):
    object: Literal["rerank"] = "rerank"
    results: list[InfinityResult]
    model: str
    usage: InfinityUsage
    id: str
    created: int


def cut_to_tokens(service: InferenceService, text: str, tokens: int) -> str:
    """`text` up to the end of its first `tokens` tokens (the whole text when it has no more)."""
    offsets = service.pipelines[RERANK].tokenizer.encode(text, add_special_tokens=False).offsets
    return text if len(offsets) <= tokens else text[:offsets[tokens - 1][1]]


async def rank_documents(models: ModelSet, name: str | None, query: str, documents: list[Any], top_n: int | None,
                         request: Request, max_tokens: int | None = None
                         ) -> tuple[InferenceService, list[str], dict[str, Any]]:
    """(the model that ranked, the documents' texts, the rerank pipeline's result: `results` best first, each
    {index, score, logit}, and `tokens`, what the model read) of one query and its documents in any dialect."""
    service = models.pick(name, RERANK, lenient=True)
    note_model(request.scope, service.model_name)
    texts = [d if isinstance(d, str) else d.text for d in documents]
    service.check_count(len(texts), "documents")
    for where, text in (("query", query), *((f"documents[{i}]", t) for i, t in enumerate(texts))):
        check_length(text, service.settings.max_chars, where)
    read = [cut_to_tokens(service, t, max_tokens) for t in texts] if max_tokens else texts
    parsed = service.parse(RERANK, {"query": query, "texts": read}, "documents")
    options = service.check_options(RERANK, {"top_n": top_n})
    truncate, fix = service.truncation()
    with service.scheduler.incoming():
        result = (await service.run(RERANK, [TruncatedInput(parsed, query_pairs, "documents[{position}] with the "
                                                            "query", truncate=truncate, fix=fix)], options,
                                    request))[0]
    return service, texts, result


def cohere_result(ranked: dict[str, Any], texts: list[str], return_documents: bool) -> dict[str, Any]:
    """One of Cohere's results (v1 and v2 alike): the document as ``{"text"}`` when asked for."""
    return {"index": ranked["index"], "relevance_score": ranked["score"],
            **({"document": {"text": texts[ranked["index"]]}} if return_documents else {})}


async def cohere_v1_rerank(models: ModelSet, call: Any, request: Request) -> dict[str, Any]:
    """Cohere v1's answer to its body (`tei_schemas.CohereRerankRequest`) on `/v1/rerank`."""
    service, texts, result = await rank_documents(models, call.model, call.query, call.documents, call.top_n,
                                                  request)
    return {"id": str(uuid.uuid4()), "model": service.model_name,
            "results": [cohere_result(r, texts, call.return_documents) for r in result["results"]]}


async def cohere_v2_rerank(models: ModelSet, call: CohereV2RerankRequest, request: Request) -> dict[str, Any]:
    _, texts, result = await rank_documents(models, call.model, call.query, call.documents, call.top_n, request,
                                            max_tokens=call.max_tokens_per_doc or COHERE_DOCUMENT_TOKENS)
    return {"id": str(uuid.uuid4()),
            "results": [cohere_result(r, texts, call.return_documents) for r in result["results"]],
            "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}}}


async def infinity_rerank(models: ModelSet, name: str | None, call: InfinityRerankRequest,
                          request: Request) -> dict[str, Any]:
    """Infinity's answer: the document as a plain string, when `return_documents` asks for it."""
    service, texts, result = await rank_documents(models, name or call.model, call.query, call.documents,
                                                  call.top_n, request)
    tokens = int(result.get("tokens", 0))
    return {"object": "rerank", "model": service.model_name, "id": f"infinity-{uuid.uuid4()}",
            "created": int(time.time()), "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "results": [{"relevance_score": r["logit"] if call.raw_scores else r["score"], "index": r["index"],
                         **({"document": texts[r["index"]]} if call.return_documents else {})}
                        for r in result["results"]]}


def add_cohere_routes(app: FastAPI, models: ModelSet) -> list[str]:
    """`POST /v2/rerank` (and `/models/{model}/v2/rerank`) where a model reranks."""
    if not models.serving(RERANK):
        return []

    async def v2_rerank(request: Request, name: str | None) -> JSONResponse:
        try:
            call = lenient_body(CohereV2RerankRequest, await read_body(request, models.first.settings), request)
            return JSONResponse(await cohere_v2_rerank(models, call.model_copy(update={"model": name or call.model}),
                                                       request))
        except RequestError as error:
            return refusal(request, error.status, error.message, param=error.param, headers=error.headers)

    async def cohere_v2(request: Request) -> JSONResponse:
        return await v2_rerank(request, None)

    async def cohere_v2_of_model(request: Request, model: str) -> JSONResponse:
        return await v2_rerank(request, model)

    options = dict(methods=["POST"], response_model=CohereV2RerankResponse, responses=TASK_RESPONSES,
                   summary="Cohere v2: documents ranked by relevance to a query (cross-encoder)",
                   openapi_extra=request_body(CohereV2RerankRequest, serves=RERANK))
    app.add_api_route("/v2/rerank", cohere_v2, **options)
    app.add_api_route(MODEL_PREFIX + "/v2/rerank", cohere_v2_of_model, **options)
    return ["POST /v2/rerank", f"POST {MODEL_PREFIX}/v2/rerank"]
