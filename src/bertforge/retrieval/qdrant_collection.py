"""A vector folder in a Qdrant collection, and that collection searched as a folder is: the way past one
machine (`bertforge export-index --to qdrant`, `search` / `serve --index qdrant://...`). The only module that
imports `qdrant_client`; the folders are read through `store.VectorFolder`.

Owns: where a collection is (`QdrantLocation`, `parse_location`, `export_location`: a server URL or a local
folder, qdrant-client's local mode, which runs the same client code), connecting (`connect`, `release`: one
ConfigError for a server that does not answer; a local folder's client shared in the process), the collection's layout (`vectors_wanted`, `check_layout`), the export
(`export_folders`) and the search (`QdrantSearcher`).

Layout: one point per live row (tombstoned rows are not exported) with named vectors "dense" (the folder's
metric: Cosine or Dot; int8 and binary folders give their dequantized int8 codes) and "sparse" (term ids and
weights, scored by their dot product as ours are); a dense and a sparse folder of the same input share the
points. The point id is a UUID derived from our id (and a chunk's span), so a second export of the same rows
upserts the same points; the payload holds "id" (ours), "text" (unless exported without it), "span" (chunked
folders) and the export's "bertforge_state" (a hash of the folders' manifests): points of an older state are
deleted once every row is written, so a folder's deletions reach the collection. The collection's metadata
(`META_KEY`) records the query model of each kind (the folder's `QueryModel`: what embeds queries), the metric
and whether the export finished; a collection without it is refused (its query model is unknown).

Search: dense and sparse queries as `query_batch_points` of the named vector; hybrid through Qdrant's own
fusion (two prefetches of `depth` points, then reciprocal rank fusion). Qdrant counts ranks from 0 in
1 / (k + rank), ours from 1, so its k is ours + 1: the fused scores are ours when both rankings are.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np

from bertforge.errors import ConfigError, InputError
from bertforge.metrics.fusion import DEFAULT_RRF_K, check_rrf_k
from bertforge.metrics.sparse import SparseRows
from bertforge.retrieval.searcher import (
    DEFAULT_FUSION_DEPTH,
    KINDS,
    QueryModel,
    check_same_input,
    query_model,
)
from bertforge.retrieval.store import VectorFolder
from bertforge.retrieval.vector_index import DEFAULT_TOP_K, check_top_k
from bertforge.retrieval.vector_quantization import dequantize_int8
from bertforge.retrieval.vector_texts import InputTexts

try:  # the `search` extra
    from qdrant_client import QdrantClient, models
    from qdrant_client.http.exceptions import ApiException
except ImportError:  # pragma: no cover - the extra is installed by `make install`
    QdrantClient = models = None
    ApiException = OSError

SCHEMES = ("qdrant", "qdrants", "qdrant+path")
DEFAULT_PORT = 6333
META_KEY = "bertforge"
META_FORMAT = 1
STATE_KEY = "bertforge_state"
DEFAULT_EXPORT_BATCH = 256  # points per upsert
TIMEOUT_S = 30
COLLECTION_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,255}$")
# Point ids: UUIDs in a namespace of our own, from our id (and a chunk's span).
POINT_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/bertforge/bertforge/qdrant-points")
CLIENT_ERRORS = (ApiException, RuntimeError, OSError, ValueError)


@dataclass(frozen=True)
class QdrantLocation:
    """A collection: on a server (`url`) or in a local folder (`path`, qdrant-client's local mode); `vectors`:
    the one kind of a dense-and-sparse collection to search (None: every kind it holds, hybrid)."""

    collection: str
    url: str | None = None
    path: str | None = None
    vectors: str | None = None

    def __str__(self) -> str:
        return f"collection {self.collection} at {self.url or self.path}"


def is_qdrant_location(text: str | os.PathLike) -> bool:
    """Whether an --index value names a Qdrant collection (qdrant://, qdrants://, qdrant+path:)."""
    return str(text).split(":", 1)[0] in SCHEMES and ":" in str(text)


def check_collection_name(name: str, given: str) -> str:
    if not COLLECTION_NAME.fullmatch(name or ""):
        raise ConfigError(f"{given}: {name!r} is not a collection name (letters, digits, '_', '.', '-')")
    return name


def parse_location(text: str) -> QdrantLocation:
    """`qdrant://HOST[:PORT]/COLLECTION` (qdrants://: HTTPS; port 6333 by default) or
    `qdrant+path:DIR?collection=NAME` (a local folder); either may end in `?vectors=dense` or `sparse` to search
    one kind of a collection that holds both."""
    parts = urlsplit(str(text))
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    vectors = query.pop("vectors", None)
    if vectors is not None and vectors not in KINDS:
        raise ConfigError(f"{text}: vectors={vectors} is not a kind; use vectors=dense or vectors=sparse")
    if parts.scheme == "qdrant+path":
        path = parts.netloc + parts.path if parts.netloc else parts.path
        if not path or "collection" not in query:
            raise ConfigError(f"{text}: give the folder and the collection, e.g. qdrant+path:/data/qdrant?collection=docs")
        return QdrantLocation(check_collection_name(query["collection"], text), path=path, vectors=vectors)
    if parts.scheme not in ("qdrant", "qdrants") or not parts.hostname:
        raise ConfigError(f"{text}: a Qdrant collection is qdrant://HOST:PORT/COLLECTION or "
                          "qdrant+path:DIR?collection=NAME")
    scheme = "https" if parts.scheme == "qdrants" else "http"
    url = f"{scheme}://{parts.hostname}:{parts.port or DEFAULT_PORT}"
    return QdrantLocation(check_collection_name(parts.path.strip("/"), text), url=url, vectors=vectors)


def export_location(target: str, collection: str | None, default: str) -> QdrantLocation:
    """Where `export-index --to qdrant TARGET` writes: a qdrant:// location, a server URL (http, https) or a
    local folder, with `collection` (default: `default`, the folder's name)."""
    if is_qdrant_location(target):
        location = parse_location(target)
        if collection is not None and collection != location.collection:
            raise ConfigError(f"{target} names collection {location.collection}; remove --collection {collection}")
        return location
    name = check_collection_name(collection or re.sub(r"[^A-Za-z0-9_.-]", "_", default), "--collection")
    if urlsplit(target).scheme in ("http", "https"):
        return QdrantLocation(name, url=target.rstrip("/"))
    return QdrantLocation(name, path=target)


# Local mode locks its folder to one client per process: the collections of one folder share it (path -> [client,
# users]); it is closed when its last user releases it.
LOCAL_CLIENTS: dict[str, list[Any]] = {}
LOCAL_LOCK = threading.Lock()


def connect(location: QdrantLocation) -> Any:
    """A client of the location's server (QDRANT_API_KEY: its key) or local folder (shared by the collections of
    one folder in this process), checked to answer; `release` it when done.

    Raises:
        ConfigError: qdrant-client is not installed, the server does not answer, or the local folder is
            open in another process (local mode is one process's).
    """
    if QdrantClient is None:
        raise ConfigError("Qdrant needs qdrant-client: pip install 'bertforge[search]'")
    key = str(Path(location.path).resolve()) if location.path is not None else None
    with LOCAL_LOCK:
        if key in LOCAL_CLIENTS:
            LOCAL_CLIENTS[key][1] += 1
            return LOCAL_CLIENTS[key][0]
        try:
            if key is not None:
                client = QdrantClient(path=location.path)
            else:
                client = QdrantClient(url=location.url, api_key=os.environ.get("QDRANT_API_KEY"), timeout=TIMEOUT_S)
            client.get_collections()
        except CLIENT_ERRORS as error:
            where = location.url or location.path
            raise ConfigError(f"Qdrant at {where} cannot be used ({str(error).strip()[:300]}); start the server or "
                              "check the URL (and QDRANT_API_KEY); a local folder is one process's at a time") from None
        if key is not None:
            LOCAL_CLIENTS[key] = [client, 1]
    return client


def release(location: QdrantLocation, client: Any) -> None:
    """Done with a client of `connect`: a server's is closed, a local folder's when its last user is done."""
    key = str(Path(location.path).resolve()) if location.path is not None else None
    with LOCAL_LOCK:
        if key in LOCAL_CLIENTS:
            LOCAL_CLIENTS[key][1] -= 1
            if LOCAL_CLIENTS[key][1]:
                return
            del LOCAL_CLIENTS[key]
    client.close()


# --- the collection's layout and record ------------------------------------------------------------------------

def distance_of(similarity: str) -> Any:
    return models.Distance.COSINE if similarity == "cosine" else models.Distance.DOT


def vectors_wanted(folders: Mapping[str, VectorFolder]) -> dict[str, Any]:
    """kind -> what the collection must hold for it: ("dense", dim, distance) or ("sparse",)."""
    wanted: dict[str, Any] = {}
    if "dense" in folders:
        wanted["dense"] = ("dense", folders["dense"].dim, distance_of(folders["dense"].similarity).value)
    if "sparse" in folders:
        wanted["sparse"] = ("sparse",)
    return wanted


def vectors_held(info: Any) -> dict[str, Any]:
    """kind -> what a collection holds, in `vectors_wanted`'s terms (an unnamed vector is named "")."""
    dense = info.config.params.vectors or {}
    if not isinstance(dense, dict):
        dense = {"": dense}
    held = {name: ("dense", params.size, params.distance.value) for name, params in dense.items()}
    held.update({name: ("sparse",) for name in (info.config.params.sparse_vectors or {})})
    return held


def check_layout(location: QdrantLocation, info: Any, wanted: Mapping[str, Any], record: Mapping[str, Any]) -> None:
    """ConfigError unless an existing collection holds the same named vectors (size, metric) and, where it
    records one, the same query models: an export adds to no other layout or model."""
    held = vectors_held(info)
    if held != dict(wanted):
        raise ConfigError(f"{location} holds vectors {describe(held)}, these folders {describe(wanted)}: export to "
                          "another --collection, or delete that collection first")
    earlier = (info.config.metadata or {}).get(META_KEY) or {}
    for kind, model in earlier.get("kinds", {}).items():
        if model.get("fingerprint") != record["kinds"][kind]["fingerprint"]:
            raise ConfigError(f"{location} holds {kind} vectors of another model ({model.get('path')}): export to "
                              "another --collection, or delete that collection first")


def describe(vectors: Mapping[str, Any]) -> str:
    return ", ".join(f"{name or '(unnamed)'}: " + ("sparse" if spec[0] == "sparse" else f"{spec[1]} dims {spec[2]}")
                     for name, spec in sorted(vectors.items())) or "none"


def collection_record(folders: Mapping[str, VectorFolder], with_text: bool) -> dict[str, Any]:
    """The collection's metadata under `META_KEY`: each kind's query model, the metric, chunking, the live rows,
    whether texts are in the payload and the export's state (a hash of the folders' manifests)."""
    first = next(iter(folders.values()))
    kinds = {kind: {**asdict(query_model(folder)), "directory": str(query_model(folder).directory)}
             for kind, folder in folders.items()}
    state = hashlib.sha256(json.dumps([folder.manifest for folder in folders.values()] + [with_text],
                                      sort_keys=True).encode()).hexdigest()[:32]
    return {"format": META_FORMAT, "kinds": kinds, "similarity": first.similarity if "dense" in folders else "dot",
            "chunked": first.chunked, "count": first.live_count, "text": with_text, "state": state,
            "folders": {kind: str(folder.directory.resolve()) for kind, folder in folders.items()}, "complete": False}


def query_model_of(record: Mapping[str, Any]) -> QueryModel:
    return QueryModel(Path(record["directory"]), record["fingerprint"], record["task"], dict(record["options"]),
                      int(record["max_length"]), record["precision"])


# --- export ---------------------------------------------------------------------------------------------------

def open_folders(directories: Sequence[str | os.PathLike]) -> dict[str, VectorFolder]:
    """kind -> folder: one folder, or a dense and a sparse folder of the same input (`check_same_input`)."""
    folders: dict[str, VectorFolder] = {}
    for directory in directories:
        folder = VectorFolder(directory)
        if folder.kind in folders:
            raise ConfigError(f"two {folder.kind} folders ({folders[folder.kind].directory}, {directory}); a "
                              "collection holds one folder, or a dense and a sparse folder of the same input")
        folders[folder.kind] = folder
    if not folders:
        raise ConfigError("give the folder to export (--index DIR; a dense and a sparse one: --index twice)")
    if len(folders) == 2:
        check_same_input(folders["dense"], folders["sparse"])
    return {kind: folders[kind] for kind in KINDS if kind in folders}


def point_id(ident: str, span: Sequence[int] | None) -> str:
    """The point's UUID: from our id, and for a chunk its [start, end] too (a record's chunks share its id)."""
    return str(uuid.uuid5(POINT_NAMESPACE, ident if span is None else json.dumps([ident, *span])))


class RowReader:
    """A folder's rows by global row range, across its shards, as Qdrant takes them: float32 dense vectors
    (int8 / binary folders: their dequantized int8 codes) or sparse rows (one shard's rows held at a time)."""

    def __init__(self, folder: VectorFolder):
        self.folder, self.cached = folder, (-1, None)

    def shard_part(self, shard: int, start: int, stop: int) -> np.ndarray | SparseRows:
        folder = self.folder
        if folder.kind == "sparse":
            if self.cached[0] != shard:
                self.cached = (shard, folder.shard_rows(shard))
            return self.cached[1].slice(start, stop)
        dtype = folder.manifest["dtype"]
        if dtype in ("int8", "binary"):
            codes = folder.shard_vectors(shard, "vectors" if dtype == "int8" else "codes")[start:stop]
            return dequantize_int8(np.asarray(codes), folder.manifest["calibration"])
        return np.asarray(folder.shard_vectors(shard)[start:stop], dtype=np.float32)

    def rows(self, start: int, stop: int) -> np.ndarray | SparseRows:
        offsets, parts = self.folder.offsets, []
        for shard in range(int(np.searchsorted(offsets, start, side="right")) - 1, len(self.folder.shards)):
            first = int(offsets[shard])
            if first >= stop:
                break
            parts.append(self.shard_part(shard, max(start - first, 0), min(stop, int(offsets[shard + 1])) - first))
        return SparseRows.concatenate(parts) if self.folder.kind == "sparse" else np.concatenate(parts)


def vector_of(kind: str, rows: np.ndarray | SparseRows, i: int) -> Any:
    if kind == "dense":
        return rows[i].tolist()
    terms, weights = rows.row(i)
    return models.SparseVector(indices=terms.tolist(), values=weights.tolist())


def points_of(folders: Mapping[str, VectorFolder], state: str, with_text: bool,
              batch_size: int) -> Iterator[list[Any]]:
    """The live rows' points, `batch_size` at a time, in row order; one shard's ids and spans are read at a
    time (and one sparse shard), texts in one pass over the input (`vector_texts.InputTexts`)."""
    first = next(iter(folders.values()))
    readers = {kind: RowReader(folder) for kind, folder in folders.items()}
    inputs: dict[int, InputTexts] = {}
    for shard in range(len(first.shards)):
        low, high = int(first.offsets[shard]), int(first.offsets[shard + 1])
        ids = first.shard_lines(shard, "ids")
        spans = first.shard_lines(shard, "spans") if first.chunked else None
        sources, records = first.records_at(np.arange(low, high)[None, :]) if with_text else (None, None)
        for start in range(low, high, batch_size):
            stop = min(start + batch_size, high)
            rows = {kind: reader.rows(start, stop) for kind, reader in readers.items()}
            batch = []
            for row in range(start, stop):
                if first.live is not None and not first.live[row]:
                    continue  # deleted or replaced
                place = row - low
                span = spans[place][1:] if spans is not None else None
                payload: dict[str, Any] = {"id": ids[place], STATE_KEY: state}
                if span is not None:
                    payload["span"] = span
                if with_text:
                    source, record = int(sources[0, place]), int(records[0, place])
                    if source not in inputs:
                        inputs[source] = InputTexts(first.input_of(source))
                    text = inputs[source].text_of(record)
                    payload["text"] = text if span is None else text[span[0]:span[1]]
                vectors = {kind: vector_of(kind, part, row - start) for kind, part in rows.items()}
                batch.append(models.PointStruct(id=point_id(ids[place], span), vector=vectors, payload=payload))
            if batch:
                yield batch


def export_folders(directories: Sequence[str | os.PathLike], target: str, *, collection: str | None = None,
                   with_text: bool = True, batch_size: int = DEFAULT_EXPORT_BATCH) -> dict[str, Any]:
    """Write a folder (or a dense and a sparse folder of the same input) into a Qdrant collection, created with
    their layout when missing: the live rows upserted `batch_size` at a time, then the points of an earlier
    export that are not rows now deleted, then the metadata marked complete. Rerunning writes the same points.

    Args:
        directories: `bertforge embed --out` folders.
        target: qdrant://HOST:PORT/COLLECTION, a server URL (http, https) or a local folder.
        collection: the collection's name (default: the first folder's name); with_text: the texts as payload
            (read back from the embedded input, which must be unchanged).

    Returns:
        {"collection", "where", "points", "removed"}.

    Raises:
        ConfigError: a folder is unfinished or of the wrong kind, the server does not answer, or the collection
            holds other vectors (size, metric, kinds) or another model's.
    """
    check_top_k(batch_size, "batch_size")
    folders = open_folders(directories)
    location = export_location(target, collection, next(iter(folders.values())).directory.resolve().name)
    wanted, record = vectors_wanted(folders), collection_record(folders, with_text)
    client = connect(location)
    try:
        if client.collection_exists(location.collection):
            check_layout(location, client.get_collection(location.collection), wanted, record)
            client.update_collection(location.collection, metadata={META_KEY: record})
        else:
            dense = {"dense": models.VectorParams(size=wanted["dense"][1], distance=wanted["dense"][2])} \
                if "dense" in wanted else {}
            sparse = {"sparse": models.SparseVectorParams()} if "sparse" in wanted else None
            client.create_collection(location.collection, vectors_config=dense, sparse_vectors_config=sparse,
                                     metadata={META_KEY: record})
        points = 0
        for batch in points_of(folders, record["state"], with_text, batch_size):
            client.upsert(location.collection, batch, wait=True)
            points += len(batch)
        stale = models.Filter(must_not=[models.FieldCondition(key=STATE_KEY,
                                                              match=models.MatchValue(value=record["state"]))])
        removed = client.count(location.collection, count_filter=stale, exact=True).count
        if removed:
            client.delete(location.collection, points_selector=models.FilterSelector(filter=stale), wait=True)
        client.update_collection(location.collection, metadata={META_KEY: {**record, "complete": True}})
    except ApiException as error:
        raise ConfigError(f"{location}: Qdrant refused the export ({str(error).strip()[:300]})") from None
    finally:
        release(location, client)
    return {"collection": location.collection, "where": location.url or location.path, "points": points,
            "removed": removed}


# --- search -----------------------------------------------------------------------------------------------------

class QdrantSearcher:
    """A collection written by `export_folders`, opened for search as `searcher.Searcher` opens folders: the
    same `kinds`, `query_models`, `count`, `where` and `search` (hits {"id", "score"}, plus "span" of chunks,
    "text"), so `bertforge search` and `POST /search` take either.

    Raises:
        ConfigError: the server does not answer, the collection is missing, was not written by bertforge (its
            query model is unknown) or its export has not finished.
    """

    def __init__(self, location: str | QdrantLocation):
        self.location = location if isinstance(location, QdrantLocation) else parse_location(location)
        self.client = connect(self.location)
        name = self.location.collection
        if not self.client.collection_exists(name):
            self.close()
            raise ConfigError(f"no {self.location}; write one with `bertforge export-index --index DIR --to qdrant "
                              f"{self.location.url or self.location.path} --collection {name}`")
        record = (self.client.get_collection(name).config.metadata or {}).get(META_KEY)
        problem = ("was not written by `bertforge export-index`: the model that embeds its queries is unknown"
                   if not isinstance(record, dict) or record.get("format") != META_FORMAT else
                   None if record.get("complete") else "is half written: rerun the same `bertforge export-index`")
        if problem:
            self.close()
            raise ConfigError(f"{self.location} {problem}")
        held = [kind for kind in KINDS if kind in record["kinds"]]
        if self.location.vectors is not None and self.location.vectors not in held:
            self.close()
            raise ConfigError(f"{self.location} holds no {self.location.vectors} vectors (it holds {', '.join(held)})")
        self.kinds = (self.location.vectors,) if self.location.vectors else tuple(held)
        self.record = record
        self.count = int(record["count"])

    @property
    def hybrid(self) -> bool:
        return len(self.kinds) == 2

    def query_models(self) -> dict[str, QueryModel]:
        return {kind: query_model_of(self.record["kinds"][kind]) for kind in self.kinds}

    def where(self, kind: str) -> str:
        return f"{self.location} ({kind} vectors of {self.record['folders'][kind]})"

    def close(self) -> None:
        release(self.location, self.client)

    def request(self, kind: str, vectors: Any, q: int, limit: int, params: Any) -> dict[str, Any]:
        """One query's named-vector search (a `QueryRequest`'s or a `Prefetch`'s fields)."""
        if kind == "dense":
            query: Any = np.asarray(vectors[q], dtype=np.float32).tolist()
        else:
            terms, weights = vectors.row(q)
            query = models.SparseVector(indices=terms.tolist(), values=weights.tolist())
        return {"query": query, "using": kind, "limit": limit, **({"params": params} if params else {})}

    def search(self, vectors: dict[str, Any], top_k: int = DEFAULT_TOP_K, *, show_text: bool = False,
               field: str | None = None, rescore_multiplier: int | None = None, ef_search: int | None = None,
               exact: bool = False, rrf_k: float = DEFAULT_RRF_K, depth: int = DEFAULT_FUSION_DEPTH,
               ) -> list[list[dict[str, Any]]]:
        """The top-k hits of each query, best first (`Searcher.search`'s arguments; `exact` and `ef_search`
        become Qdrant's search params, hybrid's for the dense prefetch; `rrf_k` must be a whole number).

        Raises:
            InputError: a setting that does not apply to a Qdrant collection, or a field its payload lacks.
        """
        check_top_k(top_k)
        missing = [kind for kind in self.kinds if kind not in vectors]
        if missing:
            raise InputError(f"the {missing[0]} query vectors are missing")
        if rescore_multiplier is not None:
            raise InputError("rescore_multiplier applies to a binary folder; a Qdrant collection rescores as its "
                             "own quantization config says")
        if ef_search is not None:
            check_top_k(ef_search, "ef_search")
        if field is not None:
            raise InputError(f"field {field!r}: a Qdrant collection's payload holds the id, text and span only")
        if show_text and not self.record["text"]:
            raise InputError(f"{self.location} was exported without texts (--no-text); search without show_text")
        dense_params = models.SearchParams(hnsw_ef=ef_search, exact=True) if exact else \
            models.SearchParams(hnsw_ef=ef_search) if ef_search is not None else None
        count = len(vectors[self.kinds[0]])
        shown = ["id", "span", "text"] if show_text else ["id", "span"]
        if self.hybrid:
            check_top_k(depth, "depth")
            check_rrf_k(rrf_k)
            if rrf_k != int(rrf_k):
                raise InputError(f"rrf_k {rrf_k}: Qdrant's fusion takes a whole number")
            wide = max(depth, top_k)
            requests = [models.QueryRequest(
                prefetch=[models.Prefetch(**self.request("dense", vectors["dense"], q, wide, dense_params)),
                          models.Prefetch(**self.request("sparse", vectors["sparse"], q, wide, None))],
                query=models.RrfQuery(rrf=models.Rrf(k=int(rrf_k) + 1)), limit=top_k, with_payload=shown)
                for q in range(count)]
        else:
            kind = self.kinds[0]
            params = dense_params if kind == "dense" else None
            requests = [models.QueryRequest(**self.request(kind, vectors[kind], q, top_k, params), with_payload=shown)
                        for q in range(count)]
        if not requests:
            return []
        try:
            answers = self.client.query_batch_points(self.location.collection, requests=requests)
        except CLIENT_ERRORS as error:
            raise ConfigError(f"{self.location}: the search failed ({str(error).strip()[:300]})") from None
        return [[hit_of(point, show_text) for point in answer.points] for answer in answers]


def hit_of(point: Any, show_text: bool) -> dict[str, Any]:
    """Our hit of a scored point: {"id", "score"}, plus "span" of a chunk and "text" with `show_text`."""
    payload = point.payload or {}
    hit: dict[str, Any] = {"id": payload.get("id", str(point.id)), "score": float(point.score)}
    if "span" in payload:
        hit["span"] = list(payload["span"])
    if show_text:
        hit["text"] = payload.get("text", "")
    return hit


__all__ = ["DEFAULT_EXPORT_BATCH", "META_KEY", "QdrantLocation", "QdrantSearcher", "connect", "export_folders",
           "export_location", "is_qdrant_location", "parse_location", "point_id"]
