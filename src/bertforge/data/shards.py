"""Pretraining data on disk: the layout of a data directory, its ``index.json``, and reading it back.

This module owns the shard format (`data.preparation` is the driver that writes it from a corpus): the file
names, the arrays of one shard, the index document and its format version, which shards a directory already
holds complete (for resume), and `ShardIndex` / `SplitReader`, which validate and memory-map them for
training (`data.datasets`).

Layout of a data directory::

    index.json                      format version, vocab size and checksum, settings, shards, corpus report
    train-00000-00.tokens.npy       uint16 (vocab <= 65536) or int32 [tokens]: [CLS] A [SEP] B [SEP] ...
    train-00000-00.word_starts.npy  uint8 [tokens]: 1 where a word starts (whole-word masking)
    train-00000-00.instances.npy    int64 [instances, 4]: start, segment-B start, end, NSP label
                                    (contiguous rows, for MLM alone: [CLS] text [SEP], segment B empty)
    heldout-00000-00.*.npy          the same for the held-out split
    index.part-00001-of-00004.json  a part's own index, when preparation is split (`--part 1/4`)

A shard is named ``<split>-<group>-<dupe pass>``. Every file is written atomically and ``index.json`` is
rewritten after every shard, so a directory is always either complete or resumable. Masking is not stored: it
is applied when batches are made (`data.masking`, `data.datasets`), so `dupe_factor` only multiplies the
NSP/segment variations, never disk use for masks.

Preparation split into parts (`data.preparation_parts`): part i of n writes the shards of the groups g with
``g % n == i`` and records them in its own ``index.part-<i>-of-<n>.json`` (the same document as
``index.json``, holding only its shards); merging the n part indexes gives the ``index.json`` one process
writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from bertforge.errors import ConfigError, DataError
from bertforge.storage import open_atomic

FORMAT_VERSION = 1
INDEX_NAME = "index.json"
SPLITS = ("train", "heldout")
SHARD_FILE = re.compile(r"(train|heldout)-(\d{5,})-\d{2,}\.(tokens|word_starts|instances)\.npy")
PART_INDEX_FILE = re.compile(r"index\.part-(\d{5,})-of-(\d{5,})\.json")
# Temporary files of an interrupted atomic write (see `_write_atomic`).
PARTIAL_FILE = re.compile(r"\.?(index(\.part-\d{5,}-of-\d{5,})?\.json|(train|heldout)-\d{5,}-\d{2,}\.\w+\.npy)\..+\.tmp")
ARRAYS = ("tokens", "word_starts", "instances")


def vocab_checksum(tokenizer: Any) -> str:
    """A fingerprint of the vocabulary (every token in id order), to match shards with their tokenizer."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))
    return "sha256:" + hashlib.sha256("\n".join(tokens).encode("utf-8")).hexdigest()


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65536), else int32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


def shard_name(split: str, group: int, dupe: int) -> str:
    return f"{split}-{group:05d}-{dupe:02d}"


def part_index_name(part: int, parts: int) -> str:
    """The index file of part `part` (0-based) of `parts`."""
    return f"index.part-{part:05d}-of-{parts:05d}.json"


def file_group(name: str) -> int | None:
    """The group number of a shard file or of its temporary file (None for any other name)."""
    match = re.search(r"(?:train|heldout)-(\d{5,})-\d{2,}\.", name)
    return int(match.group(1)) if match and (SHARD_FILE.fullmatch(name) or PARTIAL_FILE.fullmatch(name)) else None


def _write_atomic(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    with open_atomic(path, "wb") as handle:
        write(handle)


def _write_json(path: Path, data: dict) -> None:
    text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    _write_atomic(path, lambda handle: handle.write(text.encode("utf-8")))


def write_index(out_dir: Path, document: dict, name: str = INDEX_NAME) -> None:
    """(Re)write ``index.json`` (or a part's index `name`) atomically: a reader sees the previous index or
    this one, never half of one."""
    _write_json(out_dir / name, document)


def write_shard(out_dir: Path, name: str, arrays: dict[str, np.ndarray]) -> None:
    """Write the arrays of shard `name` (`ARRAYS`: tokens, word_starts, instances), each atomically."""
    for key, array in arrays.items():
        _write_atomic(out_dir / f"{name}.{key}.npy", lambda handle, array=array: np.save(handle, array))


def remove_shards(out_dir: Path, owns: Callable[[int], bool] | None = None, index_name: str = INDEX_NAME) -> None:
    """Delete the indexes and every shard file of `out_dir` (other files are left alone); with `owns` (a
    part's test of a group number), only that part's shards and index `index_name`, and the merged index."""
    for path in out_dir.iterdir():
        group = file_group(path.name)
        if owns is None:
            doomed = path.name == INDEX_NAME or PART_INDEX_FILE.fullmatch(path.name) or SHARD_FILE.fullmatch(path.name)
        else:
            doomed = path.name in (INDEX_NAME, index_name) or (SHARD_FILE.fullmatch(path.name) and owns(group))
        if doomed:
            path.unlink(missing_ok=True)  # another part may remove the merged index at the same moment


def completed_shards(out_dir: Path, settings: dict, resume: bool, owns: Callable[[int], bool] | None = None,
                     index_name: str = INDEX_NAME) -> dict[str, dict]:
    """Records of shards an earlier run with the same settings finished (resume), or a clean directory.

    With `owns` (a part's test of a group number; its records live in `index_name`) only that part's shards
    and temporary files are looked at: the other parts may be writing into the same directory right now. A
    part also takes its shards from a merged ``index.json`` of the same settings.
    """
    for path in out_dir.iterdir():
        if PARTIAL_FILE.fullmatch(path.name):
            group = file_group(path.name)
            if owns is None or (group is not None and owns(group)) or path.name.startswith(f".{index_name}."):
                path.unlink(missing_ok=True)
    names = [INDEX_NAME] if owns is None else [index_name, INDEX_NAME]
    existing = [out_dir / name for name in names if (out_dir / name).exists()]
    if not existing:
        return {}
    if not resume:
        remove_shards(out_dir, owns, index_name)
        return {}
    done: dict[str, dict] = {}
    for index_path in existing:
        for name, record in _recorded_shards(out_dir, index_path, settings).items():
            if owns is None or owns(record["group"]):
                done[name] = record
    return done


def _recorded_shards(out_dir: Path, index_path: Path, settings: dict) -> dict[str, dict]:
    """The records of an index whose shard files are all present; refuses another version or settings."""
    index = read_index_file(index_path)
    if index.get("format_version") != FORMAT_VERSION:
        raise DataError(
            f"holds shards of data format version {index.get('format_version')!r}; this bertforge writes "
            f"version {FORMAT_VERSION}: prepare into a new directory, or pass resume=False to overwrite",
            index_path,
        )
    previous = index.get("settings", {})
    changed = sorted(key for key in set(previous) | set(settings) if previous.get(key) != settings.get(key))
    if changed:
        raise DataError(
            f"holds shards prepared with different settings ({', '.join(changed)} differ); prepare into a new "
            "directory, or pass resume=False to overwrite them",
            index_path,
        )
    done = {}
    for split in SPLITS:
        for record in index.get("splits", {}).get(split, {}).get("shards", []):
            if all((out_dir / f"{record['name']}.{key}.npy").is_file() for key in ARRAYS):
                done[record["name"]] = record
    return done


def index_document(settings: dict, vocab_size: int, checksum: str, records: dict[str, dict], complete: bool,
                   corpus: dict | None = None) -> dict:
    """The ``index.json`` content: per split its totals and shard records (in group, then dupe order)."""
    splits = {}
    for split in SPLITS:
        shards = sorted((record for record in records.values() if record["split"] == split),
                        key=lambda record: (record["group"], record["dupe"]))
        splits[split] = {
            "instances": sum(record["instances"] for record in shards),
            "tokens": sum(record["tokens"] for record in shards),
            "documents": sum(record["documents"] for record in shards if record["dupe"] == 0),
            "shards": shards,
        }
    document = {
        "format_version": FORMAT_VERSION,
        "complete": complete,
        "vocab_size": vocab_size,
        "vocab_checksum": checksum,
        "token_dtype": token_dtype(vocab_size).name,
        "settings": settings,
        "splits": splits,
    }
    if corpus is not None:
        document["corpus"] = corpus
    return document


def read_index_file(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise DataError(f"cannot read the shard index ({error.strerror})", path) from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise DataError("the shard index is not valid JSON; prepare the data again (prepare_corpus)", path) from None
    if not isinstance(data, dict):
        raise DataError("the shard index is not a JSON object; prepare the data again", path)
    return data


@dataclass
class ShardIndex:
    """The ``index.json`` of a prepared data directory, validated.

    Attributes:
        data_dir: the directory.
        vocab_size: vocabulary size the shards were written with.
        vocab_checksum: `vocab_checksum` of that vocabulary.
        settings: the `prepare_corpus` settings.
        splits: per split, its totals and shard records.
    """

    data_dir: Path
    vocab_size: int
    vocab_checksum: str
    settings: dict
    splits: dict

    @classmethod
    def load(cls, data_dir: str | os.PathLike) -> ShardIndex:
        """Read and check ``index.json``.

        Raises:
            DataError: the directory has no index, another format version, or an unfinished preparation.
        """
        data_dir = Path(data_dir)
        path = data_dir / INDEX_NAME
        if not path.is_file():
            if data_dir.is_dir() and any(PART_INDEX_FILE.fullmatch(p.name) for p in data_dir.iterdir()):
                raise DataError(f"no {INDEX_NAME}, only the indexes of parts of a split preparation: once every "
                                f"part has finished, merge them with `bertforge prepare --merge {data_dir}`", data_dir)
            raise DataError(
                f"no {INDEX_NAME}: not a prepared pretraining data directory; create one with prepare_corpus",
                data_dir,
            )
        data = read_index_file(path)
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise DataError(
                f"data format version {version!r}, but this bertforge reads version {FORMAT_VERSION}: prepare "
                "the corpus again with this version (prepare_corpus)",
                path,
            )
        if not data.get("complete"):
            raise DataError(
                "preparation did not finish: rerun prepare_corpus with the same arguments to resume it", path
            )
        try:
            return cls(data_dir, int(data["vocab_size"]), str(data["vocab_checksum"]), dict(data["settings"]),
                       dict(data["splits"]))
        except (KeyError, TypeError, ValueError) as error:
            raise DataError(f"the shard index lacks a field ({error}); prepare the data again", path) from None

    def check_vocab(self, tokenizer: Any = None, *, vocab_size: int | None = None, checksum: str | None = None) -> None:
        """Raise DataError unless the shards were written with this vocabulary (by tokenizer, size or checksum)."""
        if tokenizer is not None:
            vocab_size, checksum = tokenizer.vocab_size, vocab_checksum(tokenizer)
        path = self.data_dir / INDEX_NAME
        if vocab_size is not None and vocab_size != self.vocab_size:
            raise DataError(
                f"the shards hold ids of a {self.vocab_size}-token vocabulary but the model/tokenizer has "
                f"{vocab_size}: use the tokenizer the data was prepared with, or prepare the data again",
                path,
            )
        if checksum is not None and checksum != self.vocab_checksum:
            raise DataError(
                "the shards were prepared with a different vocabulary (checksum mismatch): use the tokenizer "
                "the data was prepared with, or prepare the data again",
                path,
            )

    def shards(self, split: str) -> list[dict]:
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        return list(self.splits.get(split, {}).get("shards", []))


class SplitReader:
    """Random access to the instances of one split, memory-mapped (nothing is loaded up front).

    Instances are numbered across the split's shards in index order (group, then dupe pass).
    """

    def __init__(self, index: ShardIndex, split: str):
        self.index = index
        self.split = split
        self._tokens: list[np.ndarray] = []
        self._word_starts: list[np.ndarray] = []
        self._rows: list[np.ndarray] = []
        counts = []
        for record in index.shards(split):
            arrays = {}
            for key in ARRAYS:
                path = index.data_dir / f"{record['name']}.{key}.npy"
                try:
                    arrays[key] = np.load(path, mmap_mode="r")
                except FileNotFoundError:
                    raise DataError("shard file missing; prepare the data again (resume fills it in)", path) from None
                except ValueError as error:
                    raise DataError(f"corrupt shard file ({error}); prepare the data again", path) from None
            if arrays["instances"].shape != (record["instances"], 4):
                raise DataError(
                    f"holds {arrays['instances'].shape[0]} instances, the index says {record['instances']}: "
                    "prepare the data again",
                    index.data_dir / f"{record['name']}.instances.npy",
                )
            self._tokens.append(arrays["tokens"])
            self._word_starts.append(arrays["word_starts"])
            self._rows.append(arrays["instances"])
            counts.append(record["instances"])
        self._ends = np.cumsum(counts, dtype=np.int64)

    def __len__(self) -> int:
        return int(self._ends[-1]) if self._ends.size else 0

    def instance(self, index: int) -> tuple[np.ndarray, np.ndarray, int, int]:
        """``(token_ids, word_starts, segment_b_start, nsp_label)`` of instance `index` (0-based).

        `segment_b_start` is relative to the instance's first token.
        """
        shard = int(np.searchsorted(self._ends, index, side="right"))
        local = index - (int(self._ends[shard - 1]) if shard else 0)
        start, b_start, end, label = (int(value) for value in self._rows[shard][local])
        return self._tokens[shard][start:end], self._word_starts[shard][start:end], b_start - start, label


    def batch(self, indices: np.ndarray, pad_id: int, pad_to_multiple_of: int | None = None) -> PaddedInstances:
        """Instances `indices` (in that order) read at once and right-padded to the longest, rounded up to a
        multiple of `pad_to_multiple_of` when given."""
        indices = np.asarray(indices, dtype=np.int64)
        shards = np.searchsorted(self._ends, indices, side="right")
        bounds = np.zeros((indices.size, 4), dtype=np.int64)
        for shard in np.unique(shards):
            here = shards == shard
            local = indices[here] - (int(self._ends[shard - 1]) if shard else 0)
            bounds[here] = self._rows[shard][local]
        lengths = bounds[:, 2] - bounds[:, 0]
        width = int(lengths.max())
        if pad_to_multiple_of:
            width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
        token_ids = np.full((indices.size, width), pad_id, dtype=np.int64)
        word_starts = np.zeros((indices.size, width), dtype=np.uint8)
        for shard in np.unique(shards):
            here = np.flatnonzero(shards == shard)
            sizes = lengths[here]
            # One gather per shard: the flat token offsets of all its rows, and where each lands in the batch.
            firsts = np.cumsum(sizes) - sizes
            offsets = np.arange(int(sizes.sum())) - np.repeat(firsts, sizes)
            source = np.repeat(bounds[here, 0], sizes) + offsets
            row = np.repeat(here, sizes)
            token_ids[row, offsets] = self._tokens[shard][source]
            word_starts[row, offsets] = self._word_starts[shard][source]
        return PaddedInstances(token_ids, word_starts, lengths, bounds[:, 1] - bounds[:, 0], bounds[:, 3])


@dataclass
class PaddedInstances:
    """Instances read as one padded block (B rows, T = the longest).

    Attributes:
        token_ids: int64 [B, T]; word_starts: uint8 [B, T]; lengths, segment_b_starts, nsp_labels: int64 [B].
    """

    token_ids: np.ndarray
    word_starts: np.ndarray
    lengths: np.ndarray
    segment_b_starts: np.ndarray
    nsp_labels: np.ndarray


def load_report(data_dir: str | os.PathLike) -> dict:
    """The corpus report stored in a data directory's index (counts, formats, warnings)."""
    index_path = Path(data_dir) / INDEX_NAME
    return dict(read_index_file(index_path).get("corpus", {}))

