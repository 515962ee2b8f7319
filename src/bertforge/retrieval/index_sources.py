"""What an index was built from, checked when it is opened: the shards of an embedding folder against the
checksums their manifest records, and an index derived from them (an HNSW graph, an inverted index) against
the record its builder kept beside it.

Owns: `check_shard_sizes` (every shard file of a folder `bertforge embed` wrote has the size its manifest
records: a stat each, at open), `verify_shard_file` (one shard file against the sha256 its manifest records,
the first time an open folder reads it: vectors are hashed shard by shard as they are used), and
`file_records` / `files_problem` (a derived index's own files, by sha256 and size).

The two kinds of file fail differently. A shard is the source: nothing can be rebuilt from a damaged or
replaced one, so a difference is one ConfigError naming the file and how to rewrite it (delete its progress
record, rerun the same `bertforge embed`: the run redoes that shard). A derived index is made from the shards:
`files_problem` only says what is wrong, and its owner (`vector_ann`, `sparse_search`) logs that and rebuilds
it from the verified shards. `BERTFORGE_SKIP_CHECKSUM=1` skips the sha256 comparisons (sizes are still
compared), as it does for model files.

Cost: sha256 reads a file once more (about 0.5 GB/s a core on the shared 2-core test machine); each file is
hashed once per opened folder, never per query. An exact search of one query over 77 MB of vectors took
0.46-0.54 s verified against 0.14-0.15 s unverified (load average 15-16; docs/embeddings.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bertforge import storage
from bertforge.errors import ConfigError
from bertforge.retrieval.embed_corpus import MANIFEST_NAME, progress_path


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


def file_records(folder: Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """{name: {"sha256", "bytes"}} of a derived index's files, for its record."""
    return {name: storage.file_record(folder / name) for name in names}


def files_problem(folder: Path, records: Any, recorded_in: str) -> str | None:
    """What is wrong with a derived index's files against `records` (kept in its record `recorded_in`): a file
    missing, truncated or not the one built (another folder's copied in, rewritten), or no records at all (an
    older version's index); None when each matches."""
    if not isinstance(records, dict) or not records:
        return f"{recorded_in} records no checksum of the index's files (built by an older version)"
    for name, entry in records.items():
        if not isinstance(entry, dict):
            return f"{recorded_in} holds no checksum of {name}"
        path = folder / name
        if storage.checksums_skipped():  # the size still
            size = path.stat().st_size if path.is_file() else None
            problem = None if size == entry.get("bytes") else f"{size} bytes, but {entry.get('bytes')} were saved"
        else:
            problem = storage.file_differs(path, entry, recorded_in)
        if problem is not None:
            return f"{name}: {problem}"
    return None


__all__ = ["check_shard_sizes", "file_records", "files_problem", "verify_shard_file"]
