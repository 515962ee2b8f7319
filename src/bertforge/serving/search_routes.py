"""`POST /search`: top-k search of query texts over the vector folders served beside the models
(`bertforge serve --index NAME=DIR`), answered as `bertforge search` answers: the same ids, scores, spans and
texts, by the same code (`retrieval.searcher.Searcher`); a "filter" on the index's metadata fields is `bertforge
search --filter`'s JSON form, checked before any query is embedded.

An index is one folder (dense, sparse or multi-vector: exact MaxSim), two or three folders of different kinds and
the same input (hybrid: reciprocal rank fusion, `--index docs=DENSE,SPARSE,MULTI_VECTOR`), either with a
multi-vector folder of that input reranking its hits (`--index docs=DENSE,rerank=MULTI_VECTOR`), or a Qdrant
collection (`retrieval.index_locations.open_index`: the same
interface), opened once when the server starts: manifests read, the approximate index and the inverted index
loaded. Its queries are embedded by the served model that made its vectors (the model the manifest names, found
among the served models by its files' fingerprint; `load_index_models` adds it when it is not among them),
through that model's scheduler like every other request: the same admission, keys, limits and metrics, with the
options the corpus was embedded with (pooling, normalization, layer; the window and precision are the served
model's, and a start that differs from the corpus's in them is logged). The search itself (numpy, faiss) runs off the event loop, one at a time
per index.

Owns: `--index` (`parse_index_option`), opening the indexes and binding each to its models (`open_indexes`,
`load_index_models`, `bind_indexes`), the request (`SearchRequest`, its filter's schema `FieldConditions`) and
the route.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from bertforge.serving.model_service import (  # isort: skip (the serve extra is checked there first)
    MODEL_NAME,
    InferenceService,
    ModelSet,
    RequestError,
    model_name_of,
    read_body,
    refusal,
)

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from bertforge.checkpoint_format import model_fingerprint
from bertforge.errors import BertforgeError, ConfigError, DataError, InputError
from bertforge.metrics.sparse import SparseRows
from bertforge.retrieval.index_locations import QdrantUnavailable, open_index
from bertforge.retrieval.searcher import DEFAULT_FUSION_DEPTH, DEFAULT_RRF_K, QueryModel, Searcher
from bertforge.serving.guards import note_model
from bertforge.serving.openai_routes import check_length
from bertforge.serving.task_routes import TaskError
from bertforge.serving.wire_schemas import INPUTS, Text, WireModel, check_body, register, request_body

log = logging.getLogger(__name__)

PATH = "/search"
# What the route answers besides its hits (the guards add 408, 413, 415, 429, 503 and, with keys, 401).
RESPONSES: dict[int | str, dict[str, Any]] = {status: {"model": TaskError, "description": text} for status, text in (
    (400, "malformed JSON"), (404, "no index of that name is served"),
    (409, "the input behind show_text or field changed since it was embedded"),
    (422, "invalid request: a bad field, a filter on a field the index does not store, a setting that does not "
          "apply to the index"))}


def parse_index_option(value: str) -> tuple[str, list[str]]:
    """`--index NAME=DIR[,DIR...]` as (name, folders): one folder (dense, sparse or multi-vector), or folders of
    different kinds and the same input for hybrid search (also given as several `--index` of the same name), with
    `rerank=DIR` a multi-vector folder reranking their hits, or a Qdrant collection
    (`NAME=qdrant://HOST:PORT/COLLECTION`, `retrieval.index_locations`)."""
    name, sep, folders = value.partition("=")
    if not sep or not MODEL_NAME.fullmatch(name):
        raise ConfigError(f"--index {value}: give a name and the folder, e.g. --index docs=vectors/ (the name: "
                          "letters, digits, '.', '_' or '-'; folders fused: --index docs=DENSE,SPARSE; reranked: "
                          "--index docs=DENSE,rerank=MULTI_VECTOR)")
    directories = [part for part in folders.split(",") if part]
    if not directories:
        raise ConfigError(f"--index {value}: no folder after '='; use --index NAME=DIR")
    return name, directories


def open_indexes(indexes: Mapping[str, Sequence[str | Path]]) -> dict[str, Searcher]:
    """name -> its `Searcher`, each folder's kind read from its manifest (several kinds: hybrid; `rerank=DIR`:
    reranking), or the `QdrantSearcher` of a collection.

    Raises:
        ConfigError: not a vector folder, more than one folder of a kind, folders of different input, a stale
            approximate index (each message names the index).
    """
    searchers = {}
    for name, directories in indexes.items():
        if not MODEL_NAME.fullmatch(name):
            raise ConfigError(f"index name {name!r} must be letters, digits, '.', '_' or '-' (at most 64)")
        try:
            searchers[name] = open_index(directories)
        except ConfigError as error:
            raise ConfigError(f"index {name}: {error}") from None
    return searchers


def load_index_models(searchers: Mapping[str, Searcher], directories: Mapping[str, str | Path]) -> dict[str, str]:
    """The served model directories (name -> directory) with every model an index needs that is not among them
    (the directory its manifest names, served under its folder's name)."""
    found = {model_fingerprint(directory): name for name, directory in directories.items()}
    served = dict(directories)
    for searcher in searchers.values():
        for wanted in searcher.query_models().values():
            if wanted.fingerprint in found:
                continue
            if not wanted.directory.is_dir():
                raise ConfigError(f"{wanted.directory}: the model that embedded an index is not there and no --model "
                                  "is the same model; serve a copy of it with --model DIR")
            name = model_name_of(wanted.directory)
            while name in served:
                name = f"{name}-index"
            served[name] = str(wanted.directory)
            found[wanted.fingerprint] = name
    return served


@dataclass
class ServedIndex:
    """An index and, per kind of its folders, the served model that embeds its queries and how."""

    name: str
    searcher: Searcher
    services: dict[str, InferenceService]
    queries: dict[str, QueryModel]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def describe(self, directory: bool = False) -> dict[str, Any]:
        """What `/health` says of the index: its kinds, rows and models (with a key, its folders too)."""
        kinds = self.searcher.kinds
        report = {"kinds": list(kinds), "count": self.searcher.count,
                  "models": {kind: service.model_name for kind, service in self.services.items()}}
        if directory:
            report["folders"] = {kind: self.searcher.where(kind) for kind in kinds}
        return report


def bind_indexes(searchers: Mapping[str, Searcher], models: ModelSet) -> dict[str, ServedIndex]:
    """Each index with the served models that made its vectors (found by fingerprint).

    Raises:
        ConfigError: no served model is the one an index needs, or it does not serve the task that embeds
            its queries (the app was built with `tasks` that leave it out).
    """
    fingerprints = {model_fingerprint(service.directory): service for service in models.services.values()}
    bound = {}
    for name, searcher in searchers.items():
        services = {}
        for kind, wanted in searcher.query_models().items():
            service = fingerprints.get(wanted.fingerprint)
            if service is None:
                raise ConfigError(f"index {name}: its {kind} vectors were made by {wanted.directory}, which is not "
                                  "served; add --model DIR with that model")
            if wanted.task not in service.pipelines:
                raise ConfigError(f"index {name}: model {service.model_name} does not serve {wanted.task}, which "
                                  "embeds its queries; serve that task too")
            pipeline = service.pipelines[wanted.task]
            if (pipeline.max_length, pipeline.precision) != (wanted.max_length, wanted.precision):
                # Allowed (as `search --precision`), but the scores then differ from the command's by more
                # than float rounding: say so once, at the start.
                log.warning("index %s: model %s embeds its queries with a window of %d tokens at %s; the corpus was "
                            "embedded with %d at %s (serve --precision, or embed with the model's window, to match)", name,
                            service.model_name, pipeline.max_length, pipeline.precision, wanted.max_length,
                            wanted.precision)
            services[kind] = service
        bound[name] = ServedIndex(name, searcher, services, searcher.query_models())
    return bound


FilterValue = str | int | float | bool  # a date or date-time field's value: ISO 8601 text
FilterValues = Annotated[list[FilterValue], Field(min_length=1)]


class FieldConditions(WireModel):
    """Conditions on one metadata field, all of which must hold (a value is read by the field's type)."""

    eq: FilterValue | None = Field(None, description="equal to")
    ne: FilterValue | None = Field(None, description="not equal to (a record without the field matches)")
    in_: FilterValues | None = Field(None, alias="in", description="one of these")
    not_in: FilterValues | None = Field(None, description="none of these (a record without the field matches)")
    gt: FilterValue | None = Field(None, description="greater than (int, float, date and datetime fields)")
    gte: FilterValue | None = Field(None, description="greater than or equal to")
    lt: FilterValue | None = Field(None, description="less than")
    lte: FilterValue | None = Field(None, description="less than or equal to")


@register
class SearchRequest(WireModel):
    """Our search request: query texts against a served index."""

    index: str | None = Field(None, description="a served index's name (GET /health lists them); optional when "
                                                "one is served")
    query: Text | None = Field(None, description="one query text (or `queries`)")
    queries: Annotated[list[Text], INPUTS] | None = Field(None, description="query texts (or `query`)")
    top_k: int = Field(10, ge=1, description="hits per query")
    prompt_name: str | None = Field(None, description="the queries' prompt by name (default: the model's default "
                                                      "prompt); hybrid: the first kind's queries' (dense, else "
                                                      "sparse)")
    prompt: str | None = Field(None, description="the queries' prompt text (or prompt_name)")
    show_text: bool = Field(False, description="each hit's text (a chunk's own text), read back from the input")
    field: str | None = Field(None, description="each hit's record field of that name, read back from the input")
    exact: bool = Field(False, description="score every vector even where the index has an approximate index")
    ef_search: int | None = Field(None, ge=1, description="candidates kept while walking the approximate index")
    rescore_multiplier: int | None = Field(None, ge=1, description="binary folders: candidates rescored per hit")
    rrf_k: float = Field(DEFAULT_RRF_K, ge=0, description="hybrid: the reciprocal rank fusion constant")
    depth: int = Field(DEFAULT_FUSION_DEPTH, ge=1, description="hybrid: rows each folder ranks per query; "
                                                                    "reranked: rows the multi-vector folder rescores")
    filter: dict[str, FilterValue | FieldConditions] | None = Field(
        None, description="search only the records whose metadata fields (`bertforge embed --field`) meet every "
        "condition: field -> a value (equal to it) or an object of operators, e.g. {\"source\": \"wiki\", "
        "\"year\": {\"gte\": 2020}, \"lang\": {\"in\": [\"en\", \"fr\"]}}; dates as ISO 8601 text; the hits are "
        "the top-k of the matching records")

    def filter_form(self) -> dict[str, Any] | None:
        """The filter in `retrieval.filters`' JSON form (operators as the client wrote them)."""
        if self.filter is None:
            return None
        return {name: value.model_dump(by_alias=True, exclude_unset=True) if isinstance(value, FieldConditions)
                else value for name, value in self.filter.items()}


def pick_index(indexes: Mapping[str, ServedIndex], name: str | None) -> ServedIndex:
    if name is None:
        if len(indexes) == 1:
            return next(iter(indexes.values()))
        raise RequestError(422, f"several indexes are served ({', '.join(indexes)}); name one in 'index'",
                           param="index")
    if name not in indexes:
        raise RequestError(404, f"index {name!r} is not served here; served indexes: {', '.join(indexes)}",
                           param="index")
    return indexes[name]


async def embed_side(served: ServedIndex, kind: str, queries: list[str], call: SearchRequest,
                     request: Request) -> np.ndarray | SparseRows | list[np.ndarray]:
    """One kind of query vectors, embedded by its model's scheduler as the corpus was (`QueryModel`; multi-vector:
    with the query role); the prompt is the first kind's (dense, else sparse), the others get their model's
    default."""
    service, wanted = served.services[kind], served.queries[kind]
    pipeline = service.pipelines[wanted.task]
    own_prompt = kind == served.searcher.kinds[0]
    try:
        prefix = pipeline.prompt_text(call.prompt_name, call.prompt) if own_prompt else pipeline.prompt_text()
    except InputError as error:
        raise RequestError(422, str(error), param="prompt" if call.prompt is not None else "prompt_name") from None
    parsed = [prefix + service.parse(wanted.task, text, f"queries[{i}]") for i, text in enumerate(queries)]
    options = service.check_options(wanted.task, {**wanted.options, **({"role": "query"} if kind == "multi-vector"
                                                                         else {})})
    with service.scheduler.incoming():
        results = await service.run(wanted.task, parsed, options, request, answered=False)
    if kind == "multi-vector":
        return [np.asarray(r["embeddings"], dtype=np.float32) for r in results]  # [q, D] each
    if kind == "sparse":
        return SparseRows.from_vectors([(r["indices"], r["values"]) for r in results], pipeline.config.vocab_size)
    return np.asarray([r["embedding"] for r in results], dtype=np.float32)  # [Q, D]


def run_search(served: ServedIndex, vectors: dict[str, Any], call: SearchRequest,
               checked: Any = None) -> list[list[dict[str, Any]]]:
    """The hits (off the event loop, one search of an index at a time: the approximate index's settings are
    the graph's own); a setting that does not apply, or an input changed since it was embedded, is the client's
    to hear (RequestError)."""
    try:
        with served.lock:
            return served.searcher.search(vectors, call.top_k, show_text=call.show_text, field=call.field,
                                          rescore_multiplier=call.rescore_multiplier, ef_search=call.ef_search,
                                          exact=call.exact, rrf_k=call.rrf_k, depth=call.depth, filter=checked)
    except InputError as error:
        raise RequestError(422, str(error)) from None
    except DataError as error:  # a record without the asked field
        raise RequestError(422, str(error), param="field") from None
    except QdrantUnavailable as error:  # the collection's server did not answer: it may later
        raise RequestError(503, str(error)) from None
    except BertforgeError as error:  # the input behind show_text is gone or changed
        raise RequestError(409, str(error)) from None


async def search(indexes: Mapping[str, ServedIndex], models: ModelSet, request: Request) -> JSONResponse:
    try:
        body = await read_body(request, models.first.settings)
        call = check_body(SearchRequest, body)
        served = pick_index(indexes, call.index)
        service = served.services[served.searcher.kinds[0]]
        note_model(request.scope, service.model_name)  # the guards count the request as this model's
        if (call.query is None) == (call.queries is None):
            raise RequestError(422, "give 'query' (one text) or 'queries' (a list of texts), not both",
                               param="query")
        queries = [call.query] if call.query is not None else list(call.queries)
        try:  # before any query is embedded
            checked = served.searcher.check_filter(call.filter_form())
        except InputError as error:
            raise RequestError(422, str(error), param="filter") from None
        service.check_count(len(queries), "queries")
        for index, text in enumerate(queries):
            check_length(text, service.settings.max_chars, f"queries[{index}]")
        vectors = {kind: await embed_side(served, kind, queries, call, request) for kind in served.searcher.kinds}
        hits = await asyncio.to_thread(run_search, served, vectors, call, checked)
        response = JSONResponse({"index": served.name, "results": hits})
    except RequestError as error:
        response = refusal(request, error.status, error.message, param=error.param, code=error.code,
                           headers=error.headers)
    return response


def add_search_routes(app: FastAPI, models: ModelSet, indexes: Mapping[str, ServedIndex]) -> list[str]:
    """`POST /search` where indexes are served; the routes added."""
    if not indexes:
        return []

    async def search_route(request: Request) -> JSONResponse:
        return await search(indexes, models, request)

    example = {"index": next(iter(indexes)), "query": "how do I reset my password?", "top_k": 5, "show_text": True}
    fields = next(iter(indexes.values())).searcher.fields
    if fields:  # an example filter on the first served index's first field
        example["filter"] = {fields[0].name: {"string": "news", "int": 2020, "float": 0.5, "bool": True,
                                              "date": "2024-01-01", "datetime": "2024-01-01T00:00:00Z"}[fields[0].type]}
    app.add_api_route(PATH, search_route, methods=["POST"], summary="top-k search of query texts over a served "
                      "index (dense, sparse, multi-vector, hybrid or reranked), as `bertforge search`", responses=RESPONSES,
                      openapi_extra=request_body(
                          SearchRequest, example))
    return [f"POST {PATH}"]


__all__ = ["SearchRequest", "ServedIndex", "add_search_routes", "bind_indexes", "load_index_models",
           "open_indexes", "parse_index_option"]
