"""HTTP serving of one or several model directories: the assembly of the FastAPI app and `serve`.

Which module holds what (see also docs/serving.md):

- `model_service`: `ServerSettings`, one served model (`InferenceService`: read, validate, schedule, map
  failures to statuses), the set of served models and which one answers (`ModelSet.pick`), loading them;
- `task_routes`: our own `POST /v1/<task>` routes (`fill-mask`, `classify`, `tag`, `answer`, `choose`,
  `embed`), each also under `/models/<name>/...`;
- `openai_routes`: OpenAI's `POST /v1/embeddings` and `GET /v1/models`;
- `tei_routes`: text-embeddings-inference's `/embed`, `/rerank`, `/predict`, `/tokenize`, `/decode`,
  `/info`, and `/v1/rerank` (ours and the Cohere shape on one path);
- `cohere_routes`: Cohere v2's `/v2/rerank`, and the Cohere v1 and Infinity rerank answers;
- `wire_schemas`: the strict pydantic models' helpers (a body checked against one, its place in
  `/openapi.json`); `embed_inputs`: the wire routes' embedding inputs (token ids, TEI's truncation rule);
- `page`: the browser page at `GET /` (files in `static/`) and the `/v1/attention` route it draws;
- `envelopes`: the error body of each API style, by path; `http_guards`: keys, Host, Content-Type, CORS,
  request ids and timing headers, around every route;
- here: the app (lifespan starting every model's scheduler, the 404/405/422 handlers in the route's
  envelope, `/health`, `/metrics`, the offline `/docs` and `/redoc`), `create_app` and `serve`.

The server listens on loopback unless told otherwise.

Needs the `serve` extra: fastapi, uvicorn, fastapi-offline (the documentation assets), prometheus_client;
httpx for the tests and the load benchmark.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from bertforge.engine.build import DEFAULT_KIND
from bertforge.errors import ConfigError
from bertforge.families.embedding import vector_width
from bertforge.inference.pipelines import Pipeline
from bertforge.runtime import DEFAULT_PRECISION
from bertforge.serving.envelopes import serve_extra_missing

try:
    import fastapi_offline
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
    from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
    from fastapi.staticfiles import StaticFiles
    from prometheus_client.exposition import generate_latest
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector
    from starlette.exceptions import HTTPException

    from bertforge.serving.metrics import CONTENT_TYPE, RequestMetrics
except ImportError as missing:  # the serve extra is optional; say how to get it when it is needed
    raise serve_extra_missing(missing) from None

from bertforge.serving.cohere_routes import add_cohere_routes  # noqa: E402
from bertforge.serving.guards import LOOPBACK_HOSTS, OPEN_PATHS, Scope, install_guards, key_held, model_of  # noqa: E402
from bertforge.serving.model_service import (  # noqa: E402 (after the check of the serve extra)
    FAILURE_STATUS,
    InferenceService,
    ModelSet,
    RequestError,
    ServerSettings,
    check_sizes,
    client_gone,
    load_model_set,
    model_name_of,
    refusal,
)
from bertforge.serving.openai_routes import add_openai_routes  # noqa: E402
from bertforge.serving.page import add_page  # noqa: E402
from bertforge.serving.search_routes import (  # noqa: E402
    ServedIndex,
    add_search_routes,
    bind_indexes,
    load_index_models,
    open_indexes,
)
from bertforge.serving.task_routes import add_task_routes  # noqa: E402
from bertforge.serving.tei_routes import DUAL_ROUTES, EMBED, add_tei_routes, root_request  # noqa: E402
from bertforge.serving.wire_schemas import (  # noqa: E402
    ANY_MODEL,
    ServedFacts,
    validation_message,
    with_wire_schemas,
)

log = logging.getLogger(__name__)

# Swagger UI and ReDoc scripts, styles and icon, from the fastapi-offline wheel: /docs needs no CDN.
DOCS_ASSETS = Path(fastapi_offline.__file__).parent / "static"
DOCS_ASSETS_URL = "/docs-assets"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def build_app(models: ModelSet | Mapping[str, Pipeline], settings: ServerSettings | None = None,
              model_name: str = "model", indexes: Mapping[str, ServedIndex] | None = None) -> FastAPI:
    """A FastAPI app serving already-loaded models (see `create_app`) and the indexes bound to them
    (`search_routes.bind_indexes`); a plain mapping task -> pipeline is one model called `model_name`."""
    indexes = dict(indexes or {})
    settings = settings or ServerSettings()
    if not isinstance(models, ModelSet):
        models = ModelSet({model_name: InferenceService(dict(models), settings, model_name)})

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await models.start()
        try:
            yield
        finally:
            await models.stop()

    # FastAPI's own /docs and /redoc load their scripts from a CDN (blank offline): ours serve them from the
    # package (`add_docs`).
    described = "; ".join(f"{name}: {', '.join(s.pipelines)}" for name, s in models.services.items())
    app = FastAPI(title="bertforge", description=f"BERT inference ({described})", lifespan=lifespan,
                  docs_url=None, redoc_url=None)
    app.state.models = models
    app.state.service = models.first  # the first model (the only one, usually)
    add_docs(app)

    # The routes, in the order a reader looks for them: ours, then the compatible ones.
    served = (add_task_routes(app, models, elsewhere=DUAL_ROUTES) + add_tei_routes(app, models)
              + add_cohere_routes(app, models) + add_openai_routes(app, models) + add_search_routes(app, models, indexes)
              + add_page(app, models))
    served += ["GET /health", "GET /ready", "GET /metrics", "GET /docs", "GET /redoc", "GET /openapi.json"]
    app.state.served = served
    with_wire_schemas(app, served_facts(models, settings))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        # FastAPI's own 404/405 say only "Not Found": say what this server serves instead.
        path = request.url.path
        if error.status_code == 404:
            message = f"no route {request.method} {path}; this server serves: {', '.join(served)}"
        elif error.status_code == 405:
            allowed = [route for route in served if route.split(" ", 1)[1] == path]
            message = f"{request.method} is not allowed on {path}; use {' or '.join(allowed) or 'another route'}"
        else:
            message = str(error.detail)
        return refusal(request, error.status_code, message, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        # Raised for a route that declares its body as a pydantic model; our wire routes validate the body
        # they read themselves (`wire_schemas.check_body`), with the same message.
        message, param = validation_message(error.errors())
        return refusal(request, 422, message, param=param)

    # Requests no model is named by (several served: a 401, an unknown path) are counted apart.
    unattributed = RequestMetrics()
    add_probes(app, models, settings, unattributed, indexes)

    def record(scope: Scope, route: str, status: int, seconds: float) -> None:
        counted_by(models, scope, unattributed).record_request(route, status, seconds)

    # Guards (`http_guards`: keys, Host, Content-Type, body size, CORS, request ids, timing headers) are
    # installed here, around every route above: they refuse through `envelopes.error_payload` like the routes,
    # and count every request once answered (`record`).
    install_guards(app, settings, record=record)
    return app


def counted_by(models: ModelSet, scope: Scope, unattributed: RequestMetrics) -> RequestMetrics:
    """Whose metrics count a request: the model that answered it, else the one its path names, else the only
    one served; with several and none of them named, `unattributed`."""
    name = model_of(scope) or scope.get("path_params", {}).get("model")
    if name in models.services:
        return models.services[name].metrics
    return models.first.metrics if len(models.services) == 1 else unattributed


def served_facts(models: ModelSet, settings: ServerSettings) -> ServedFacts:
    """What these models take (which models answer each task, with or without a name in the path; vocabulary,
    vector widths, prompts, layers; keys), for the OpenAPI document (`wire_schemas.fit_to_models`)."""
    serving = {task: tuple(models.serving(task)) for task in models.tasks()}
    serving[ANY_MODEL] = tuple(models.names)
    unnamed = {ANY_MODEL} if len(models.names) == 1 else set()
    for task in models.tasks():
        try:
            models.pick(None, task, field="path")
            unnamed.add(task)
        except RequestError:  # several models serve it and none is named: the path alone is refused
            pass
    services = list(models.services.values())
    embedders = [service.pipelines[EMBED] for service in services if EMBED in service.pipelines]
    return ServedFacts(
        models=serving, unnamed=frozenset(unnamed),
        vocab_size=min(next(iter(s.pipelines.values())).tokenizer.vocab_size for s in services),
        dimensions=tuple(sorted({width for p in embedders for width in (
            vector_width(p.config.hidden_size, p.defaults["pooling"]), *p.matryoshka_dims)})),
        prompt_names=tuple(sorted({name for p in embedders for name in (p.sentence.prompts if p.sentence else ())})),
        layers=min((p.config.num_hidden_layers for p in embedders), default=0), max_items=settings.max_items,
        roots={name: root_request(service) for name, service in models.services.items()},
        keys=bool(settings.api_keys), open_paths=OPEN_PATHS, max_sparse_terms=settings.max_sparse_terms)


def add_probes(app: FastAPI, models: ModelSet, settings: ServerSettings, unattributed: RequestMetrics,
               indexes: Mapping[str, ServedIndex] | None = None) -> None:
    """`/health` (liveness, what is served), `/ready` (readiness) and `/metrics` (Prometheus)."""
    @app.get("/health", summary="each served model: name, tasks, device, precision, queue depth, settings (how "
                                "many keys, never the keys); with a key, its directory")
    async def health(request: Request) -> dict[str, Any]:
        # Open without a key (probes, the page): where a model lies on disk is told only to a key holder.
        held = key_held(request.scope)
        reports = {name: service.health(directory=held) for name, service in models.services.items()}
        # One model: its report at the top level as before, and under `models` like several.
        top = dict(reports[models.names[0]]) if len(reports) == 1 else {"status": "ok"}
        served = {"indexes": {name: index.describe(directory=held) for name, index in indexes.items()}} \
            if indexes else {}
        return {**top, "models": reports, **served}

    @app.get("/ready", summary="readiness: every model loaded, warmed up and giving finite outputs (else 503)",
             responses={503: {"description": "not ready: warming up, unhealthy (non-finite outputs) or draining"}})
    async def ready() -> JSONResponse:
        readiness = models.readiness()
        if all(state["ready"] for state in readiness.values()):
            return JSONResponse({"status": "ready", "models": readiness})
        waiting = [f"{name}: {state['unhealthy'] or ('shutting down' if state['draining'] else 'warming up')}"
                   for name, state in readiness.items() if not state["ready"]]
        return JSONResponse({"error": "not ready (" + "; ".join(waiting) + ")", "models": readiness},
                            status_code=503)

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(render_metrics(models, unattributed), media_type=CONTENT_TYPE)


def render_metrics(models: ModelSet, unattributed: RequestMetrics | None = None) -> bytes:
    """The Prometheus text of every model: one model's metrics as they are; several models' each with a
    `model` label (one family per metric name, as scrapers require), and the requests no model was named by
    (`unattributed`) with `model=""`."""
    if len(models.services) == 1:
        return models.first.metrics.render()
    labelled: dict[str, RequestMetrics] = {name: s.metrics for name, s in models.services.items()}
    if unattributed is not None:
        labelled[""] = unattributed
    return generate_latest(ModelLabelled(labelled))


class ModelLabelled(Collector):
    """Several models' metrics as one set: each sample gains a `model` label, families of one name merged."""

    def __init__(self, metrics: Mapping[str, RequestMetrics]):
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for name, metrics in self.metrics.items():
            for family in metrics.exposed.collect():
                into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type,
                                                             family.unit))
                into.samples += [sample._replace(labels={"model": name, **sample.labels}) for sample in family.samples]
        yield from merged.values()


def add_docs(app: FastAPI) -> None:
    """/docs (Swagger UI) and /redoc over /openapi.json, with every script, style and icon served by this app."""
    app.mount(DOCS_ASSETS_URL, StaticFiles(directory=DOCS_ASSETS), name="docs-assets")
    redirect = app.swagger_ui_oauth2_redirect_url

    @app.get("/docs", include_in_schema=False)
    async def swagger(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=f"{root}{redirect}", swagger_js_url=f"{root}{DOCS_ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS_URL}/favicon.png",
            # The online spec validator would be a request to another host.
            swagger_ui_parameters={"validatorUrl": None})

    @app.get(redirect, include_in_schema=False)
    async def swagger_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{root}{DOCS_ASSETS_URL}/redoc.standalone.js",
                              redoc_favicon_url=f"{root}{DOCS_ASSETS_URL}/favicon.png", with_google_fonts=False)


def model_directories(model: str | Path | Mapping[str, str | Path]) -> dict[str, str | Path]:
    """name -> directory from one directory (named after its folder) or a mapping."""
    if isinstance(model, Mapping):
        return dict(model)
    return {model_name_of(model): model}


def create_app(model: str | Path | Mapping[str, str | Path], *, tasks: list[str] | None = None,
               device: str = "auto", precision: str = DEFAULT_PRECISION, engine: str = DEFAULT_KIND,
               threads: int | None = None, batch_size: int = 32, max_length: int | None = None,
               indexes: Mapping[str, Sequence[str | Path]] | None = None,
               rerank_labels: str | Mapping[str, str] | None = None, **settings: Any) -> FastAPI:
    """Load the model directories once and build the app serving every task each supports (or `tasks`).

    Args:
        model: a saved model directory, or a mapping name -> directory to serve several (each with its own
            scheduler and token budget; requests pick one by name, see `ModelSet.pick`).
        tasks: restrict the routes to these tasks (every model must serve them).
        indexes: name -> vector folders to serve at `POST /search` (one folder, or a dense and a sparse one of
            the same input); each is opened once, and the model that made its vectors is served beside it
            (loaded from the directory its manifest names when no `model` is that model).
        device, precision, engine, threads, batch_size, max_length: pipeline options (see `Pipeline`; precision
            fp32 unless asked, as `bertforge evaluate`; engine "torch" or "onnxruntime"; the CPU's threads).
        rerank_labels: two-label pair classifiers to serve as rerankers too (relevance = the probability of the
            label named; `serve --rerank-label`): model name -> label, or the label alone for one model.
        **settings: `ServerSettings` fields (max_batch_size, max_wait_ms, max_queue, ...).

    Raises:
        ConfigError / CheckpointError: a setting is unknown, or a model directory cannot be served (one line
            naming the model and its directory).
    """
    try:
        server_settings = ServerSettings(**settings)
    except TypeError as error:
        raise ConfigError(f"unknown server setting: {error}") from None
    searchers = open_indexes(indexes or {})  # before any model loads: a bad folder fails fast
    directories = model_directories(model)
    if isinstance(rerank_labels, str):
        rerank_labels = dict.fromkeys(directories, rerank_labels)
    if searchers:
        directories = load_index_models(searchers, directories)
    models = load_model_set(directories, server_settings, tasks=tasks, device=device,
                            precision=precision, engine=engine, threads=threads, batch_size=batch_size,
                            max_length=max_length, rerank_labels=rerank_labels)
    return build_app(models, server_settings, indexes=bind_indexes(searchers, models))


def serve(model: str | Path | Mapping[str, str | Path], *, host: str = "127.0.0.1", port: int = 8000,
          log_level: str = "info", **options: Any) -> None:
    """Run the server until interrupted (`bertforge serve --model [NAME=]DIR ...`). Loopback only unless `host`
    says otherwise; on loopback, only loopback host names are answered unless `allowed_hosts` says otherwise
    (a web page on a rebound DNS name cannot reach it). SIGTERM (or Ctrl-C) stops taking connections, lets
    the requests in progress finish (at most `drain_timeout_s`), then exits."""
    if host in LOOPBACK and not options.get("allowed_hosts"):
        options["allowed_hosts"] = LOOPBACK_HOSTS
    app = create_app(model, **options)
    if host not in LOOPBACK:
        log.warning("listening on %s: the server is reachable from other machines%s", host,
                    "" if options.get("api_keys") else " and needs no key (--api-key)")
    settings = app.state.service.settings
    uvicorn.run(app, host=host, port=port, log_level=log_level,
                timeout_graceful_shutdown=int(settings.drain_timeout_s) or None)


__all__ = ["FAILURE_STATUS", "InferenceService", "ModelSet", "RequestError", "ServerSettings", "build_app",
           "check_sizes", "client_gone", "create_app", "serve"]
