"""Changing a finished vector folder in place: records added or replaced (`add_records`: only the new records
are embedded, into new shards), records deleted (`delete_records`) and the deleted rows dropped for good
(`compact_folder`), by id (docs/retrieval.md, "Adding and deleting records").

Owns: the three changes and the rule that an addition is embedded exactly as the folder was (the same model,
`EmbedSettings`, window and precision: a difference is one ConfigError naming it, before any text is embedded).
The files are `store`'s: new shards under new shard numbers, the deleted rows as a tombstones file of the next
generation, then the manifest (`store.commit_manifest`), the one commit point: a process killed at any moment
leaves the old folder or the new one, and the next change sweeps what a dead one left. Searches honour the
tombstones (every kind masks deleted rows before its top-k); the indexes beside the shards follow: the
approximate index gets the added vectors (`vector_ann.open_ann` extends it, as `token_index` does a multi-vector
folder's), the inverted index is built again from the shards, and a compaction rebuilds them all.

One change at a time: a lock file beside the manifest (`LOCK_NAME`) refuses a second one.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from bertforge import storage
from bertforge.data.corpus_records import read_records, shard_chunks, source_files
from bertforge.engine.build import DEFAULT_KIND
from bertforge.errors import ConfigError, DataError
from bertforge.inference import pipelines
from bertforge.retrieval.embed_corpus import embed_shard, first_manifest, rows_metadata
from bertforge.retrieval.fields import FieldSpec, joined_metadata, parse_fields, record_values
from bertforge.retrieval.multi_vector_search import MULTI_VECTOR_TASK
from bertforge.retrieval.sparse_search import SparseIndex
from bertforge.retrieval.sparse_vectors import SPARSE_TASK
from bertforge.retrieval.store import (
    MANIFEST_NAME,
    PROGRESS_DIR,
    PROGRESS_FILE,
    PROGRESS_NAME,
    SHARD_FILE,
    TOMBSTONES_FILE,
    EmbedSettings,
    VectorFolder,
    describe_changes,
    input_record,
    write_shard,
    write_shard_arrays,
    write_tombstones,
)
from bertforge.retrieval.token_index import update_token_index
from bertforge.retrieval.vector_ann import build_ann, open_ann, read_ann_record, sweep_graphs
from bertforge.retrieval.vector_index import VectorIndex
from bertforge.retrieval.vector_texts import input_settings

log = logging.getLogger(__name__)

LOCK_NAME = ".change.lock"


@contextmanager
def changing(directory: str | os.PathLike) -> Iterator[VectorFolder]:
    """The folder, opened under its change lock, after sweeping what a killed change left.

    Raises:
        ConfigError: another change holds the folder, or it is not a finished vector folder.
    """
    folder = VectorFolder(directory)
    with open(folder.directory / LOCK_NAME, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{folder.directory} is being changed by another `bertforge add`, `delete` or "
                              "`compact`; wait for it to finish") from None
        folder = VectorFolder(directory)  # the manifest in force now that no other change runs
        swept = sweep_folder(folder.directory, folder.manifest) + sweep_graphs(folder.directory)
        if swept:
            log.info("%s: removed %d files of an interrupted change", folder.directory, len(swept))
        yield folder


def live_rows_of(folder: VectorFolder, ids: set[str]) -> dict[str, list[int]]:
    """The live global rows of each of `ids` found in the folder (several for a chunked record or an id given
    twice), reading every ids file once."""
    found: dict[str, list[int]] = {}
    live = folder.live
    for shard in range(len(folder.shards)):
        for row, ident in enumerate(folder.shard_lines(shard, "ids"), start=int(folder.offsets[shard])):
            if ident in ids and (live is None or live[row]):
                found.setdefault(ident, []).append(row)
    return found


def next_manifest(folder: VectorFolder, **changes: Any) -> dict[str, Any]:
    """The folder's manifest one generation on, with `changes` (shards, tombstones, additions...) and the row
    count of its shards."""
    manifest = {**folder.manifest, "generation": int(folder.manifest.get("generation", 0)) + 1, **changes}
    manifest["count"] = sum(shard["count"] for shard in manifest["shards"])
    if not manifest.get("tombstones"):
        manifest.pop("tombstones", None)
    return manifest


def tombstones_with(folder: VectorFolder, rows: Sequence[int]) -> dict[str, Any] | None:
    """The "tombstones" entry of the next generation: the folder's deleted rows plus `rows` (the entry in force
    when `rows` adds none)."""
    deleted = np.union1d(folder.deleted, np.asarray(rows, dtype=np.int64))
    if len(deleted) == len(folder.deleted):
        return folder.manifest.get("tombstones")
    return write_tombstones(folder.directory, int(folder.manifest.get("generation", 0)) + 1, deleted)


def update_indexes(directory: Path, rebuild: bool = False) -> None:
    """After a commit: the approximate index of a dense folder extended by its new shards (or, `rebuild`, built
    again from the compacted ones with its recorded settings), the inverted index of a sparse one built again."""
    folder = VectorIndex(directory)
    try:
        if folder.kind == "sparse":
            SparseIndex(directory).inverted()
            return
        if folder.kind == "multi-vector":
            update_token_index(directory, rebuild)
            return
        record = read_ann_record(directory)
        if record is None:
            return
        if rebuild:
            build_ann(directory, m=record["m"], ef_construction=record["ef_construction"],
                      ef_search=record["ef_search"])
        else:
            open_ann(folder)
    except ConfigError as error:  # the change is committed: the index is the next search's to refuse or rebuild
        log.warning("%s: the index beside the shards was not updated (%s)", directory, error)


def commit_manifest(out: Path, manifest: dict[str, Any]) -> None:
    """The commit point of a change to a finished folder: its new manifest, written atomically (every file it
    names was written before); then the files no manifest names any more go (`sweep_folder`). A process killed
    before the rename leaves the old manifest in force, after it the new one."""
    storage.write_json(out / MANIFEST_NAME, manifest)
    sweep_folder(out, manifest)


def sweep_folder(out: Path, manifest: dict[str, Any]) -> list[str]:
    """Remove the shard files, shard records and tombstones of a finished folder that its manifest does not name
    (an interrupted change's, or the shards a compaction replaced), and the temporary files that dead writers
    left (this process's too: it holds the change lock and writes nothing else now); return the names removed.
    Indexes built beside the shards keep their own files."""
    named = {shard[kind] for shard in manifest["shards"] for kind in shard["bytes"]}
    records = {PROGRESS_NAME.format(shard["index"]) for shard in manifest["shards"]}
    if manifest.get("tombstones"):
        named.add(manifest["tombstones"]["file"])
    removed = []
    for folder, keep, pattern in ((out, named, None), (out / PROGRESS_DIR, records, PROGRESS_FILE)):
        for path in folder.iterdir() if folder.is_dir() else ():
            name, temporary = path.name, storage.TEMPORARY_NAME.match(path.name)
            if temporary is not None:
                pid = int(temporary["pid"])
                if pid != os.getpid() and storage.process_alive(pid):
                    continue  # a search saving an index it built, still running
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            elif name not in keep and (pattern.match(name) if pattern else
                                       SHARD_FILE.match(name) or TOMBSTONES_FILE.match(name)):
                path.unlink(missing_ok=True)
            else:
                continue
            removed.append(name)
    return removed


# --- adding ------------------------------------------------------------------------------------------------

def addition_fields(folder: VectorFolder, fields: Sequence[str | FieldSpec] | None) -> tuple[FieldSpec, ...]:
    """The metadata fields an addition reads from its records: the folder's (`fields`, when given, must be
    them: ConfigError naming both sets)."""
    specs = folder.fields if fields is None else parse_fields(fields)
    if specs != folder.fields:
        raise ConfigError(f"{folder.directory} stores the metadata fields [{', '.join(map(str, folder.fields))}], "
                          f"this addition names [{', '.join(map(str, specs))}]: add with the folder's fields (leave "
                          "--field out to take them), or embed a new folder")
    return specs


def add_records(directory: str | os.PathLike, inputs: str | os.PathLike, *, model: str | os.PathLike | None = None,
                embedding: dict[str, Any] | None = None, settings: dict[str, Any] | None = None,
                batch_size: int = pipelines.DEFAULT_BATCH_SIZE, device: str = "auto", engine: str = DEFAULT_KIND,
                threads: int | None = None, fields: Sequence[str | FieldSpec] | None = None) -> dict[str, Any]:
    """Embed the records of `inputs` into new shards of a finished folder; a record whose id the folder holds
    replaces it (the old rows become tombstones). Nothing else is embedded again.

    Args:
        directory: the folder (`bertforge embed --out`).
        inputs: a text, TSV, CSV or JSONL file, or a folder of them.
        model: a copy of the folder's model (default: the path its manifest names; another model is refused).
        embedding: `EmbedSettings` fields given (default: the folder's); one that differs from the folder's is
            refused, naming it.
        settings: `CorpusSettings` fields of how `inputs` is read (default: how the folder's input was).
        batch_size, device, engine, threads: the pipeline's (`load_pipeline`); the window and precision are the
            folder's.
        fields: the metadata fields (`embed --field`; default: the folder's, read from the new records by the
            same names and types); another set is refused.

    Returns:
        {"added", "replaced", "count" (rows), "live", "shards", "seconds"}.

    Raises:
        ConfigError: another model, settings or fields than the folder's (naming what differs), an unfinished
            folder.
        DataError: a bad input line (file:line), a table without a field's column, or an input without records.
    """
    started = time.perf_counter()
    with changing(directory) as folder:
        specs = addition_fields(folder, fields)
        manifest = folder.manifest
        corpus_settings, _ = input_settings(manifest)
        corpus_settings = replace(corpus_settings, **(settings or {}))
        sources = source_files(inputs, corpus_settings)
        model_dir = Path(model if model is not None else manifest["model"]["path"])
        given = {name: value for name, value in (embedding or {}).items() if value is not None}
        wanted = replace(folder.settings, **({"prompt": None} if "prompt_name" in given else {}), **given)
        pipeline = pipelines.load_pipeline(
            model_dir, {"sparse": SPARSE_TASK, "multi-vector": MULTI_VECTOR_TASK}.get(folder.kind, "embed"), device=device,
            precision=manifest["embedding"]["precision"], engine=engine, threads=threads, batch_size=batch_size,
            max_length=manifest["embedding"]["max_length"])
        options = pipeline.check_options(wanted.options())
        candidate = first_manifest(model_dir, pipeline, options, wanted, inputs, sources, corpus_settings,
                                   manifest["shard_size"], specs)
        changes = describe_changes(manifest, {**candidate, "input": manifest["input"]})
        if changes:
            raise ConfigError(f"{folder.directory} holds vectors made differently than this addition would be "
                              f"({'; '.join(changes)}): add with the folder's model and settings (leave the flags "
                              "out to take the folder's), or embed a new folder")
        source = len(manifest.get("additions", [])) + 1
        index = max(shard["index"] for shard in manifest["shards"]) + 1
        chunking, prompt = folder.settings.chunking, manifest["embedding"]["prompt"]
        single = Path(inputs).is_file()
        records, shards, ids = 0, [], []
        for _, count, chunk in shard_chunks(read_records(sources, corpus_settings), manifest["shard_size"],
                                            lambda _: True):
            spans: list[list[int]] = []
            values = [record_values(record, specs) for record in chunk] if specs else []  # before the model
            shard_ids, vectors, tokens, cut = embed_shard(pipeline, options, prompt, chunk, corpus_settings, single,
                                                          chunking=chunking, first_record=records, spans=spans,
                                                          truncate=folder.settings.truncate)
            kept = spans if chunking is not None else None
            shards.append(write_shard(folder.directory, index, shard_ids, vectors, manifest["dtype"], tokens,
                                      manifest.get("calibration"), kept, len(cut),
                                      metadata=rows_metadata(specs, values, kept, records), source=source,
                                      first_record=records))
            ids += shard_ids
            index, records = index + 1, records + count
        if records == 0:
            raise DataError("no texts to add (only blank lines or headers); is this the right input?", inputs)
        replaced = live_rows_of(folder, set(ids))
        tombstones = tombstones_with(folder, [row for rows in replaced.values() for row in rows])
        new = next_manifest(folder, shards=manifest["shards"] + shards, tombstones=tombstones,
                            tokens=(manifest.get("tokens") or 0) + sum(shard["tokens"] for shard in shards),
                            truncated=(manifest.get("truncated") or 0) + sum(shard["truncated"] for shard in shards),
                            additions=[*manifest.get("additions", []),
                                       input_record(inputs, sources, corpus_settings)])
        commit_manifest(folder.directory, new)
        update_indexes(folder.directory)
    return summary(folder.directory, started, added=records, replaced=len(replaced), shards=len(shards))


def summary(directory: Path, started: float, **counts: int) -> dict[str, Any]:
    folder = VectorFolder(directory)
    return {**counts, "count": folder.count, "live": folder.live_count, "seconds": time.perf_counter() - started}


# --- deleting ----------------------------------------------------------------------------------------------

def delete_records(directory: str | os.PathLike, ids: Sequence[str], *, missing_ok: bool = False) -> dict[str, Any]:
    """Delete the records of `ids` from a finished folder (every row of each: all chunks of a chunked record);
    searches skip them from the commit on, and `compact_folder` drops their rows.

    Returns:
        {"deleted" (records), "rows", "count", "live", "seconds"}.

    Raises:
        ConfigError: an id the folder does not hold (or already deleted), unless `missing_ok`; nothing is changed.
    """
    started = time.perf_counter()
    wanted = {str(ident) for ident in ids}
    if not wanted:
        raise ConfigError("no id to delete: give --id ID (repeat it) or --ids-file FILE")
    with changing(directory) as folder:
        found = live_rows_of(folder, wanted)
        missing = sorted(wanted - set(found))
        if missing and not missing_ok:
            raise ConfigError(f"{folder.directory} holds no record of id {', '.join(map(repr, missing[:5]))}"
                              f"{' ...' if len(missing) > 5 else ''} ({len(missing)} of {len(wanted)} ids; deleted "
                              "ones count as absent): check the ids, or pass --missing-ok to delete the others")
        rows = [row for found_rows in found.values() for row in found_rows]
        if rows:
            commit_manifest(folder.directory, next_manifest(folder, tombstones=tombstones_with(folder, rows)))
    return summary(folder.directory, started, deleted=len(found), rows=len(rows))


# --- compacting --------------------------------------------------------------------------------------------

def kept_arrays(arrays: dict[str, np.ndarray], keep: np.ndarray) -> dict[str, np.ndarray]:
    """A shard's stored arrays (`VectorFolder.shard_arrays`) with only the rows `keep` ([n] bool)."""
    pointer = next((kind for kind in ("indptr", "offsets") if kind in arrays), None)  # rows of several entries
    if pointer is None:
        return {kind: array[keep] for kind, array in arrays.items()}
    lengths = np.diff(arrays[pointer])
    entries = np.repeat(keep, lengths)
    return {pointer: np.concatenate([[0], np.cumsum(lengths[keep])]).astype(np.int64),
            **{kind: array[entries] for kind, array in arrays.items() if kind != pointer}}


def joined_arrays(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Consecutive rows' stored arrays as one shard's."""
    pointer = next((kind for kind in ("indptr", "offsets") if kind in parts[0]), None)  # rows of several entries
    if pointer is None:
        return {kind: np.concatenate([part[kind] for part in parts]) for kind in parts[0]}
    starts = np.cumsum([0] + [int(part[pointer][-1]) for part in parts])
    joined = np.concatenate([[0]] + [part[pointer][1:] + start for part, start in zip(parts, starts)])
    return {pointer: joined.astype(np.int64),
            **{kind: np.concatenate([part[kind] for part in parts]) for kind in parts[0] if kind != pointer}}


def compact_folder(directory: str | os.PathLike) -> dict[str, Any]:
    """Rewrite a folder's shards without its deleted rows (each input's live rows in order, `shard_size` a
    shard, under new shard numbers), commit, then remove the old shards and rebuild the indexes beside them.
    Searches answer as before (the same ids and scores); only the row numbers change.

    Returns:
        {"dropped" (rows), "shards", "count", "live", "seconds"}; nothing is written when no row is deleted.
    """
    started = time.perf_counter()
    with changing(directory) as folder:
        if not len(folder.deleted):
            return summary(folder.directory, started, dropped=0, shards=len(folder.shards))
        manifest, live = folder.manifest, folder.live
        size, index = manifest["shard_size"], max(shard["index"] for shard in manifest["shards"]) + 1
        shards: list[dict[str, Any]] = []
        pending: dict[str, Any] = {"source": None, "parts": [], "ids": [], "spans": [], "records": [], "fields": []}

        def flush() -> None:
            nonlocal index
            if not pending["ids"]:
                return
            shards.append(write_shard_arrays(
                folder.directory, index, joined_arrays(pending["parts"]), pending["ids"], 0,
                pending["spans"] if folder.chunked else None, None if folder.chunked else pending["records"],
                metadata=joined_metadata(pending["fields"], folder.fields) if folder.fields else None,
                source=pending["source"]))
            index += 1
            pending.update(parts=[], ids=[], spans=[], records=[], fields=[])

        for shard, record in enumerate(manifest["shards"]):
            first, count = int(folder.offsets[shard]), record["count"]
            keep = live[first:first + count]
            if not keep.any():
                continue
            source = record.get("source", 0)
            if source != pending["source"]:  # a shard holds the rows of one input
                flush()
                pending["source"] = source
            arrays, ids = folder.shard_arrays(shard), folder.shard_lines(shard, "ids")
            spans = folder.shard_lines(shard, "spans") if folder.chunked else None
            metadata = folder.shard_metadata(shard) if folder.fields else None
            rows = np.arange(first, first + count)[keep]
            records = None if folder.chunked else folder.records_at(rows[None, :])[1][0].tolist()
            taken = 0
            while taken < len(rows):  # fill the open shard up to `size` rows
                room = size - len(pending["ids"])
                part = rows[taken:taken + room] - first
                mask = np.zeros(count, dtype=bool)
                mask[part] = True
                pending["parts"].append(kept_arrays(arrays, mask))
                pending["ids"] += [ids[i] for i in part.tolist()]
                if metadata is not None:
                    pending["fields"].append(metadata.take(part))
                if spans is not None:
                    pending["spans"] += [spans[i] for i in part.tolist()]
                else:
                    pending["records"] += records[taken:taken + len(part)]
                taken += len(part)
                if len(pending["ids"]) >= size:
                    flush()
        flush()
        dropped = len(folder.deleted)
        commit_manifest(folder.directory, next_manifest(folder, shards=shards, tombstones=None))
        update_indexes(folder.directory, rebuild=True)
    return summary(folder.directory, started, dropped=dropped, shards=len(shards))


def embed_settings_given(**flags: Any) -> dict[str, Any]:
    """The `EmbedSettings` fields among command-line flags (None: not given, the folder's is taken)."""
    names = {field.name for field in fields(EmbedSettings)}
    return {name: value for name, value in flags.items() if name in names and value is not None}


__all__ = ["LOCK_NAME", "add_records", "commit_manifest", "compact_folder", "delete_records",
           "embed_settings_given", "sweep_folder"]
