"""text-embeddings-inference's routes with TEI's request, response and error shapes (its `openapi.json`):
`POST /embed`, `/embed_sparse`, `/embed_all`, `/similarity`, `/rerank`, `/predict`, `/tokenize`, `/decode`,
`GET /info`, each also under
`/models/<name>/...` (a TEI client's base URL per model), and `POST /v1/rerank`, which takes bertforge's
``{"inputs", "parameters"}`` body and Cohere's (``{"query", "documents", "top_n", "return_documents"}``) on
one path, told apart by their fields. `/rerank` also takes Infinity's body (`documents` where TEI's has
`texts`) and answers in Infinity's shape (`cohere_routes`). As TEI, the routes ignore request fields they do
not use (`TeiModel`), naming them in ``X-Ignored-Fields``; /info answers without a model name (the first
model's fields, and every model under `models`).

Every route runs the served model's pipelines through its scheduler (`InferenceService.run`): /embed the
`embed` pipeline (/embed_all with its token vectors, /similarity with its unit vectors: the cosine of the
source sentence with each other one), /embed_sparse the `embed-sparse` pipeline ([{index, value}] of each
text's non-zero terms), /rerank the `rerank` pipeline, /predict the `classify` pipeline, each input with the
one truncation rule (`wire_inputs`: `EmbedText`, `TruncatedInput`): an input, or a query+text pair, longer than
the pipeline's window (`max_input_length` in /info) is cut from `truncation_direction`'s end (a pair longest
first, as TEI's tokenizer) when the request's `truncate` says so or, absent or null, when the server's
`auto_truncate` does (its default, TEI's `--auto-truncate`, which `/info` reports), and the answer's
``X-Truncated-Inputs`` header says how many were; otherwise it is refused (422 naming the limit, before any
model call); never windowed as our own /v1/classify windows a long text. `raw_scores` gives the model's output row as it
is (/rerank: the relevant output's logit; /predict: every label's logit, best first, as TEI sorts). A route
whose task no served model has answers 424, as TEI does for a model of the wrong kind. Refusals use TEI's
`{"error", "error_type"}`; every answer names its model in ``X-Model`` (`guards.note_model`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from bertforge.serving.model_service import (  # isort: skip  (first: the serve-extra check)
    InferenceService,
    ModelSet,
    RequestError,
    read_body,
    refusal,
)

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from bertforge import __version__
from bertforge.errors import InputError
from bertforge.inference.pipelines import EmbedText, TruncatedInput
from bertforge.inference.wire_inputs import query_pairs
from bertforge.serving.cohere_routes import (
    InfinityRerankRequest,
    InfinityRerankResponse,
    cohere_v1_rerank,
    infinity_rerank,
)
from bertforge.serving.guards import note_model
from bertforge.serving.openai_routes import check_ids, check_length, shorten
from bertforge.serving.task_routes import MODEL_PREFIX, task_route_options
from bertforge.serving.tei_schemas import (
    TEI_ERRORS,
    ClassificationParameters,
    CohereRerankRequest,
    CohereRerankResponse,
    DecodeRequest,
    EmbedAllRequest,
    EmbedRequest,
    EmbedSparseRequest,
    Info,
    ModelPredictRequest,
    Prediction,
    PredictRequest,
    Rank,
    RerankRequest,
    SimilarityParameters,
    SimilarityRequest,
    SimpleToken,
    SparseValue,
    TokenizeRequest,
)
from bertforge.serving.wire_schemas import ANY_MODEL, ROOT, SERVES, check_body, lenient_body, request_body

# The pipelines the TEI routes run (the routes are bound to them: /embed embeds, /rerank reranks ...).
EMBED, RERANK, CLASSIFY, EMBED_SPARSE, FILL_MASK = "embed", "rerank", "classify", "embed-sparse", "fill-mask"
# Our task routes this module serves on their path too (`/v1/rerank`: ours and Cohere's shape).
DUAL_ROUTES = (RERANK,)


# --- answers (each: validated request -> JSON value) -------------------------------------------------------

def tei_inputs(value: Any) -> list[Any]:
    """TEI's `inputs` (one input, or a list) as a list: a string or token ids is one input."""
    if isinstance(value, str) or (isinstance(value, list) and value and isinstance(value[0], int)):
        return [value]
    return list(value)


def prompt_of(service: InferenceService, name: str | None, task: str = EMBED) -> str:
    """The prefix TEI's `prompt_name` names (the directory's sentence-transformers prompts); none without a
    name, as TEI documents."""
    if name is None:
        return ""
    if task not in service.pipelines:
        raise RequestError(422, "prompt_name: this model has no prompts", param="prompt_name")
    try:
        return service.pipelines[task].prompt_text(name)
    except InputError as error:  # an unknown prompt name
        raise RequestError(422, f"prompt_name: {error}", param="prompt_name") from None


def embed_texts(service: InferenceService, task: str, items: list[Any], call: Any, where: str = "inputs",
                counted: int | None = None, names: list[str] | None = None) -> list[EmbedText]:
    """TEI's inputs (texts or token ids) of an embedding route as `EmbedText`s of `task`'s pipeline, checked,
    with the call's prompt and truncation (`call`: prompt_name, truncate, truncation_direction). `counted`: the
    inputs held to `max_items` when not all of them are (the client's list, not what the route adds to it);
    `names`: each item's place in the request, for refusals (default `where[index]`)."""
    service.check_count(len(items) if counted is None else counted, where, status=413)
    prefix = prompt_of(service, call.prompt_name, task)
    direction = call.truncation_direction.lower()
    truncate, fix = service.truncation(call.truncate, "truncate")
    parsed = []
    for index, item in enumerate(items):
        name = names[index] if names else f"{where}[{index}]"
        if isinstance(item, str):
            check_length(item, service.settings.max_chars, name)
            text = service.parse(task, prefix + item, name)
            parsed.append(EmbedText(text=text, truncate=truncate, direction=direction, fix=fix))
        else:
            ids = check_ids(tuple(item), service.pipelines[task].tokenizer.vocab_size, name)
            parsed.append(EmbedText(ids=ids, truncate=truncate, direction=direction, fix=fix))
    return parsed


async def embed(service: InferenceService, call: EmbedRequest, request: Request) -> Any:
    pipeline = service.pipelines[EMBED]
    parsed = embed_texts(service, EMBED, tei_inputs(call.inputs), call)
    options = service.check_options(EMBED, {"normalize": call.normalize})
    results = await service.run(EMBED, parsed, options, request)
    vectors = np.asarray([r["embedding"] for r in results], dtype=np.float32)
    try:
        vectors = shorten(vectors, call.dimensions, pipeline.matryoshka_dims, renormalize=call.normalize)
    except RequestError as error:
        raise RequestError(422, error.message, param="dimensions") from None
    return vectors.tolist()


async def embed_sparse(service: InferenceService, call: EmbedSparseRequest, request: Request) -> Any:
    """Each text's non-zero vocabulary terms as TEI's [{index, value}], term ids ascending."""
    parsed = embed_texts(service, EMBED_SPARSE, tei_inputs(call.inputs), call)
    results = await service.run(EMBED_SPARSE, parsed, service.check_options(EMBED_SPARSE, {}), request)
    return [[{"index": i, "value": v} for i, v in zip(r["indices"], r["values"])] for r in results]


async def embed_all(service: InferenceService, call: EmbedAllRequest, request: Request) -> Any:
    """Each text's token vectors of the last layer, special tokens included: [texts][tokens][hidden]."""
    parsed = embed_texts(service, EMBED, tei_inputs(call.inputs), call)
    results = await service.run(EMBED, parsed, service.check_options(EMBED, {"token_vectors": True}), request)
    return [r["embedding"] for r in results]


async def similarity(service: InferenceService, call: SimilarityRequest, request: Request) -> Any:
    """The cosine of `source_sentence` with each of `sentences`, in their order (Hugging Face's
    sentence-similarity task, `InferenceClient.sentence_similarity`)."""
    texts = [call.inputs.source_sentence, *call.inputs.sentences]
    # `sentences` is the list held to max_items (as the published schema says); the source sentence comes extra
    names = ["source_sentence", *(f"sentences[{i}]" for i in range(len(call.inputs.sentences)))]
    parsed = embed_texts(service, EMBED, texts, call.parameters or SimilarityParameters(), "sentences",
                         counted=len(call.inputs.sentences), names=names)
    results = await service.run(EMBED, parsed, service.check_options(EMBED, {"normalize": True}), request)
    vectors = np.asarray([r["embedding"] for r in results], dtype=np.float32)  # [1 + n, H], unit rows
    return (vectors[1:] @ vectors[0]).tolist()


def text_pair(example: Any) -> list[tuple[str, str | None]]:
    """What a classifier reads for a classify input: its text and pair (None for a single text)."""
    return [(example.text_a, example.text_b)]


async def rerank(service: InferenceService, call: RerankRequest, request: Request) -> Any:
    service.check_count(len(call.texts), "texts", status=413)
    for where, text in (("query", call.query), *((f"texts[{i}]", t) for i, t in enumerate(call.texts))):
        check_length(text, service.settings.max_chars, where)
    query = service.parse(RERANK, {"query": call.query, "texts": call.texts}, "texts")
    truncate, fix = service.truncation(call.truncate, "truncate")
    parsed = [TruncatedInput(query, query_pairs, "texts[{position}] with the query", truncate=truncate,
                             direction=call.truncation_direction.lower(), fix=fix)]
    options = service.check_options(RERANK, {"return_text": call.return_text})
    ranked = (await service.run(RERANK, parsed, options, request))[0]["results"]
    # raw_scores: the relevant output's logit, else the relevance in [0, 1]; best first either way.
    return [{"index": r["index"], "score": r["logit"] if call.raw_scores else r["score"],
             **({"text": r["text"]} if call.return_text else {})} for r in ranked]


def predictions(result: dict[str, Any], raw_scores: bool, labels: list[str]) -> list[dict[str, Any]]:
    """TEI's predictions of one input (every label, best first) from the classify pipeline's result.

    `raw_scores`: the logits of its one window as they are; else a one-output model's sigmoid, the softmax of a
    single-label model and the per-label sigmoid of a multi-label one (the family's probabilities). Sorted as
    TEI sorts: by score, highest first, a tie the later label first."""
    if raw_scores:
        scores = result["logits"][0]
    elif "value" in result:  # a one-output model: TEI's score is the sigmoid of the logit
        scores = [float(1 / (1 + np.exp(-float(result["value"]))))]
    else:
        scores = [result["scores"][label] for label in labels]
    names = labels or [f"LABEL_{i}" for i in range(len(scores))]
    ranked = sorted(enumerate(scores), key=lambda pair: (pair[1], pair[0]), reverse=True)
    return [{"label": names[i], "score": float(score)} for i, score in ranked]


async def predict(service: InferenceService, call: PredictRequest, request: Request) -> Any:
    single = isinstance(call.inputs, str) or (call.inputs and isinstance(call.inputs[0], str))
    items = [call.inputs] if single else list(call.inputs)
    service.check_count(len(items), status=413)
    for index, item in enumerate(items):
        for text in [item] if isinstance(item, str) else item:
            check_length(text, service.settings.max_chars, f"inputs[{index}]")
    parsed = []
    truncate, fix = service.truncation(call.truncate, "truncate")
    for index, item in enumerate(items):
        example = service.parse(CLASSIFY, item if isinstance(item, str) else list(item), f"inputs[{index}]")
        parsed.append(TruncatedInput(example, text_pair, "inputs[{index}]", truncate=truncate,
                                     direction=call.truncation_direction.lower(), fix=fix))
    results = await service.run(CLASSIFY, parsed, service.check_options(CLASSIFY, {}), request)
    config = service.pipelines[CLASSIFY].config
    labels = [config.id2label[i] for i in sorted(config.id2label)] if config.id2label else []
    answers = [predictions(result, call.raw_scores, labels) for result in results]
    return answers[0] if single else answers


async def predict_with_parameters(service: InferenceService, call: ModelPredictRequest, request: Request) -> Any:
    """`predict` with Hugging Face's `parameters`: `function_to_apply` over the raw scores ("none": as they are),
    the `top_k` best; with `parameters` given (Hugging Face's task API), one list per input even for a single
    text, the shape that API answers and its client reads."""
    parameters = call.parameters or ClassificationParameters()
    function = parameters.function_to_apply
    plain = PredictRequest(**call.model_dump(exclude={"parameters"}))
    if function is not None:
        plain.raw_scores = True
    answers = await predict(service, plain, request)
    single = bool(answers) and isinstance(answers[0], dict)
    ranked = []
    for answer in [answers] if single else answers:
        scores = np.asarray([item["score"] for item in answer], dtype=np.float64)
        if function == "softmax":
            scores = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
        elif function == "sigmoid":
            scores = 1 / (1 + np.exp(-scores))
        ranked.append([{"label": item["label"], "score": float(score)} for item, score in zip(answer, scores)]
                      [:parameters.top_k])
    return ranked[0] if single and call.parameters is None else ranked


def tokenize(service: InferenceService, call: TokenizeRequest) -> Any:
    pipeline = next(iter(service.pipelines.values()))
    items = [call.inputs] if isinstance(call.inputs, str) else call.inputs
    service.check_count(len(items), status=413)
    prefix = prompt_of(service, call.prompt_name)
    answers = []
    for index, item in enumerate(items):
        check_length(item, service.settings.max_chars, f"inputs[{index}]")
        text = prefix + service.parse(EMBED, item, f"inputs[{index}]") if EMBED in service.pipelines else item
        encoding = pipeline.tokenizer.encode(text, add_special_tokens=call.add_special_tokens)
        tokens = []
        for token_id, token, special, (start, stop) in zip(encoding.ids, encoding.tokens,
                                                             encoding.special_tokens_mask, encoding.offsets):
            tokens.append({"id": token_id, "text": token if special else text[start:stop], "special": bool(special),
                           "start": None if special else start, "stop": None if special else stop})
        answers.append(tokens)
    return answers


def decode(service: InferenceService, call: DecodeRequest) -> Any:
    tokenizer = next(iter(service.pipelines.values())).tokenizer
    batches = [call.ids] if call.ids and isinstance(call.ids[0], int) else call.ids
    service.check_count(len(batches), "ids", status=413)
    return [tokenizer.decode(check_ids(tuple(ids), tokenizer.vocab_size, f"ids[{index}]"),
                             skip_special_tokens=call.skip_special_tokens) for index, ids in enumerate(batches)]


def info(models: ModelSet, name: str | None) -> dict[str, Any]:
    """TEI's /info of the model named (None: the first served, which answers TEI's single-model fields), with
    `models`: every served model's name, kind, tasks and input limit (TEI serves one model; a client of several
    finds them here)."""
    service = models.named(name) if name is not None else models.first
    return {**model_info(service), "models": [{key: value for key, value in model_info(s).items()
                                               if key in ("model_id", "model_type", "tasks", "max_input_length")}
                                              for s in models.services.values()]}


def model_info(service: InferenceService) -> dict[str, Any]:
    """TEI's /info fields of one served model (and `tasks`, ours)."""
    pipelines = service.pipelines
    config = next(iter(pipelines.values())).config
    labels = {"id2label": {str(k): v for k, v in (config.id2label or {}).items()},
              "label2id": dict(config.label2id or {})}
    if RERANK in pipelines:
        kind, served = {"reranker": labels}, pipelines[RERANK]
    elif CLASSIFY in pipelines:
        kind, served = {"classifier": labels}, pipelines[CLASSIFY]
    else:
        kind = {"embedding": {"pooling": "splade" if is_sparse(service) else pipelines[EMBED].defaults[
            "pooling"] if EMBED in pipelines else "cls"}}  # TEI's name of a sparse model's pooling: splade
        served = pipelines.get(EMBED_SPARSE) or pipelines.get(EMBED) or next(iter(pipelines.values()))
    first = pipelines.get(EMBED) or next(iter(pipelines.values()))
    settings = service.settings
    return {"model_id": service.model_name, "model_sha": None,
            "model_dtype": {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(first.precision,
                                                                                          first.precision),
            "model_type": kind, "max_concurrent_requests": settings.max_queue, "max_input_length": served.max_length,
            "max_batch_tokens": settings.max_batch_tokens, "max_batch_requests": settings.max_batch_size,
            "max_client_batch_size": settings.max_items, "auto_truncate": settings.auto_truncate, "tokenization_workers": 1,
            "version": __version__, "tasks": list(pipelines)}


# --- routes ---------------------------------------------------------------------------------------------

async def answer(request: Request, run: Callable[[], Awaitable[Any]]) -> JSONResponse:
    """Run one wire request; any refusal in the route's envelope."""
    try:
        return JSONResponse(await run())
    except RequestError as error:
        return refusal(request, error.status, error.message, param=error.param, code=error.code,
                       headers=error.headers)


TEI_ROUTES: dict[str, tuple[str | None, type[BaseModel] | None, Any, str]] = {
    # path: (task the model must serve, request model, answer function, summary)
    "/embed": (EMBED, EmbedRequest, embed, "TEI: embeddings of one or several inputs"),
    "/embed_sparse": (EMBED_SPARSE, EmbedSparseRequest, embed_sparse, "TEI: sparse (SPLADE) vectors: each input's "
                      "non-zero vocabulary terms"),
    "/embed_all": (EMBED, EmbedAllRequest, embed_all, "TEI: the token vectors of each input (no pooling)"),
    "/similarity": (EMBED, SimilarityRequest, similarity, "TEI: cosine of a source sentence with each other one"),
    "/rerank": (RERANK, RerankRequest, rerank, "TEI: texts ranked by relevance to a query (cross-encoder)"),
    "/predict": (CLASSIFY, PredictRequest, predict, "TEI: label scores of texts or text pairs"),
    "/tokenize": (None, TokenizeRequest, tokenize, "TEI: tokens with character offsets"),
    "/decode": (None, DecodeRequest, decode, "TEI: text of token ids"),
}
# Other dialects' bodies a TEI path also takes, told apart by a field only theirs has: Infinity's rerank body
# (`documents` where TEI's has `texts`) on /rerank (`cohere_routes`). path: (field, request model, answer).
OTHER_BODIES: dict[str, tuple[str, type[BaseModel], Any]] = {
    "/rerank": ("documents", InfinityRerankRequest, infinity_rerank)}
# What `POST /` of a classifier runs: /predict, taking Hugging Face's `parameters` too.
MODEL_PREDICT = (CLASSIFY, ModelPredictRequest, predict_with_parameters, "")
RESPONSES = {"/embed": list[list[float]], "/embed_sparse": list[list[SparseValue]],
             "/embed_all": list[list[list[float]]], "/similarity": list[float],
             "/rerank": list[Rank] | InfinityRerankResponse, "/predict": list[Prediction] | list[list[Prediction]],
             "/tokenize": list[list[SimpleToken]], "/decode": list[str]}


async def tei_work(models: ModelSet, path: str, request: Request, name: str | None) -> Any:
    """The answer of TEI route `path` to `request` for the model `name` (None: the route's rule of `pick`).
    Fields the route does not use are ignored, as TEI ignores them, and named in ``X-Ignored-Fields``."""
    task, model_class, function, _ = MODEL_PREDICT if path == "/" + CLASSIFY else TEI_ROUTES[path]
    body = await read_body(request, models.first.settings)
    field, other_class, other = OTHER_BODIES.get(path, ("", None, None))
    if other is not None and isinstance(body, dict) and field in body and "texts" not in body:
        if not models.serving(task):
            raise RequestError(424, no_model_does(models, task, path))
        return await other(models, name, lenient_body(other_class, body, request), request)
    call = lenient_body(model_class, body, request)
    if task is not None and not models.serving(task):
        raise RequestError(424, no_model_does(models, task, path))
    service = models.pick(name, task, field="path") if task else models.named(name)
    note_model(request.scope, service.model_name)
    if task is None:
        return function(service, call)
    with service.scheduler.incoming():
        return await function(service, call, request)


def no_model_does(models: ModelSet, task: str, path: str) -> str:
    """The 424 of a TEI route whose task no served model has, naming what each serves and how to serve it."""
    how = (" (a cross-encoder with one output reranks; serve a two-label pair classifier as one with "
           "`bertforge serve --rerank-label LABEL`, LABEL its relevant label)") if task == RERANK else ""
    return (f"no served model does {task} ({path}); served models: "
            f"{ {n: list(s.pipelines) for n, s in models.services.items()} }{how}")


def tei_endpoint(models: ModelSet, path: str, route: str, prefixed: bool) -> Callable[..., Any]:
    async def run(request: Request, name: str | None) -> JSONResponse:
        return await answer(request, lambda: tei_work(models, path, request, name))

    if prefixed:
        async def endpoint(request: Request, model: str) -> JSONResponse:
            return await run(request, model)
    else:
        async def endpoint(request: Request) -> JSONResponse:
            return await run(request, None)
    endpoint.__name__ = "tei_" + path.strip("/") + ("_of_model" if prefixed else "")
    return endpoint


# --- the model's own route: POST / and /invocations (TEI's, and SageMaker's name for it) ----------------------

ROOT_PATHS = ("/", "/invocations")


def is_sparse(service: InferenceService) -> bool:
    """Whether a model is a SPLADE model (TEI: an embedding model pooled by "splade"): it gives sparse vectors
    and is no plain masked LM (which gives them too, besides fill-mask, and stays an embedder for TEI)."""
    return EMBED_SPARSE in service.pipelines and FILL_MASK not in service.pipelines


def root_path_of(service: InferenceService) -> str:
    """The TEI route a model answers at `POST /`, as TEI picks it from the model's kind: a reranker reranks, a
    classifier predicts, a sparse (SPLADE) model gives sparse vectors (TEI: an embedding model pooled by
    "splade" answers as /embed_sparse, though its encoder could also give dense vectors), any other embeds."""
    pipelines = service.pipelines
    return "/rerank" if RERANK in pipelines else "/predict" if CLASSIFY in pipelines else \
        "/embed_sparse" if is_sparse(service) else "/embed"


def root_request(service: InferenceService) -> str:
    """The name of the request model a model's own route takes (that of the TEI route it answers as)."""
    path = root_path_of(service)
    return (ModelPredictRequest if path == "/predict" else TEI_ROUTES[path][1]).__name__


def root_endpoint(models: ModelSet, route: str, prefixed: bool) -> Callable[..., Any]:
    async def run(request: Request, name: str | None) -> JSONResponse:
        async def work() -> Any:
            if name is None and len(models.services) > 1:
                routes = ", ".join(f"POST /models/{n}{root_path_of(s)}" for n, s in models.services.items())
                raise RequestError(400, f"POST {route} answers the model's task when one model is served; this "
                                        f"server serves {len(models.services)} ({', '.join(models.names)}): "
                                        f"name one with POST /models/<name> (a client's base URL), or use {routes}",
                                   param="path")
            path = root_path_of(models.named(name))
            return await tei_work(models, "/" + CLASSIFY if path == "/predict" else path, request, name)
        return await answer(request, work)

    if prefixed:
        async def endpoint(request: Request, model: str) -> JSONResponse:
            return await run(request, model)
    else:
        async def endpoint(request: Request) -> JSONResponse:
            return await run(request, None)
    endpoint.__name__ = "tei_root" + route.replace("/", "_").replace("{", "").replace("}", "")
    return endpoint


def add_root_routes(app: FastAPI, models: ModelSet) -> list[str]:
    """`POST /` and `POST /invocations` (each also as `/models/<name>` and `/models/<name>/invocations`): the
    served model's own route, so a client given only the server's address (huggingface_hub's
    `InferenceClient(base_url)`) reaches it."""
    kinds = sorted({root_path_of(service) for service in models.services.values()})
    # One body per kind; the document gives each model's path its own (`wire_schemas.own_routes`).
    components = sorted({root_request(service) for service in models.services.values()})
    body = {"oneOf": [{"$ref": "#/components/schemas/" + name} for name in components]}
    added = []
    for path, prefixed in (("/", False), ("/invocations", False), (MODEL_PREFIX, True),
                           (MODEL_PREFIX + "/invocations", True)):
        summary = ("TEI: the model's own route (" + ", ".join(f"{n}: {root_path_of(s)}" for n, s in
                                                               models.services.items()) + ")")
        app.add_api_route(path, root_endpoint(models, path, prefixed), methods=["POST"], summary=summary,
                          responses=TEI_ERRORS, description="Answers as " + " or ".join(kinds) + " does.",
                          openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                              "schema": body}}}, SERVES: ROOT, "x-request-model": components})
        added.append(f"POST {path}")
    return added


def add_tei_routes(app: FastAPI, models: ModelSet) -> list[str]:
    """TEI's routes (and their `/models/{model}` forms), and `/v1/rerank` where a model reranks."""
    added = []
    for path, (task, model_class, _, summary) in TEI_ROUTES.items():
        bodies = (model_class, OTHER_BODIES[path][1]) if path in OTHER_BODIES else model_class
        for prefixed in (False, True):
            route = (MODEL_PREFIX if prefixed else "") + path
            app.add_api_route(route, tei_endpoint(models, path, route, prefixed), methods=["POST"], summary=summary,
                              response_model=RESPONSES[path], responses=TEI_ERRORS,
                              openapi_extra=request_body(bodies, serves=task or ANY_MODEL))
            added.append(f"POST {route}")

    async def info_of(request: Request, name: str | None) -> JSONResponse:
        try:
            answer = info(models, name)
        except RequestError as error:
            return refusal(request, error.status, error.message)
        note_model(request.scope, answer["model_id"])
        return JSONResponse(answer)

    @app.get("/info", response_model=Info, responses=TEI_ERRORS, openapi_extra={SERVES: ANY_MODEL},
             summary="TEI: the first served model, its limits, and every served model (`models`)")
    async def tei_info(request: Request) -> JSONResponse:
        return await info_of(request, None)

    @app.get(MODEL_PREFIX + "/info", response_model=Info, summary="TEI: a served model, its limits",
             responses=TEI_ERRORS, openapi_extra={SERVES: ANY_MODEL})
    async def tei_info_of_model(request: Request, model: str) -> JSONResponse:
        return await info_of(request, model)

    added += ["GET /info", f"GET {MODEL_PREFIX}/info"]
    added += add_root_routes(app, models)
    if models.serving(RERANK):
        added += add_dual_rerank(app, models)
    return added


def add_dual_rerank(app: FastAPI, models: ModelSet) -> list[str]:
    """`/v1/rerank`: bertforge's body (``inputs``) or Cohere's (``query`` + ``documents``), one path."""
    options = task_route_options(models, RERANK)
    schema = {"oneOf": [options["openapi_extra"]["requestBody"]["content"]["application/json"]["schema"],
                        {"$ref": "#/components/schemas/CohereRerankRequest"}]}
    options["openapi_extra"] = {"requestBody": {"required": True, "content": {"application/json": {
        "schema": schema, "example": options["openapi_extra"]["requestBody"]["content"]["application/json"][
            "example"]}}}, "x-request-model": [options["openapi_extra"].get("x-request-model"), "CohereRerankRequest"],
        SERVES: RERANK}
    ours = options["responses"][200]
    options["responses"] = {**options["responses"], 200: {**ours, "model": ours["model"] | CohereRerankResponse,
                                                           "description": "ours: outputs; Cohere's: results"}}
    options["description"] += ("\n\nAlso takes the Cohere/Infinity body {query, documents, top_n, return_documents,"
                               " model} and then answers {id, model, results: [{index, relevance_score, document}]}.")

    async def rerank_either(request: Request, name: str | None) -> JSONResponse:
        try:
            body = await read_body(request, models.first.settings)
            if isinstance(body, dict) and "inputs" in body:
                service = models.pick(name, RERANK, field="path")
                note_model(request.scope, service.model_name)
                status, payload = await service.handle(RERANK, request, body)
                return JSONResponse(payload, status_code=status)
            call = check_body(CohereRerankRequest, body)
            if name is not None:
                call = call.model_copy(update={"model": name})
            return JSONResponse(await cohere_v1_rerank(models, call, request))
        except RequestError as error:
            return refusal(request, error.status, error.message, param=error.param, headers=error.headers)

    async def v1_rerank(request: Request) -> JSONResponse:
        return await rerank_either(request, None)

    async def v1_rerank_of_model(request: Request, model: str) -> JSONResponse:
        return await rerank_either(request, model)

    app.add_api_route("/v1/rerank", v1_rerank, methods=["POST"], **options)
    app.add_api_route(MODEL_PREFIX + "/v1/rerank", v1_rerank_of_model, methods=["POST"], **options)
    return ["POST /v1/rerank", f"POST {MODEL_PREFIX}/v1/rerank"]
