"""Preparing one corpus in parts, on several processes or machines: which part builds which shards, and the
merge of the parts' indexes into the ``index.json`` one process would write.

Every part reads the whole corpus (reading and sentence-splitting text is cheap next to tokenizing it), so
every part sees the same stream of groups (`data.preparation`) and the same corpus statistics; part ``i`` of
``n`` tokenizes and writes only the groups ``g`` with ``g % n == i`` (train and held-out alike). A shard's
bytes depend only on the seed, its split, group and dupe pass and its documents, so the shards are the ones
one process writes, byte for byte. Part i records its shards in its own ``index.part-<i>-of-<n>.json``
(`data.shards`), rewritten after every shard (so a killed part resumes) and marked complete at its end.

The merge reads the n part indexes, checks that every part has finished with the same settings and that
every recorded shard file is there, and writes ``index.json`` (complete, with the corpus report): the same
file one process writes. The last part to finish merges (each part looks after writing its own complete
index, so on a shared filesystem at least the last one sees all of them); ``bertforge prepare --merge DIR``
does it by hand, naming the parts still missing. The part indexes stay beside ``index.json`` (a rerun of a
part then skips all its shards).

Parts are chosen with ``--part i/n`` (i counts from 0, like torchrun's RANK), or under torchrun from RANK and
WORLD_SIZE. Nothing here imports torch: preparation runs in plain worker processes.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from bertforge.data.preparation_report import PrepareReport, finish_index
from bertforge.data.shards import (
    ARRAYS,
    FORMAT_VERSION,
    PART_INDEX_FILE,
    index_document,
    part_index_name,
    read_index_file,
)
from bertforge.errors import ConfigError, DataError
from bertforge.processes import Ranks

_PART = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


@dataclass(frozen=True)
class Part:
    """Part `index` (0-based) of `count` parts of one preparation."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ConfigError(f"part: the number of parts must be a positive integer, got {self.count!r}")
        if isinstance(self.index, bool) or not isinstance(self.index, int) or not 0 <= self.index < self.count:
            raise ConfigError(
                f"part {self.index}/{self.count}: the part number counts from 0, like torchrun's RANK, so the "
                f"parts of {self.count} are " + ", ".join(f"{i}/{self.count}" for i in range(min(self.count, 3)))
                + (" ..." if self.count > 3 else "")
            )

    @classmethod
    def parse(cls, text: str) -> Part:
        """``"i/n"`` (e.g. ``"0/4"``) as a `Part`."""
        match = _PART.fullmatch(text)
        if match is None:
            raise ConfigError(f"--part {text!r}: write it as i/n, part i (counting from 0) of n, e.g. --part 0/4")
        return cls(int(match.group(1)), int(match.group(2)))

    @classmethod
    def from_env(cls) -> Part | None:
        """The part torchrun's RANK and WORLD_SIZE describe (read by `processes.Ranks.from_env`, their one
        reader); None outside torchrun or with one process."""
        try:
            ranks = Ranks.from_env()
        except ConfigError as error:
            raise ConfigError(f"{error} (or pass --part i/n)") from None
        return None if ranks.world_size == 1 else cls(ranks.rank, ranks.world_size)

    def owns(self, group: int) -> bool:
        return group % self.count == self.index

    @property
    def index_name(self) -> str:
        return part_index_name(self.index, self.count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def _part_indexes(out_dir: Path) -> dict[int, dict[int, Path]]:
    """The part index files in `out_dir`, by number of parts, then part number."""
    found: dict[int, dict[int, Path]] = {}
    for path in out_dir.iterdir():
        match = PART_INDEX_FILE.fullmatch(path.name)
        if match:
            found.setdefault(int(match.group(2)), {})[int(match.group(1))] = path
    return found


def _finished_parts(out_dir: Path, count: int | None) -> tuple[int, dict[int, dict], list[int]]:
    """(number of parts, the finished parts' indexes by part number, the part numbers not finished)."""
    if not out_dir.is_dir():
        raise DataError("no such directory: give the --out folder the parts wrote into", out_dir)
    found = _part_indexes(out_dir)
    if count is None:
        if not found:
            raise DataError("holds no part index (index.part-*-of-*.json): nothing to merge; prepare the parts "
                            "first with `bertforge prepare ... --part i/n`", out_dir)
        if len(found) > 1:
            splits = ", ".join(f"{n} parts" for n in sorted(found))
            raise DataError(f"holds the part indexes of preparations split differently ({splits}); delete the "
                            "stale index.part-*-of-*.json files and rerun their parts", out_dir)
        count = next(iter(found))
    finished, missing = {}, []
    for number in range(count):
        path = found.get(count, {}).get(number)
        index = read_index_file(path) if path is not None else None
        if index is None or not index.get("complete"):
            missing.append(number)
        else:
            finished[number] = index
    return count, finished, missing


def merge_parts(out_dir: str | os.PathLike, count: int | None = None) -> PrepareReport:
    """Merge the indexes of the `count` parts of a preparation in `out_dir` (default: the one split found
    there) into its ``index.json``; see the module docstring.

    Raises:
        DataError: a part has not finished (the message names each one), the parts were prepared with
        different settings or another format version, or a shard file a part recorded is missing.
    """
    started = time.perf_counter()
    out_dir = Path(out_dir)
    count, finished, missing = _finished_parts(out_dir, count)
    if missing:
        names = ", ".join(f"{number}/{count}" for number in missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise DataError(
            f"cannot merge: {len(missing)} of {count} parts have not finished ({names}); run (or rerun, to resume) "
            "`bertforge prepare ... --part i/n` with the same settings for each, on a filesystem this directory "
            "shares, then merge again", out_dir)
    first = finished[0]
    records: dict[str, dict] = {}
    for number, index in finished.items():
        path = out_dir / part_index_name(number, count)
        if index.get("format_version") != FORMAT_VERSION:
            raise DataError(f"part of data format version {index.get('format_version')!r}, this bertforge merges "
                            f"version {FORMAT_VERSION}: prepare the parts again with this version", path)
        if index.get("settings") != first["settings"] or index.get("vocab_checksum") != first["vocab_checksum"]:
            changed = sorted(key for key in set(first["settings"]) | set(index.get("settings", {}))
                             if first["settings"].get(key) != index.get("settings", {}).get(key))
            raise DataError(f"prepared with other settings than part 0/{count} ({', '.join(changed) or 'vocabulary'}"
                            " differ): rerun every part with the same command but its --part", path)
        for split in index["splits"].values():
            for record in split["shards"]:
                absent = [key for key in ARRAYS if not (out_dir / f"{record['name']}.{key}.npy").is_file()]
                if absent:
                    raise DataError(f"records shard {record['name']}, but its {absent[0]} file is missing (on "
                                    "several machines the directory must be on a filesystem they share): rerun "
                                    f"part {number}/{count} to write it again", path)
                records[record["name"]] = record
    merged = index_document(first["settings"], first["vocab_size"], first["vocab_checksum"], records, True)
    input_bytes = sum(item["bytes"] for item in first["settings"]["inputs"])
    return finish_index(out_dir, merged, first["corpus"], input_bytes=input_bytes, started=started, written=0,
                        skipped=len(records))


def all_parts_finished(out_dir: Path, count: int) -> bool:
    """Whether every one of the `count` parts has written its complete index."""
    return not _finished_parts(out_dir, count)[2]
