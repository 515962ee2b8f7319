"""bertforge's own task routes: `POST /v1/<task>` for every task a served model supports (`fill-mask`,
`classify`, `tag`, `answer`, `choose`, `embed`, `rerank`), each also under `/models/<name>/v1/<task>`.

A body is ``{"inputs": [...], "parameters": {...}}`` and the answer ``{"outputs": [...]}`` in input order
(`InferenceService.handle`). Without a model in the path, the only served model that supports the task
answers; with several, a 400 names them (`ModelSet.pick`). `/v1/rerank` is registered by `tei_routes`,
which accepts this shape and the Cohere one on the same path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# First: without the serve extra it raises the ConfigError saying how to install it.
from bertforge.serving.model_service import ModelSet, RequestError, refusal  # isort: skip

from bertforge.serving.guards import note_model  # isort: skip
from bertforge.serving.task_schemas import REQUEST_MODELS, RESPONSE_MODELS  # isort: skip
from bertforge.serving.wire_schemas import FIT, SERVES, request_body  # isort: skip

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

MODEL_PREFIX = "/models/{model}"
# The statuses our routes document (the guards add theirs: 401, 415 ...).
class TaskError(BaseModel):
    """bertforge's error body: one line naming the problem and the fix."""

    error: str


TASK_RESPONSES: dict[int | str, dict[str, Any]] = {status: {"model": TaskError, "description": text} for status, text in (
    (400, "malformed JSON, or several models serve the task and none is named"),
    (404, "no served model of that name serves the task"), (413, "too large"), (422, "invalid input"),
    (429, "queue full"), (503, "timed out or shutting down"))}
REQUEST_SCHEMA = {
    "type": "object", "required": ["inputs"],
    "properties": {"inputs": {"type": "array", "minItems": 1, "items": {}, FIT: "items"},
                   "parameters": {"type": "object"}},
}


async def answer_task(models: ModelSet, task: str, request: Request, name: str | None, route: str) -> JSONResponse:
    """One of our task requests, to the model `name` (None: the only one serving `task`)."""
    try:
        service = models.pick(name, task, field="path")
    except RequestError as error:
        return refusal(request, error.status, error.message)
    note_model(request.scope, service.model_name)
    status, payload = await service.handle(task, request)
    return JSONResponse(payload, status_code=status)


def task_endpoint(models: ModelSet, task: str, route: str, prefixed: bool) -> Callable[..., Any]:
    if prefixed:
        async def endpoint(request: Request, model: str) -> JSONResponse:
            return await answer_task(models, task, request, model, route)
    else:
        async def endpoint(request: Request) -> JSONResponse:
            return await answer_task(models, task, request, None, route)
    endpoint.__name__ = task.replace("-", "_") + ("_of_model" if prefixed else "")
    return endpoint


def task_route_options(models: ModelSet, task: str) -> dict[str, Any]:
    """The OpenAPI description of `/v1/<task>`: the first serving model's pipeline's description and example."""
    pipeline = models.services[models.serving(task)[0]].pipelines[task]
    if task in REQUEST_MODELS:  # the strict models (`task_schemas`): every input and output field described
        return dict(summary=f"{task} ({pipeline.family_name})", description=pipeline.description,
                    responses={200: {"model": RESPONSE_MODELS[task], "description": "one output per input, in order"},
                               **TASK_RESPONSES},
                    openapi_extra=request_body(REQUEST_MODELS[task], pipeline.example, serves=task))
    return dict(summary=f"{task} ({pipeline.family_name})", description=pipeline.description,
                responses=TASK_RESPONSES,
                openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                    "schema": REQUEST_SCHEMA, "example": pipeline.example}}}, SERVES: task})


def add_task_routes(app: FastAPI, models: ModelSet, elsewhere: tuple[str, ...] = ()) -> list[str]:
    """`POST /v1/<task>` and `POST /models/{model}/v1/<task>` for every served task but those routed
    `elsewhere` (rerank: `tei_routes`); the routes added, as "METHOD path"."""
    added = []
    for task in models.tasks():
        if task in elsewhere:
            continue
        for prefixed in (False, True):
            route = (MODEL_PREFIX if prefixed else "") + f"/v1/{task}"
            app.add_api_route(route, task_endpoint(models, task, route, prefixed), methods=["POST"],
                              **task_route_options(models, task))
            added.append(f"POST {route}")
    return added
