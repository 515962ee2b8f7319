"""The vector folder: the one on-disk format `bertforge embed` writes and every index, search, map and miner
reads (docs/retrieval.md). This is the only module that names a shard file or reads a manifest.

Owns: the file names (`SHARD_FILES`, `PROGRESS_NAME`, `MANIFEST_NAME`), the manifest (its identity, what a
resume must match: `identity`, `describe_changes`; reading it, old versions included: `read_manifest`), the
settings that made the vectors (`EmbedSettings`, defined in `embed_settings`: what the manifest stores), what is finished (`finished`), writing
a shard (`write_shard`: dense float, int8 or binary codes, sparse rows, or multi-vector rows: `TokenRows`) and the
finished folder opened for reading (`VectorFolder`: shards memory-mapped, per-row lines, metadata and sparse rows
read back, each shard file held to the size and sha256 its manifest records: `check_shard_sizes`,
`verify_shard_file`).

Layout of a folder: `manifest.json`; per shard `vectors-00000.npy` ([n, D], record order; binary shards also
`codes-00000.npy`, their int8 codes; sparse shards `indptr-`, `terms-` and `weights-00000.npy`, compressed rows;
multi-vector shards `offsets-00000.npy` ([n + 1] int64) and `multivectors-00000.npy` ([M, D], every row's token
vectors one row after another: row i's are multivectors[offsets[i]:offsets[i+1]]),
`ids-00000.jsonl` (JSON strings), `spans-00000.jsonl` (chunked runs: [record, start, end] of each row),
`fields-00000.parquet` (`embed --field`: each row's metadata fields, Apache Parquet; the manifest's "fields"
lists their names and types, `fields`; `VectorFolder.metadata`, which `filters` evaluate), then
`progress/shard-00000.json` (count, tokens, sizes, sha256), each written atomically (`storage`): a shard is done
when its record exists and the sizes match. The manifest says "complete": false until every shard's record is in
it. Indexes built over a folder (`vector_ann`, `token_index`, `sparse_search`'s inverted index) keep their own files beside
it. A finished folder changed by `folder_growth` (`bertforge add`, `delete`, `compact`) gains shards under new numbers
(a "source": the input of their addition, in "additions"; compacted shards list each row's record in `records-`),
its deleted rows in `tombstones-00001.npy` (one file a "generation"; `VectorFolder.live`), each change committed
by one manifest write.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np

from bertforge import storage
from bertforge.checkpoint_format import model_fingerprint
from bertforge.data.corpus_records import CorpusSettings, SourceFile
from bertforge.errors import ConfigError, InputError
from bertforge.inference.wire_inputs import AUTO_TRUNCATE
from bertforge.metrics.sparse import SparseRows
from bertforge.retrieval.embed_settings import DTYPES, EmbedSettings
from bertforge.retrieval.fields import FieldSpec, fields_of, joined_metadata, parquet_bytes, read_parquet
from bertforge.retrieval.token_rows import TokenRows
from bertforge.retrieval.vector_quantization import coded

MANIFEST_NAME = "manifest.json"
PROGRESS_DIR = "progress"
PROGRESS_NAME = "shard-{:05d}.json"  # .format(shard index)
PROGRESS_FILE = re.compile(r"^shard-\d{5}\.json$")
FORMAT_NAME = "bertforge-embeddings"
# 2: the manifest holds "settings" (`EmbedSettings`); version 1 folders (their settings spread over "kind",
# "dtype", "chunking" and "embedding") still read, and resume.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
# kind in a shard record -> its file name (.format(shard index))
SHARD_FILES = {
    "vectors": "vectors-{:05d}.npy",
    "codes": "codes-{:05d}.npy",  # binary shards: the int8 codes that rescore their candidates
    "indptr": "indptr-{:05d}.npy",  # sparse shards: [n + 1] int64, row i's entries are indptr[i]:indptr[i+1]
    "terms": "terms-{:05d}.npy",  # int32 term ids, ascending within a row
    "weights": "weights-{:05d}.npy",  # float32, > 0
    "offsets": "offsets-{:05d}.npy",  # multi-vector shards: [n + 1] int64, row i's tokens are offsets[i]:offsets[i+1]
    "multivectors": "multivectors-{:05d}.npy",  # [M, D] float32 or float16, every row's token vectors in row order
    "ids": "ids-{:05d}.jsonl",
    "spans": "spans-{:05d}.jsonl",  # chunked runs: [record, start, end] of each row (its record's characters)
    "records": "records-{:05d}.jsonl",  # compacted shards of unchunked folders: each row's record in its input
    "fields": "fields-{:05d}.parquet",  # `embed --field`: each row's metadata (`fields`), Apache Parquet
}
# The rows deleted (or replaced) since the folder was embedded: sorted int64 global rows, one file per
# generation (.format(generation)), so that a change never rewrites the file the manifest in force names.
TOMBSTONES_NAME = "tombstones-{:05d}.npy"
SPARSE_KINDS = ("indptr", "terms", "weights")


def embed_settings(manifest: dict[str, Any]) -> EmbedSettings:
    """The settings a manifest records: its "settings" (version 2), else gathered from a version 1 manifest's
    "kind", "dtype", "chunking" and "embedding"."""
    if "settings" in manifest:
        known = {f.name for f in fields(EmbedSettings)}
        return EmbedSettings(**{k: v for k, v in manifest["settings"].items() if k in known})
    embedding, chunking = manifest["embedding"], manifest.get("chunking") or {}
    sparse = manifest.get("kind", "dense") == "sparse"
    return EmbedSettings(pooling=embedding.get("pooling"), normalize=None if sparse else embedding.get("normalize"),
                         prompt=embedding.get("prompt"), dtype=manifest["dtype"], sparse=sparse,
                         max_terms=embedding.get("max_terms") if sparse else None, chunk=chunking.get("chunk"),
                         chunk_overlap=chunking.get("chunk_overlap") if chunking else None,
                         late_chunking=bool(chunking.get("late", False)),
                         truncate=manifest.get("truncate", AUTO_TRUNCATE))


def progress_path(out: Path, index: int) -> Path:
    """The record that says shard `index` of a folder of resumable parts is done."""
    return out / PROGRESS_DIR / PROGRESS_NAME.format(index)


# --- the manifest --------------------------------------------------------------------------------------------

def identity(manifest: dict[str, Any]) -> dict[str, Any]:
    """What a resume must match: the model's files, the settings and model options, the shard size, how the input
    is read and the input files themselves (the batch size and device may change: they move vectors only by
    float rounding). A version 1 manifest of the same run has the same identity."""
    return {"format": manifest["format"], "model": manifest["model"]["fingerprint"],
            "settings": asdict(embed_settings(manifest)), "embedding": manifest["embedding"],
            "shard_size": manifest["shard_size"], "input settings": manifest["input"]["settings"],
            "input files": manifest["input"]["files"], "fields": manifest.get("fields", [])}


def describe_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Plain phrases for the identity keys that differ between a manifest and this run."""
    changes = []
    for key, was in identity(old).items():
        now = identity(new)[key]
        if was == now:
            continue
        if key == "model":
            changes.append(f"another model (the folder's was {old['model']['path']})")
        elif key == "fields":
            changes.append(f"--field {list(map(str, fields_of(old)))} -> {list(map(str, fields_of(new)))}")
        elif key == "input files":
            before, after = ({f["name"]: f for f in files} for files in (was, now))
            names = sorted(set(before) ^ set(after)) or [n for n in after if before[n] != after[n]]
            changes.append(f"the input files changed ({', '.join(names[:3])})")
        elif isinstance(was, dict):
            changes += [f"{name} {was.get(name)!r} -> {now.get(name)!r}" for name in sorted(set(was) | set(now))
                        if was.get(name) != now.get(name)]
        else:
            changes.append(f"{key} {was!r} -> {now!r}")
    return list(dict.fromkeys(changes))  # pooling, normalize, prompt: in the settings and the model's options


def new_manifest(model_dir: str | os.PathLike, settings: EmbedSettings, embedding: dict[str, Any], dim: int,
                 inputs: str | os.PathLike, sources: Sequence[SourceFile], corpus: CorpusSettings,
                 shard_size: int, metadata: Sequence[FieldSpec] = ()) -> dict[str, Any]:
    """The manifest of a run before any shard: its identity, "complete": false.

    Args:
        settings: the run's settings, resolved (pooling and normalize the model's where not given; `prompt` the
            prefix itself).
        embedding: the pipeline's options that make the vectors (pooling, normalize, layer or the sparse ones),
            the prompt, the window (`max_length`) and the precision: what the queries are embedded with.
        dim: the width of a vector (a sparse one's: the vocabulary's).
        metadata: the fields stored per record (`embed --field`), listed as "fields" (none: no such key).
    """
    return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "complete": False,
            "model": {"path": str(Path(model_dir).resolve()), "fingerprint": model_fingerprint(model_dir)},
            "kind": settings.kind, "settings": asdict(settings), "embedding": embedding,
            "similarity": "maxsim" if settings.multi_vector else "dot" if settings.sparse or not embedding["normalize"]
            else "cosine",
            "dim": dim, "dtype": settings.dtype, "shard_size": shard_size,
            "input": input_record(inputs, sources, corpus),
            **({"fields": [spec.record() for spec in metadata]} if metadata else {}),
            "count": None, "tokens": None, "truncated": None, "shards": []}


def input_record(inputs: str | os.PathLike, sources: Sequence[SourceFile], corpus: CorpusSettings) -> dict[str, Any]:
    """What a manifest records of an input ("input", or one of "additions"): its path, each file's name, size
    and mtime, and how it was read (what --show-text reads again, refusing a file that changed)."""
    stats = [(source.name, source.path.stat()) for source in sources]
    files = [{"name": name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns} for name, stat in stats]
    # absolute, not resolved: the files are named as the user named them (a symlinked input keeps its name, which
    # --show-text looks up again)
    return {"path": str(Path(inputs).absolute()), "files": files,
            "settings": {**asdict(corpus), "single_file": Path(inputs).is_file()}}


def read_manifest(out: Path) -> dict[str, Any] | None:
    """The folder's manifest (version 1 or 2), None when it has none."""
    try:
        manifest = storage.read_json(out / MANIFEST_NAME, what="embedding manifest")
    except FileNotFoundError:
        return None
    except ValueError as error:
        raise ConfigError(f"{error}; delete the folder to start over") from None
    try:
        if manifest["format"] != FORMAT_NAME or manifest["version"] not in READABLE_VERSIONS:
            raise KeyError("version")
        identity(manifest)
    except (KeyError, TypeError, ConfigError):
        raise ConfigError(f"{out / MANIFEST_NAME} is not a bertforge embedding manifest (of this version); "
                          "choose another folder") from None
    return manifest


def start_output(out: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Check the output folder against this run and prepare it (rank 0, before any rank writes): a new
    folder gets the manifest, a folder of the same run loses the temporary files a killed run left behind.

    Returns:
        The manifest in force: the folder's own when it is complete and all its shards are present.

    Raises:
        ConfigError: the folder holds another run's vectors (the message says what differs) or other files.
    """
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file; --out names the folder to write the shards into")
    out.mkdir(parents=True, exist_ok=True)
    existing = read_manifest(out)
    if existing is None:
        foreign = [p.name for p in out.iterdir() if not storage.TEMPORARY_NAME.match(p.name)]
        if foreign:
            raise ConfigError(f"{out} is not empty ({', '.join(sorted(foreign)[:3])} ...) and holds no "
                              f"{MANIFEST_NAME}; choose a new or empty --out folder")
    else:
        changes = describe_changes(existing, manifest)
        if changes:
            raise ConfigError(f"{out} holds vectors made differently ({'; '.join(changes)}); rerun with the same "
                              "model, options and input to resume, or choose another --out (or delete the folder) "
                              "to start over")
        if existing["complete"] and all(finished(out, shard["index"]) for shard in existing["shards"]):
            return existing
    for folder in (out, out / PROGRESS_DIR):  # a killed run's half-written files; their shards are redone
        if folder.is_dir():
            storage.remove_stale_temporaries(folder)
    storage.write_json(out / MANIFEST_NAME, manifest)
    return manifest


def finished(out: Path, index: int) -> dict[str, Any] | None:
    """The record of shard `index` when it is done (record present, every file of its recorded size)."""
    try:
        record = json.loads(progress_path(out, index).read_text(encoding="utf-8"))
        for kind in record["bytes"]:
            if (out / record[kind]).stat().st_size != record["bytes"][kind]:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record


def shard_error(directory: Path, shard: dict[str, Any], kind: str, problem: str) -> ConfigError:
    """The one error of a shard file that is not what the manifest records, with the way to rewrite it."""
    progress = progress_path(directory, shard["index"])
    return ConfigError(f"{directory / shard[kind]}: {problem}; the folder's vectors are not the ones `bertforge "
                       f"embed` wrote: delete {progress} and rerun the same `bertforge embed` command to rewrite "
                       "that shard")


def check_shard_sizes(directory: Path, manifest: dict[str, Any]) -> None:
    """Every file of every shard is present with the size the manifest records (no hashing: a stat each).

    Raises:
        ConfigError: a shard file is missing or of another size (truncated, or another folder's), naming it.
    """
    for shard in manifest["shards"]:
        for kind, size in shard["bytes"].items():
            path = directory / shard[kind]
            try:
                actual = path.stat().st_size
            except FileNotFoundError:
                raise shard_error(directory, shard, kind, f"missing, though {MANIFEST_NAME} lists it") from None
            if actual != size:
                raise shard_error(directory, shard, kind, f"{actual} bytes, but {size} were written (truncated or "
                                  "replaced)")


def verify_shard_file(directory: Path, shard: dict[str, Any], kind: str) -> Path:
    """The path of shard file `kind` of `shard` (a manifest entry) after comparing its sha256 with the one the
    manifest records (nothing to compare for an entry without one; skipped with BERTFORGE_SKIP_CHECKSUM=1).
    sha256 reads a file once more (about 0.5 GB/s a core on the shared 2-core test machine): an open folder
    hashes each file once, the first time it reads it, never per query.

    Raises:
        ConfigError: the file differs (rows reordered or rewritten, another folder's file copied in).
    """
    path = directory / shard[kind]
    sha256 = shard.get("sha256", {}).get(kind)
    if sha256 is not None and not storage.checksums_skipped():
        problem = storage.file_differs(path, {"sha256": sha256, "bytes": shard["bytes"][kind]}, MANIFEST_NAME)
        if problem is not None:
            raise shard_error(directory, shard, kind, problem)
    return path


def sparse_arrays(rows: SparseRows) -> dict[str, np.ndarray]:
    """The arrays one sparse shard stores: {"indptr", "terms", "weights"}."""
    return {"indptr": rows.indptr.astype(np.int64), "terms": rows.indices.astype(np.int32),
            "weights": rows.values.astype(np.float32)}


def token_arrays(rows: TokenRows, dtype: str) -> dict[str, np.ndarray]:
    """The arrays one multi-vector shard stores: {"offsets", "multivectors"} (the vectors in `dtype`)."""
    return {"offsets": rows.offsets.astype(np.int64),
            "multivectors": np.ascontiguousarray(rows.tokens, dtype=dtype)}


def write_shard(out: Path, index: int, ids: Sequence[str], vectors: np.ndarray | SparseRows | TokenRows, dtype: str,
                tokens: int, calibration: dict[str, Any] | None = None,
                spans: Sequence[Sequence[int]] | None = None, truncated: int = 0, metadata: Any = None,
                **extra: Any) -> dict[str, Any]:
    """Write one shard's vectors (coded as `dtype`: `vector_quantization.coded`; a binary shard also its int8
    codes; sparse rows as `sparse_arrays`; multi-vector rows as `token_arrays`), then its ids (and `metadata`), then
    its record (each atomically, the record with its texts cut to the window, `truncated`, and `extra` keys:
    `write_shard_arrays`); return the record."""
    if isinstance(vectors, TokenRows):
        arrays = token_arrays(vectors, dtype)
    else:
        arrays = sparse_arrays(vectors) if isinstance(vectors, SparseRows) else coded(vectors, dtype, calibration)
    return write_shard_arrays(out, index, arrays, ids, tokens, spans, truncated=truncated, metadata=metadata,
                              **extra)


def write_shard_arrays(out: Path, index: int, arrays: dict[str, np.ndarray], ids: Sequence[str], tokens: int,
                       spans: Sequence[Sequence[int]] | None = None, records: Sequence[int] | None = None,
                       truncated: int = 0, metadata: Any = None, **extra: Any) -> dict[str, Any]:
    """Write one shard's stored arrays as they are (`SHARD_FILES` kinds: "vectors", "codes" or the sparse ones),
    its ids, spans, `records` (each row's record in its input, where rows are not consecutive records) and
    `metadata` (a pyarrow Table of its rows' fields, `fields.shard_metadata`: one Parquet file), then its record
    with `extra` keys ("source", "first_record": `VectorFolder.records_at`), each file atomically."""
    data = {}
    for kind, array in arrays.items():
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        data[kind] = buffer.getvalue()
    data["ids"] = "".join(json.dumps(ident, ensure_ascii=False) + "\n" for ident in ids).encode("utf-8")
    if spans is not None:
        data["spans"] = "".join(json.dumps(list(span)) + "\n" for span in spans).encode("utf-8")
    if records is not None:
        data["records"] = "".join(f"{int(record)}\n" for record in records).encode("utf-8")
    if metadata is not None:
        if metadata.num_rows != len(ids):
            raise ValueError(f"shard {index}: {metadata.num_rows} rows of metadata for {len(ids)} vectors")
        data["fields"] = parquet_bytes(metadata)
    names = {kind: SHARD_FILES[kind].format(index) for kind in data}
    for kind, payload in data.items():
        storage.write_bytes(out / names[kind], payload)
    record = {"index": index, **names, "count": len(ids), "tokens": tokens, "truncated": truncated,
              "bytes": {kind: len(payload) for kind, payload in data.items()},
              "sha256": {kind: hashlib.sha256(payload).hexdigest() for kind, payload in data.items()}, **extra}
    if "indptr" in arrays:
        record["nonzero"] = int(arrays["indptr"][-1])  # stored terms, all texts together
    if "offsets" in arrays:
        record["vector_count"] = int(arrays["offsets"][-1])  # stored token vectors, all texts together
    storage.write_json(progress_path(out, index), record)
    return record


def finish_output(out: Path, manifest: dict[str, Any], shards: int) -> dict[str, Any]:
    """The final manifest (rank 0, once every rank is done): every shard's record, read back from disk.

    Raises:
        ConfigError: a shard is missing (on several nodes: the folder is not on a filesystem they share).
    """
    records = [finished(out, index) for index in range(shards)]
    missing = [index for index, record in enumerate(records) if record is None]
    if missing:
        raise ConfigError(f"{out}: shards {missing[:5]} are missing after every rank finished; on several nodes "
                          "--out must be a folder every node sees (a shared filesystem); rerun to finish them")
    final = {**manifest, "complete": True, "count": sum(r["count"] for r in records),
             "tokens": sum(r["tokens"] for r in records),
             "truncated": sum(r.get("truncated", 0) for r in records), "shards": records}
    storage.write_json(out / MANIFEST_NAME, final)
    return final


# --- changing a finished folder (`folder_growth`) -------------------------------------------------------------

# The files a manifest names, by name: what `folder_growth.sweep_folder` removes once no manifest names them.
SHARD_FILE = re.compile(r"^(?:{})-\d{{5}}\.(?:npy|jsonl|parquet)$".format("|".join(SHARD_FILES)))
TOMBSTONES_FILE = re.compile(r"^tombstones-\d{5}\.npy$")


def write_tombstones(out: Path, generation: int, rows: np.ndarray) -> dict[str, Any] | None:
    """Write the deleted rows of generation `generation` (sorted, unique int64 global rows) atomically under
    their own name; return the manifest's "tombstones" entry (None when no row is deleted)."""
    rows = np.unique(np.asarray(rows, dtype=np.int64))
    if not len(rows):
        return None
    buffer = io.BytesIO()
    np.save(buffer, rows, allow_pickle=False)
    payload = buffer.getvalue()
    name = TOMBSTONES_NAME.format(generation)
    storage.write_bytes(out / name, payload)
    return {"file": name, "count": len(rows), "bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}


def read_tombstones(out: Path, manifest: dict[str, Any]) -> np.ndarray:
    """The folder's deleted rows (sorted int64 global rows; none for a folder never changed).

    Raises:
        ConfigError: the tombstones file the manifest names is missing or not the one written.
    """
    entry = manifest.get("tombstones")
    if not entry:
        return np.zeros(0, np.int64)
    path = out / entry["file"]
    try:
        payload = path.read_bytes()
        if len(payload) != entry["bytes"] or hashlib.sha256(payload).hexdigest() != entry["sha256"]:
            raise ValueError("not the file written")
        rows = np.load(io.BytesIO(payload), allow_pickle=False)
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path}: the folder's deleted rows are unreadable ({error}); the folder's changes cannot "
                          "be told apart: embed it again") from None
    return rows.astype(np.int64)


# --- reading a finished folder ---------------------------------------------------------------------------------

class VectorFolder:
    """A complete vector folder, opened for reading (nothing is loaded until a shard is asked for).

    Args:
        directory: the `--out` folder of `bertforge embed`.

    Every shard file is checked against the manifest: its size at open (`check_shard_sizes`), its sha256 the
    first time this folder reads it (`shard_path`): a shard rewritten or copied in is refused, never read.

    Raises:
        ConfigError: no manifest, an unfinished run, or a shard file missing or of another size.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        manifest = read_manifest(self.directory) if self.directory.is_dir() else None
        if manifest is None:
            raise ConfigError(f"{self.directory}: no {MANIFEST_NAME}; give the folder `bertforge embed --out` wrote")
        if not manifest["complete"]:
            raise ConfigError(f"{self.directory}: the embedding run has not finished; rerun the same `bertforge "
                              "embed` command to complete it")
        check_shard_sizes(self.directory, manifest)
        self.verified: set[tuple[int, str]] = set()
        self.manifest = manifest
        self.settings = embed_settings(manifest)
        self.shards: list[dict[str, Any]] = manifest["shards"]
        self.offsets = np.cumsum([0] + [shard["count"] for shard in self.shards])  # global row of each shard
        self.count = int(self.offsets[-1])
        self.dim = int(manifest["dim"])
        self.deleted = read_tombstones(self.directory, manifest)  # rows deleted or replaced since embedding
        self.live_count = self.count - len(self.deleted)
        self._live: np.ndarray | None = None
        self.fields = fields_of(manifest)  # the metadata stored per record (`embed --field`)
        self._metadata: Any = None

    @property
    def kind(self) -> str:
        """"dense" (vectors), "sparse" (`bertforge embed --sparse`: compressed rows of term weights) or
        "multi-vector" (`bertforge embed --multi-vector`: `TokenRows`, a ColBERT model's vectors per token)."""
        return self.settings.kind

    @property
    def similarity(self) -> str:
        """"cosine" (the vectors are normalized) or "dot"."""
        return self.manifest["similarity"]

    @property
    def chunked(self) -> bool:
        """Whether a row is a chunk of its record (`embed --chunk`), with its characters in the spans files."""
        return self.settings.chunk is not None

    @property
    def live(self) -> np.ndarray | None:
        """[count] bool: the rows a search may return (False: deleted or replaced); None when none is deleted."""
        if self._live is None and len(self.deleted):
            self._live = np.ones(self.count, dtype=bool)
            self._live[self.deleted] = False
        return self._live

    def allowed(self, rows: np.ndarray | None = None) -> np.ndarray | None:
        """[count] bool: the live rows that are also among `rows` ([count] bool; None: all); None: every row."""
        return self.live if rows is None else rows if self.live is None else rows & self.live

    def shard_metadata(self, index: int) -> Any:
        """Shard `index`'s metadata: a pyarrow Table, one column per field (`fields`), one row per vector row
        (a chunk's row holds its record's values; null where a record has none).

        Raises:
            ConfigError: the folder stores no fields, or the file is unreadable or holds other fields.
        """
        if not self.fields:
            raise ConfigError(f"{self.directory} stores no metadata fields; embed with --field NAME[:TYPE]")
        try:
            return read_parquet(self.shard_path(index, "fields"), self.fields, self.shards[index]["count"])
        except ValueError as error:
            raise shard_error(self.directory, self.shards[index], "fields", f"unreadable ({error})") from None

    def metadata(self) -> Any:
        """Every row's metadata (deleted rows included), as one pyarrow Table in global row order, read once
        and kept (`shard_metadata`)."""
        if self._metadata is None:
            self._metadata = joined_metadata([self.shard_metadata(i) for i in range(len(self.shards))], self.fields)
        return self._metadata

    def input_of(self, source: int) -> dict[str, Any]:
        """The manifest with the "input" its rows of `source` were read from (0: the embedded input, k: the k-th
        `bertforge add`'s), for `vector_texts.record_texts`."""
        return self.manifest if source == 0 else {**self.manifest, "input": self.manifest["additions"][source - 1]}

    def records_at(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, record) of global rows [Q, k]: which input each row's record was read from (`input_of`)
        and its place there (0-based): the spans of a chunked folder, the records file of a compacted shard,
        else the shard's first record plus the row's place in it."""
        rows = np.asarray(rows, dtype=np.int64)
        flat, shard_of = rows.ravel(), np.searchsorted(self.offsets, rows.ravel(), side="right") - 1
        sources = np.array([self.shards[s].get("source", 0) for s in shard_of.tolist()], dtype=np.int64)
        if self.chunked:
            records = np.array([span[0] for span in self.spans_at(flat[None, :])[0]], dtype=np.int64)
        else:
            firsts = [self.shards[s].get("first_record", int(self.offsets[s])) for s in shard_of.tolist()]
            records = np.asarray(firsts, dtype=np.int64) + flat - self.offsets[shard_of]
            listed = np.array(["records" in self.shards[s] for s in shard_of.tolist()], dtype=bool)
            if listed.any():
                records[listed] = self.lines_at(flat[listed][None, :], "records")[0]
        return sources.reshape(rows.shape), records.reshape(rows.shape)

    def shard_lines(self, index: int, kind: str) -> list[Any]:
        """Every JSON line of shard `index`'s `kind` file ("ids", "spans", "records")."""
        with open(self.shard_path(index, kind), encoding="utf-8") as handle:
            return [json.loads(line) for line in handle]

    def shard_arrays(self, index: int) -> dict[str, np.ndarray]:
        """Shard `index`'s stored arrays as `write_shard_arrays` takes them: "vectors" (and a binary shard's
        "codes"), or the sparse rows' "indptr", "terms", "weights"."""
        if self.kind == "sparse":
            return sparse_arrays(self.shard_rows(index))
        if self.kind == "multi-vector":
            rows = self.shard_token_rows(index)
            return token_arrays(rows, str(rows.tokens.dtype))
        return {kind: np.asarray(self.shard_vectors(index, kind)) for kind in ("vectors", "codes")
                if kind in self.shards[index]}

    def shard_path(self, index: int, kind: str) -> Path:
        """Shard `index`'s `kind` file, its sha256 compared with the manifest's the first time this folder
        reads it (`verify_shard_file`)."""
        if (index, kind) not in self.verified:
            verify_shard_file(self.directory, self.shards[index], kind)
            self.verified.add((index, kind))
        return self.directory / self.shards[index][kind]

    def shard_vectors(self, index: int, kind: str = "vectors") -> np.ndarray:
        """Shard `index`'s stored vectors (float [n, H], int8 codes [n, H] or sign bits [n, H / 8]; `kind`
        "codes": a binary shard's int8 codes), memory-mapped (read from disk as they are used)."""
        return np.load(self.shard_path(index, kind), mmap_mode="r", allow_pickle=False)

    def shard_rows(self, index: int) -> SparseRows:
        """The rows of one sparse shard, checked against its record."""
        record = self.shards[index]
        try:
            arrays = {kind: np.load(self.shard_path(index, kind), allow_pickle=False) for kind in SPARSE_KINDS}
            rows = SparseRows(arrays["indptr"], arrays["terms"], arrays["weights"], self.dim)
        except (OSError, ValueError, KeyError, InputError) as error:
            raise ConfigError(f"{self.directory}: sparse shard {record.get('index')} is unreadable ({error}); rerun "
                              "`bertforge embed --sparse` to rewrite it") from None
        if len(rows) != record["count"]:
            raise ConfigError(f"{self.directory}: sparse shard {record['index']} holds {len(rows)} rows, its record "
                              f"says {record['count']}; rerun `bertforge embed --sparse` to rewrite it")
        return rows

    def shard_token_rows(self, index: int) -> TokenRows:
        """The rows of one multi-vector shard (tokens memory-mapped), checked against its record."""
        record = self.shards[index]
        try:
            return TokenRows.checked(np.load(self.shard_path(index, "offsets"), allow_pickle=False),
                                     np.load(self.shard_path(index, "multivectors"), mmap_mode="r", allow_pickle=False),
                                     record["count"], self.dim)
        except (OSError, ValueError, KeyError) as error:
            raise ConfigError(f"{self.directory}: multi-vector shard {record.get('index')} is unreadable ({error}); "
                              "rerun `bertforge embed --multi-vector` to rewrite it") from None

    def checksums(self, kinds: Sequence[str]) -> list[list[str]]:
        """Each shard's recorded sha256 of its `kinds` files, in shard order (what an index is built from)."""
        return [[shard["sha256"][kind] for kind in kinds] for shard in self.shards]

    def ids_at(self, rows: np.ndarray) -> list[list[str]]:
        """The ids of global rows [Q, k], reading only the ids files that hold one of them."""
        return self.lines_at(rows, "ids")

    def spans_at(self, rows: np.ndarray) -> list[list[list[int]]]:
        """[record, start, end] of global rows [Q, k] of an `embed --chunk` folder (its spans files)."""
        return self.lines_at(rows, "spans")

    def lines_at(self, rows: np.ndarray, kind: str) -> list[list[Any]]:
        """The JSON lines of global rows [Q, k] in the shards' `kind` files, reading only those that hold one."""
        wanted = sorted({int(row) for row in np.asarray(rows).ravel()})
        found: dict[int, str] = {}
        shard_of = np.searchsorted(self.offsets, wanted, side="right") - 1
        for shard in sorted(set(shard_of.tolist())):
            needed = {row - int(self.offsets[shard]) for row, s in zip(wanted, shard_of) if s == shard}
            with open(self.shard_path(shard, kind), encoding="utf-8") as handle:
                for line_index, line in enumerate(handle):
                    if line_index in needed:
                        found[line_index + int(self.offsets[shard])] = json.loads(line)
        return [[found[int(row)] for row in query_rows] for query_rows in np.asarray(rows)]


__all__ = ["DTYPES", "FORMAT_VERSION", "MANIFEST_NAME", "SHARD_FILES", "TOMBSTONES_NAME", "EmbedSettings", "TokenRows",
           "VectorFolder", "check_shard_sizes", "describe_changes", "embed_settings",
           "finish_output", "finished", "identity", "input_record", "new_manifest", "progress_path", "read_manifest",
           "read_tombstones", "start_output", "verify_shard_file", "write_shard", "write_shard_arrays",
           "write_tombstones"]
