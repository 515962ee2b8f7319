"""A vector folder in a Qdrant collection, and that collection searched as a folder is: the way past one
machine (`bertforge export-index --to qdrant`, `search` / `serve --index qdrant://...`). The only module that
imports `qdrant_client` (with `qdrant_filters`, the filters); the folders are read through `store.VectorFolder`.

Owns: connecting to where a collection is (`qdrant_locations`: a server URL or a local folder, qdrant-client's
local mode, which runs the same client code): `connect` (`connect`, `release`: one
ConfigError for a server that does not answer; a local folder's client shared in the process), the collection's layout (`vectors_wanted`, `check_layout`), the export
(`export_folders`) and the search (`QdrantSearcher`).

Layout: one point per live row (tombstoned rows are not exported) with named vectors "dense" (the folder's
metric: Cosine or Dot; int8 and binary folders give their dequantized int8 codes) and "sparse" (term ids and
weights, scored by their dot product as ours are) and "multi-vector" (a ColBERT folder's token vectors of the
row, a Qdrant multivector compared by MaxSim over their dot products: `families.colbert.maxsim`'s score); folders
of different kinds and the same input share the points. The point id is a UUID derived from our id (and a chunk's span), so a second export of the same rows
upserts the same points; the payload holds "id" (ours), "text" (unless exported without it), "span" (chunked
folders) and the export's "bertforge_state" (a hash of the folders' manifests): points of an older state are
deleted once every row is written, so a folder's deletions reach the collection. The collection's metadata
(`META_KEY`) records the query model of each kind (the folder's `QueryModel`: what embeds queries), the metric
and whether the export finished; a collection without it is refused (its query model is unknown).

Search: dense, sparse and multi-vector queries (a query's token vectors) as `query_batch_points` of the named
vector; hybrid through Qdrant's own fusion (a prefetch of `depth` points per kind, then reciprocal rank fusion).
A server that does not answer a search is `QdrantUnavailable` (the server's 503); one that refuses it, ConfigError. Qdrant counts ranks from 0 in
1 / (k + rank), ours from 1, so its k is ours + 1: the fused scores are ours when both rankings are.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.errors import ConfigError, InputError
from bertforge.metrics.fusion import DEFAULT_RRF_K, check_rrf_k
from bertforge.metrics.sparse import SparseRows
from bertforge.retrieval.fields import FieldSpec
from bertforge.retrieval.filters import Filter, parse_filter
from bertforge.retrieval.qdrant_filters import METADATA_KEY, payload_value, qdrant_filter
from bertforge.retrieval.qdrant_locations import (
    QdrantLocation,
    export_location,
    parse_location,
)
from bertforge.retrieval.query_embedding import QueryModel, query_model
from bertforge.retrieval.searcher import DEFAULT_FUSION_DEPTH, KINDS, check_aligned
from bertforge.retrieval.store import VectorFolder
from bertforge.retrieval.vector_index import DEFAULT_TOP_K, check_top_k
from bertforge.retrieval.vector_quantization import dequantize_int8
from bertforge.retrieval.vector_texts import InputTexts

try:  # the `search` extra
    from qdrant_client import QdrantClient, models
    from qdrant_client.http.exceptions import ApiException, UnexpectedResponse
except ImportError:  # pragma: no cover - the extra is installed by `make install`
    QdrantClient = models = None
    ApiException = UnexpectedResponse = OSError

META_KEY = "bertforge"
META_FORMAT = 1
STATE_KEY = "bertforge_state"
# Qdrant's payload index of each field type (a server's filters use them; local mode scans).
INDEX_TYPES = {"string": "keyword", "int": "integer", "float": "float", "bool": "bool", "date": "datetime",
               "datetime": "datetime"}
DEFAULT_EXPORT_BATCH = 256  # points per upsert
TIMEOUT_S = 30
# Point ids: UUIDs in a namespace of our own, from our id (and a chunk's span).
POINT_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/bertforge/bertforge/qdrant-points")
CLIENT_ERRORS = (ApiException, RuntimeError, OSError, ValueError)


class QdrantUnavailable(ConfigError):
    """A Qdrant server did not answer (down, unreachable, timed out): the search may succeed later."""


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
    """kind -> what the collection must hold for it: ("dense", dim, distance), ("sparse",) or ("multi-vector",
    dim, "Dot": token vectors compared by MaxSim over their dot products)."""
    wanted: dict[str, Any] = {}
    if "dense" in folders:
        wanted["dense"] = ("dense", folders["dense"].dim, distance_of(folders["dense"].similarity).value)
    if "sparse" in folders:
        wanted["sparse"] = ("sparse",)
    if "multi-vector" in folders:
        wanted["multi-vector"] = ("multi-vector", folders["multi-vector"].dim, models.Distance.DOT.value)
    return wanted


def vector_params(spec: tuple) -> Any:
    """Qdrant's parameters of a dense or multi-vector kind (`vectors_wanted`'s spec)."""
    multi = models.MultiVectorConfig(comparator=models.MultiVectorComparator.MAX_SIM) \
        if spec[0] == "multi-vector" else None
    return models.VectorParams(size=spec[1], distance=spec[2], multivector_config=multi)


def vectors_held(info: Any) -> dict[str, Any]:
    """kind -> what a collection holds, in `vectors_wanted`'s terms (an unnamed vector is named "")."""
    dense = info.config.params.vectors or {}
    if not isinstance(dense, dict):
        dense = {"": dense}
    held = {name: ("multi-vector" if multi_vector(params) else "dense", params.size, params.distance.value)
            for name, params in dense.items()}
    held.update({name: ("sparse",) for name in (info.config.params.sparse_vectors or {})})
    return held


def multi_vector(params: Any) -> bool:
    """Whether a collection's vector is compared by MaxSim (a multivector of Qdrant's)."""
    config = getattr(params, "multivector_config", None)
    return config is not None and config.comparator == models.MultiVectorComparator.MAX_SIM


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
    return ", ".join(f"{name or '(unnamed)'}: " + ("sparse" if spec[0] == "sparse" else
                                                  f"{spec[1]} dims {spec[2]}" + (" MaxSim" if spec[0] == "multi-vector"
                                                                                 else ""))
                     for name, spec in sorted(vectors.items())) or "none"


def collection_record(folders: Mapping[str, VectorFolder], with_text: bool) -> dict[str, Any]:
    """The collection's metadata under `META_KEY`: each kind's query model, the metric, chunking, the live rows,
    whether texts are in the payload and the export's state (a hash of the folders' manifests)."""
    first = next(iter(folders.values()))
    described = fields_folder(folders)
    kinds = {kind: {**asdict(query_model(folder)), "directory": str(query_model(folder).directory)}
             for kind, folder in folders.items()}
    state = hashlib.sha256(json.dumps([folder.manifest for folder in folders.values()] + [with_text],
                                      sort_keys=True).encode()).hexdigest()[:32]
    return {"format": META_FORMAT, "kinds": kinds, "similarity": first.similarity if "dense" in folders else "dot",
            "chunked": first.chunked, "count": first.live_count, "text": with_text, "state": state,
            "folders": {kind: str(folder.directory.resolve()) for kind, folder in folders.items()}, "complete": False,
            "fields": [spec.record() for spec in described.fields]}


def fields_folder(folders: Mapping[str, VectorFolder]) -> VectorFolder:
    """The folder whose metadata fields the points carry: the first (in `KINDS` order) that stores fields, else
    the first (as `Searcher.described`; all hold the same records in the same rows)."""
    ordered = [folders[kind] for kind in KINDS if kind in folders]
    return next((folder for folder in ordered if folder.fields), ordered[0])


def query_model_of(record: Mapping[str, Any]) -> QueryModel:
    return QueryModel(Path(record["directory"]), record["fingerprint"], record["task"], dict(record["options"]),
                      int(record["max_length"]), record["precision"])


# --- export ---------------------------------------------------------------------------------------------------

def open_folders(directories: Sequence[str | os.PathLike]) -> dict[str, VectorFolder]:
    """kind -> folder: one folder, or folders of different kinds and the same input (`check_aligned`)."""
    folders: dict[str, VectorFolder] = {}
    for directory in directories:
        folder = VectorFolder(directory)
        if folder.kind in folders:
            raise ConfigError(f"two {folder.kind} folders ({folders[folder.kind].directory}, {directory}); a "
                              "collection holds one folder, or folders of different kinds and the same input")
        folders[folder.kind] = folder
    if not folders:
        raise ConfigError("give the folder to export (--index DIR; a dense and a sparse one: --index twice)")
    ordered = {kind: folders[kind] for kind in KINDS if kind in folders}
    first = next(iter(ordered.values()))
    for other in list(ordered.values())[1:]:
        check_aligned(first, other)
    return ordered


def point_id(ident: str, span: Sequence[int] | None) -> str:
    """The point's UUID: from our id, and for a chunk its [start, end] too (a record's chunks share its id)."""
    return str(uuid.uuid5(POINT_NAMESPACE, ident if span is None else json.dumps([ident, *span])))


class RowReader:
    """A folder's rows by global row range, across its shards, as Qdrant takes them: float32 dense vectors
    (int8 / binary folders: their dequantized int8 codes), sparse rows (one shard's rows held at a time) or each
    row's token vectors ([t, D] float32 per row, a list)."""

    def __init__(self, folder: VectorFolder):
        self.folder, self.cached = folder, (-1, None)

    def shard_part(self, shard: int, start: int, stop: int) -> np.ndarray | SparseRows | list[np.ndarray]:
        folder = self.folder
        if folder.kind == "multi-vector":
            rows = folder.shard_token_rows(shard)
            return [np.asarray(rows.row(i), dtype=np.float32) for i in range(start, stop)]
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
        if self.folder.kind == "multi-vector":
            return [row for part in parts for row in part]
        return SparseRows.concatenate(parts) if self.folder.kind == "sparse" else np.concatenate(parts)


def vector_of(kind: str, rows: np.ndarray | SparseRows | list[np.ndarray], i: int) -> Any:
    if kind in ("dense", "multi-vector"):
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
        described = fields_folder(folders)
        metadata = described.shard_metadata(shard).to_pylist() if described.fields else None
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
                if metadata is not None:  # a value the record lacks is left out: it matches != and not in only
                    payload[METADATA_KEY] = {name: payload_value(value) for name, value in metadata[place].items()
                                             if value is not None}
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
            dense = {kind: vector_params(spec) for kind, spec in wanted.items() if spec[0] != "sparse"}
            sparse = {"sparse": models.SparseVectorParams()} if "sparse" in wanted else None
            client.create_collection(location.collection, vectors_config=dense, sparse_vectors_config=sparse,
                                     metadata={META_KEY: record})
        if location.url is not None:  # a server filters through payload indexes (local mode scans)
            for spec in record["fields"]:
                client.create_payload_index(location.collection, f"{METADATA_KEY}.{spec['name']}",
                                            field_schema=INDEX_TYPES[spec["type"]], wait=True)
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
        self.fields = tuple(FieldSpec(**spec) for spec in record.get("fields", []))

    def check_filter(self, given: Any) -> Filter | None:
        """A filter checked against the fields the collection's points carry (`filters.parse_filter`)."""
        return parse_filter(given, self.fields)

    @property
    def hybrid(self) -> bool:
        return len(self.kinds) > 1

    def query_models(self) -> dict[str, QueryModel]:
        return {kind: query_model_of(self.record["kinds"][kind]) for kind in self.kinds}

    def where(self, kind: str) -> str:
        return f"{self.location} ({kind} vectors of {self.record['folders'][kind]})"

    def close(self) -> None:
        release(self.location, self.client)

    def request(self, kind: str, vectors: Any, q: int, limit: int, params: Any, condition: Any) -> dict[str, Any]:
        """One query's named-vector search (a `QueryRequest`'s or a `Prefetch`'s fields)."""
        if kind in ("dense", "multi-vector"):  # a vector [D], or a query's token vectors [q, D]
            query: Any = np.asarray(vectors[q], dtype=np.float32).tolist()
        else:
            terms, weights = vectors.row(q)
            query = models.SparseVector(indices=terms.tolist(), values=weights.tolist())
        return {"query": query, "using": kind, "limit": limit, **({"params": params} if params else {}),
                **({"filter": condition} if condition is not None else {})}

    def search(self, vectors: dict[str, Any], top_k: int = DEFAULT_TOP_K, *, show_text: bool = False,
               field: str | None = None, rescore_multiplier: int | None = None, ef_search: int | None = None,
               exact: bool = False, rrf_k: float = DEFAULT_RRF_K, depth: int = DEFAULT_FUSION_DEPTH,
               filter: Any = None) -> list[list[dict[str, Any]]]:
        """The top-k hits of each query, best first (`Searcher.search`'s arguments; `exact` and `ef_search`
        become Qdrant's search params, hybrid's for the dense prefetch; `rrf_k` must be a whole number; `filter`
        becomes Qdrant's filter, `qdrant_filter`, hybrid's on both prefetches; `field` is read from the
        payload's metadata).

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
        if field is not None and field not in {spec.name for spec in self.fields}:
            raise InputError(f"field {field!r}: a Qdrant collection's payload holds the id, text, span and the "
                             f"metadata fields ({', '.join(spec.name for spec in self.fields) or 'none'})")
        condition = qdrant_filter(self.check_filter(filter))
        if show_text and not self.record["text"]:
            raise InputError(f"{self.location} was exported without texts (--no-text); search without show_text")
        dense_params = models.SearchParams(hnsw_ef=ef_search, exact=True) if exact else \
            models.SearchParams(hnsw_ef=ef_search) if ef_search is not None else None
        count = len(vectors[self.kinds[0]])
        shown = ["id", "span"] + (["text"] if show_text else []) + ([METADATA_KEY] if field else [])
        if self.hybrid:
            check_top_k(depth, "depth")
            check_rrf_k(rrf_k)
            if rrf_k != int(rrf_k):
                raise InputError(f"rrf_k {rrf_k}: Qdrant's fusion takes a whole number")
            wide = max(depth, top_k)
            requests = [models.QueryRequest(
                prefetch=[models.Prefetch(**self.request(kind, vectors[kind], q, wide,
                                                         dense_params if kind == "dense" else None, condition))
                          for kind in self.kinds],
                query=models.RrfQuery(rrf=models.Rrf(k=int(rrf_k) + 1)), limit=top_k, with_payload=shown)
                for q in range(count)]
        else:
            kind = self.kinds[0]
            params = dense_params if kind == "dense" else None
            requests = [models.QueryRequest(**self.request(kind, vectors[kind], q, top_k, params, condition), with_payload=shown)
                        for q in range(count)]
        if not requests:
            return []
        try:
            answers = self.client.query_batch_points(self.location.collection, requests=requests)
        except CLIENT_ERRORS as error:
            if self.location.url is None or isinstance(error, UnexpectedResponse):  # refused, not unanswered
                raise ConfigError(f"{self.location}: the search failed ({str(error).strip()[:300]})") from None
            raise QdrantUnavailable(f"{self.location} did not answer the search ({str(error).strip()[:300]}); retry "
                                    "when the Qdrant server is back") from None
        return [[hit_of(point, show_text, field) for point in answer.points] for answer in answers]


def hit_of(point: Any, show_text: bool, field: str | None = None) -> dict[str, Any]:
    """Our hit of a scored point: {"id", "score"}, plus "span" of a chunk, "text" with `show_text` and the
    metadata `field` (None where the record has none)."""
    payload = point.payload or {}
    hit: dict[str, Any] = {"id": payload.get("id", str(point.id)), "score": float(point.score)}
    if "span" in payload:
        hit["span"] = list(payload["span"])
    if show_text:
        hit["text"] = payload.get("text", "")
    if field is not None:
        hit[field] = (payload.get(METADATA_KEY) or {}).get(field)
    return hit


__all__ = ["DEFAULT_EXPORT_BATCH", "META_KEY", "METADATA_KEY", "QdrantSearcher", "QdrantUnavailable", "connect",
           "export_folders", "point_id", "qdrant_filter", "release"]
