"""An approximate index over the vector shards `embed_corpus` writes: an HNSW graph (faiss, the optional
`search` extra: pip install 'bertforge[search]'), built once by `bertforge index`, saved beside the shards,
and searched by `bertforge search` instead of scanning every vector (`vector_search`).

Owns: building the graph (`build_ann`), its two files in the embedding folder (`ann-hnsw.faiss`, the graph
with its vectors; `ann.json`, what it was built from and with, and the graph file's sha256 and size), the key
that ties it to the shards (`shards_key`), opening it (`open_ann`) and searching it (`AnnIndex.search_vectors`,
the same ([Q, k] scores, [Q, k] global rows) as `VectorIndex.search_vectors`).

Integrity: an index is searched only when `ann.json` was built from the vectors the shards hold now (the key
of their manifest checksums, which `VectorIndex` holds the shard files to) and the graph file is the one built
(its sha256: another folder's graph of the same size, a graph of the same vectors in another order, a
truncated file). Otherwise `open_ann` logs why and builds the index again from the vectors, with the settings
it recorded; hashing the graph costs about as much as faiss reading it.

Metric: the inner product of the float query and the stored vector, exactly the score exact search
computes: the cosine for a `--normalize`d corpus, else the plain dot product. The graph is built with that
metric too (faiss's METRIC_INNER_PRODUCT), never with L2: an L2 graph over unnormalized vectors finds other
neighbours than the dot product ranks (sentence-transformers' faiss helper shipped that bug). float16 shards
are widened to float32; int8 folders are indexed by their dequantized vectors, the ones exact search scores
against. Binary folders are refused (their exact search is a scan by sign then a rescoring, not one metric).
Hits come back ordered as exact search orders them: score descending, equal scores by lower row.

What it trades: the graph finds most, not all, of the exact top k (recall@10 measured in docs/benchmarks.md
with `benchmarks/ann_search.py`); `ef_search` (candidates kept while walking the graph) buys recall with time.
Memory: the whole graph and a float32 copy of every vector, in RAM while it is built or searched.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertforge import storage
from bertforge.checkpoint_integrity import brief
from bertforge.errors import ConfigError
from bertforge.retrieval.index_sources import file_records, files_problem
from bertforge.retrieval.vector_index import BLOCK_ROWS, VectorIndex, check_top_k, top_k_merge
from bertforge.retrieval.vector_quantization import dequantize_int8

log = logging.getLogger(__name__)

ANN_NAME = "ann.json"
GRAPH_NAME = "ann-hnsw.faiss"
FORMAT_NAME = "bertforge-ann"
FORMAT_VERSION = 2  # 2: ann.json records the graph file's sha256
# HNSW settings: neighbours per node (M), candidates while inserting (ef_construction) and while searching
# (ef_search). M 32 / 200 are the values the field uses for sentence vectors of a few hundred dimensions;
# ef_search 128 keeps recall@10 >= 0.95 on 200,000 MiniLM vectors (docs/benchmarks.md).
DEFAULT_M = 32
DEFAULT_EF_CONSTRUCTION = 200
DEFAULT_EF_SEARCH = 128
EXTRA = "pip install 'bertforge[search]' (faiss-cpu)"


def import_faiss() -> Any:
    """The faiss module, or one error naming the extra to install."""
    try:
        import faiss
    except ImportError:
        raise ConfigError(f"the approximate index needs faiss: {EXTRA}; or search with --exact") from None
    return faiss


def shards_key(manifest: dict[str, Any], shards: int | None = None) -> str:
    """sha256 over what decides the indexed vectors: every shard's vectors file (its recorded sha256 and row
    count, in order; the first `shards` of them), the dtype, width and int8 calibration. Re-embedding the folder
    changes it; `bertforge add` appends shards, whose first ones keep the key the graph was built with."""
    parts = {"dtype": manifest["dtype"], "dim": manifest["dim"], "calibration": manifest.get("calibration"),
             "shards": [[shard["sha256"]["vectors"], shard["count"]] for shard in manifest["shards"][:shards]]}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def float_block(index: VectorIndex, block: np.ndarray) -> np.ndarray:
    """A block of stored rows as the float32 vectors exact search scores against (module docstring)."""
    if index.manifest["dtype"] == "int8":
        return dequantize_int8(np.asarray(block), index.manifest["calibration"])
    return np.ascontiguousarray(block, dtype=np.float32)


def check_positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def build_ann(directory: str | os.PathLike, *, m: int = DEFAULT_M, ef_construction: int = DEFAULT_EF_CONSTRUCTION,
              ef_search: int = DEFAULT_EF_SEARCH) -> dict[str, Any]:
    """Build the HNSW graph of a complete embedding folder and save it beside the shards (the graph file, then
    `ann.json`, each atomically: a killed build leaves the folder as it was).

    Args:
        directory: the `--out` folder of `bertforge embed` (float32, float16 or int8).
        m: neighbours per node; ef_construction: candidates kept while inserting; ef_search: the default
            candidates kept while searching (`search --ef-search` overrides it).

    Returns:
        The `ann.json` record (what the graph was built from and with, and how long it took).

    Raises:
        ConfigError: not a complete folder, a binary or sparse folder, a bad setting, a shard that is not what
            the manifest records, or faiss missing.
    """
    index = VectorIndex(directory)
    graph, record = build_graph(index, {"m": m, "ef_construction": ef_construction, "ef_search": ef_search})
    save_ann(index, graph, record)
    log.info("HNSW index of %d vectors built in %.1f s (%d threads): %s", index.count, record["build_seconds"],
             record["threads"], index.directory / GRAPH_NAME)
    return record


def build_graph(index: VectorIndex, settings: dict[str, int]) -> tuple[Any, dict[str, Any]]:
    """(the HNSW graph of every vector of `index`, its record but the graph file's checksum); `settings`:
    m, ef_construction, ef_search."""
    for name, value in settings.items():
        check_positive(value, name)
    if index.kind == "sparse":
        raise ConfigError(f"{index.directory} holds sparse vectors, which search through their inverted index; "
                          "`bertforge index` builds the approximate index of a dense folder")
    if index.manifest["dtype"] == "binary":
        raise ConfigError(f"{index.directory} holds binary vectors, whose search is a scan by sign and a rescoring; "
                          "build the approximate index from a float32, float16 or int8 folder (embed --dtype)")
    faiss = import_faiss()
    started = time.perf_counter()
    graph = faiss.IndexHNSWFlat(index.dim, settings["m"], faiss.METRIC_INNER_PRODUCT)
    graph.hnsw.efConstruction = settings["ef_construction"]
    for shard in range(len(index.shards)):
        vectors = index.shard_vectors(shard)  # its sha256 checked against the manifest first
        for start in range(0, len(vectors), BLOCK_ROWS):  # rows are added in global order: faiss id = row
            graph.add(float_block(index, vectors[start:start + BLOCK_ROWS]))
    record = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "kind": "hnsw", "metric": "inner_product",
              "similarity": index.similarity, "count": index.count, "dim": index.dim,
              "shards_key": shards_key(index.manifest), "shards": len(index.shards), **settings,
              "faiss": faiss.__version__,
              "threads": faiss.omp_get_max_threads(), "file": GRAPH_NAME,
              "build_seconds": round(time.perf_counter() - started, 3)}
    return graph, record


def save_ann(index: VectorIndex, graph: Any, record: dict[str, Any]) -> None:
    """Write the graph file (under the record's "file"), then `ann.json` with the graph's sha256 and size (each
    atomically: `ann.json` is the index's commit point, always naming a whole graph of the vectors it records),
    then remove the graph files it no longer names (`sweep_graphs`).

    Raises:
        OSError: the folder cannot be written.
    """
    path = index.directory / record["file"]
    storage.remove_stale_temporaries(index.directory)  # a killed build's half-written graph (its process is gone)
    with storage.atomic_path(path) as tmp:
        import_faiss().write_index(graph, str(tmp))
        record.update(file_records(tmp.parent, [tmp.name])[tmp.name])  # "sha256", "bytes"
    storage.write_json(index.directory / ANN_NAME, record)
    sweep_graphs(index.directory)


def read_ann_record(directory: Path) -> dict[str, Any] | None:
    """The folder's `ann.json` (None when it has none, or it is unreadable: `open_ann` then builds it again)."""
    try:
        record = storage.read_json(directory / ANN_NAME, what="approximate index record")
    except (FileNotFoundError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def sweep_graphs(directory: Path) -> list[str]:
    """Remove the graph files `ann.json` does not name (those it named before a save, a killed save's); return
    their names."""
    record = read_ann_record(directory)
    removed = []
    for old in directory.glob("ann-hnsw*.faiss") if record is not None else ():
        if old.name != graph_name(record):
            old.unlink(missing_ok=True)
            removed.append(old.name)
    return removed


def extend_graph(ann: AnnIndex) -> AnnIndex:
    """The approximate index of a folder whose shards were appended to since it was built (`bertforge add`):
    the graph gets the new shards' vectors (faiss id = global row, as at build) and is saved under a new name
    with its record; deleted rows stay in the graph, masked at search."""
    index, first = ann.vectors, ann.record["shards"]
    started = time.perf_counter()
    for shard in range(first, len(index.shards)):
        vectors = index.shard_vectors(shard)
        for start in range(0, len(vectors), BLOCK_ROWS):
            ann.graph.add(float_block(index, vectors[start:start + BLOCK_ROWS]))
    record = {**ann.record, "count": index.count, "shards_key": shards_key(index.manifest),
              "shards": len(index.shards), "file": f"ann-hnsw-{len(index.shards):05d}.faiss",
              "extend_seconds": round(time.perf_counter() - started, 3)}
    try:
        save_ann(index, ann.graph, record)
    except OSError as error:  # a read-only folder: extended in memory at each open
        log.warning("%s: the extended approximate index could not be saved (%s)", index.directory, error)
    log.info("%s: approximate index extended by %d vectors", index.directory, index.count - int(index.offsets[first]))
    return AnnIndex(index, record, ann.graph)


@dataclass
class AnnIndex:
    """An embedding folder's approximate index, loaded (`open_ann`)."""

    vectors: VectorIndex
    record: dict[str, Any]
    graph: Any  # faiss.IndexHNSWFlat

    def search_vectors(self, queries: np.ndarray, top_k: int = 10, ef_search: int | None = None,
                       rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The approximate top-k rows of every query vector: ([Q, k] scores, [Q, k] global rows), best first,
        scored and ordered as `VectorIndex.search_vectors` does (k capped at the number of rows allowed).

        Args:
            queries: [Q, H] float32 query vectors (embedded as the corpus was).
            ef_search: candidates kept while walking the graph (at least k; default: the index's).
            rows: [count] bool, the rows a hit may be (None: every live row); deleted rows never are.
        """
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.vectors.dim:
            raise ConfigError(f"query vectors must be [Q, {self.vectors.dim}], got {list(queries.shape)}")
        check_top_k(top_k)
        allowed = self.vectors.allowed(rows)
        k = min(top_k, self.vectors.count if allowed is None else int(allowed.sum()))
        ef = check_positive(ef_search if ef_search is not None else self.record["ef_search"], "ef_search")
        self.graph.hnsw.efSearch = max(ef, k)  # fewer candidates than k would leave holes in the answer
        if k == 0:
            return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
        if allowed is None:
            scores, found = self.graph.search(queries, k)  # [Q, k] each
        else:  # the walk skips rows not allowed (deleted, filtered out): the top-k of the rows allowed
            faiss = import_faiss()
            bitmap = np.packbits(allowed, bitorder="little")  # faiss: bit i & 7 of byte i >> 3
            chosen = faiss.IDSelectorBitmap(len(allowed), faiss.swig_ptr(bitmap))
            params = faiss.SearchParametersHNSW(sel=chosen, efSearch=max(ef, k))
            scores, found = self.graph.search(queries, k, params=params)
        if (found < 0).any():  # the walk met fewer than k allowed rows (few are): the exact top-k of them
            return self.vectors.search_vectors(queries, top_k, rows=rows)
        return top_k_merge(scores.astype(np.float32), found.astype(np.int64), k)  # exact search's tie order


def ann_problem(index: VectorIndex, record: Any) -> str | None:
    """What makes a folder's `ann.json` and graph file unusable for its shards (another format, built from
    other vectors, a graph file that is not the one built: missing, truncated, another folder's, its vectors
    reordered), or None."""
    if not isinstance(record, dict) or record.get("format") != FORMAT_NAME or record.get("version") != FORMAT_VERSION:
        return f"{ANN_NAME} is not a bertforge approximate index of this version"
    if record.get("shards_key") != shards_key(index.manifest) and appended_from(index, record) is None:
        return (f"the index was built from other vectors than the folder's shards now hold ({record.get('count')} "
                f"then, {index.count} now)")
    return files_problem(index.directory, {graph_name(record): {"sha256": record.get("sha256"),
                                                                "bytes": record.get("bytes")}}, ANN_NAME)


def graph_name(record: dict[str, Any]) -> str:
    """The graph file `ann.json` names (a plain name in the folder)."""
    name = record.get("file")
    return name if isinstance(name, str) and name == Path(name).name and name.startswith("ann-hnsw") else GRAPH_NAME


def appended_from(index: VectorIndex, record: dict[str, Any]) -> int | None:
    """The shards a graph was built from when the folder's later shards were added since (`bertforge add`: the
    graph is extended by them, `extend_graph`), else None."""
    first = record.get("shards")
    if (isinstance(first, int) and 0 < first < len(index.shards)
            and record.get("shards_key") == shards_key(index.manifest, first)):
        return first
    return None


def open_ann(index: VectorIndex) -> AnnIndex | None:
    """The folder's approximate index, None when it has none (no `ann.json`). One that is not what it records
    (`ann_problem`), or that faiss cannot read, is built again from the folder's vectors with the settings it
    recorded (after a log line saying why) and saved in its place; where the folder is read-only, the rebuilt
    graph is used for this search only (with a warning).

    Raises:
        ConfigError: faiss is not installed (the message names the extra, and --exact), or a shard differs
            from its manifest (the vectors themselves are damaged: `index_sources`).
    """
    path = index.directory / ANN_NAME
    try:
        record = storage.read_json(path, what="approximate index record")
        problem = ann_problem(index, record)
    except FileNotFoundError:
        return None
    except ValueError as error:
        record, problem = None, str(error)
    faiss = import_faiss()
    if problem is None:
        name, first = graph_name(record), appended_from(index, record)
        count = index.count if first is None else int(index.offsets[first])
        try:
            graph = faiss.read_index(str(index.directory / name))
        except RuntimeError as error:  # checksum of a file written by another faiss build
            graph, problem = None, f"faiss cannot read {name} ({brief(error)})"
        else:
            if graph.ntotal != count or graph.d != index.dim or graph.metric_type != faiss.METRIC_INNER_PRODUCT:
                problem = (f"{name} holds {graph.ntotal} vectors of {graph.d} dimensions (metric "
                           f"{graph.metric_type}), not the folder's {count} x {index.dim} by inner product")
    if problem is None:
        ann = AnnIndex(index, record, graph)
        return ann if first is None else extend_graph(ann)  # shards added since (`bertforge add`)
    log.warning("%s: %s; building the approximate index again from the folder's vectors", path, problem)
    settings = {name: record[name] if isinstance(record, dict) and isinstance(record.get(name), int) else default
                for name, default in (("m", DEFAULT_M), ("ef_construction", DEFAULT_EF_CONSTRUCTION),
                                      ("ef_search", DEFAULT_EF_SEARCH))}
    graph, record = build_graph(index, settings)
    try:
        save_ann(index, graph, record)
    except OSError as error:
        log.warning("%s: the rebuilt index could not be saved (%s); it is rebuilt at each search until `bertforge "
                    "index --index %s` can write the folder", index.directory, error, index.directory)
    return AnnIndex(index, record, graph)


__all__ = ["ANN_NAME", "DEFAULT_EF_SEARCH", "GRAPH_NAME", "AnnIndex", "build_ann", "open_ann", "read_ann_record",
           "shards_key", "sweep_graphs"]
