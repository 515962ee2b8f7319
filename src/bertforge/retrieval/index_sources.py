"""What an index derived from a vector folder was built from, checked when it is opened: an HNSW graph or an
inverted index against the record its builder kept beside it. The folder's own shards are checked against
their manifest by `store` (`check_shard_sizes` at open, `verify_shard_file` the first time a shard is read).

Owns: `file_records` / `files_problem` (a derived index's own files, by sha256 and size).

The two kinds of file fail differently. A shard is the source: nothing can be rebuilt from a damaged or
replaced one, so a difference is one ConfigError naming the file and how to rewrite it (delete its progress
record, rerun the same `bertforge embed`: the run redoes that shard). A derived index is made from the shards:
`files_problem` only says what is wrong, and its owner (`vector_ann`, `sparse_search`) logs that and rebuilds
it from the verified shards. `BERTFORGE_SKIP_CHECKSUM=1` skips the sha256 comparisons (sizes are still
compared), as it does for model files.

Cost: sha256 reads a file once more (about 0.5 GB/s a core on the shared 2-core test machine); each file is
hashed once per opened folder, never per query. An exact search of one query over 77 MB of vectors took
0.46-0.54 s verified against 0.14-0.15 s unverified (load average 15-16; docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bertforge import storage


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


__all__ = ["file_records", "files_problem"]
