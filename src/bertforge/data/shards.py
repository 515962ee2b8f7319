"""Pretraining data on disk: `prepare_corpus` writes compact numpy shards, `ShardIndex` reads them back.

Text becomes ids once. `prepare_corpus` streams documents out of `data.corpus`, cuts the stream into *groups*
of about `shard_size` characters of text (documents are never split), and turns each group into instances
(`data.pretraining`) and writes them, one shard per group and `dupe_factor` pass. Hence:

- Bounded memory: a process holds the group it is working on (and the main process up to two groups per
  worker in flight), never the corpus. Random NSP segments come from the same group (see `data.pretraining`).
- Parallel and deterministic: groups go to `workers` processes; each group's randomness is derived from
  ``(seed, split, group, pass)`` only, so the output is byte-for-byte the same for the same inputs and seed,
  whatever the number of workers.
- Resumable: each completed shard is recorded in ``index.json`` (written atomically after every shard);
  a rerun with the same settings skips recorded shards without tokenizing their text again.
- Held-out documents (`heldout_fraction` or `heldout_documents`, spread evenly over the corpus) go to a
  separate ``heldout`` split for evaluation; random B segments never cross between the splits.

Layout of a data directory::

    index.json                      format version, vocab size and checksum, settings, shards, corpus report
    train-00000-00.tokens.npy       uint16 (vocab <= 65536) or int32 [tokens]: [CLS] A [SEP] B [SEP] ...
    train-00000-00.word_starts.npy  uint8 [tokens]: 1 where a word starts (whole-word masking)
    train-00000-00.instances.npy    int64 [instances, 4]: start, segment-B start, end, NSP label
    heldout-00000-00.*.npy          the same for the held-out split

Masking is not stored: it is applied when batches are made (`data.masking`, `data.datasets`), so
`dupe_factor` only multiplies the NSP/segment variations, never disk use for masks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import pickle
import random
import re
import resource
import sys
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.data.corpus import DEFAULT_MAX_DOCUMENT_SENTENCES, CorpusStats, read_documents, resolve_inputs
from bertforge.data.pretraining import (
    Segmenter,
    create_instances,
    tokenize_document,
    validate_instance_settings,
)
from bertforge.errors import BertforgeError, ConfigError, DataError
from bertforge.storage import open_atomic
from bertforge.tokenization.postprocessor import PostProcessor

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
INDEX_NAME = "index.json"
SPLITS = ("train", "heldout")
# Characters of input text per group (one shard per dupe pass): about 1M English or 4M Chinese tokens.
DEFAULT_SHARD_SIZE = 4_000_000
# Groups queued or running per worker process: enough to keep workers busy, few enough to bound memory.
IN_FLIGHT_PER_WORKER = 2
UNK_WARN_RATIO = 0.01
_SHARD_FILE = re.compile(r"(train|heldout)-\d{5,}-\d{2,}\.(tokens|word_starts|instances)\.npy")
# Temporary files of an interrupted atomic write (see `_write_atomic`).
_PARTIAL_FILE = re.compile(r"\.?(index\.json|(train|heldout)-\d{5,}-\d{2,}\.\w+\.npy)\..+\.tmp")
_ARRAYS = ("tokens", "word_starts", "instances")


def vocab_checksum(tokenizer: Any) -> str:
    """A fingerprint of the vocabulary (every token in id order), to match shards with their tokenizer."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))
    return "sha256:" + hashlib.sha256("\n".join(tokens).encode("utf-8")).hexdigest()


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65536), else int32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


def shard_name(split: str, group: int, dupe: int) -> str:
    return f"{split}-{group:05d}-{dupe:02d}"


def _write_atomic(path: Path, write) -> None:
    with open_atomic(path, "wb") as handle:
        write(handle)


def _write_json(path: Path, data: dict) -> None:
    text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    _write_atomic(path, lambda handle: handle.write(text.encode("utf-8")))


def _derive_seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1, np.uint64)[0])


@dataclass
class PrepareReport:
    """What `prepare_corpus` did.

    Attributes:
        documents, heldout_documents: documents in the train and held-out splits.
        instances, heldout_instances: instances written (all dupe passes).
        tokens: tokens in all instances of both splits (special tokens included).
        input_bytes: size of the input files.
        seconds: wall time.
        mb_per_s: input megabytes (10^6 bytes) per second, counting skipped (resumed) shards' text too.
        peak_rss_mb: peak resident memory of this process and of its worker processes (MiB, the larger).
        shards_written, shards_skipped: shards written now, and found complete from an earlier run.
        empty_documents: documents whose text produced no token.
        unk_tokens: ``[UNK]`` tokens among the documents' tokens (first pass).
        warnings: problems found (duplicates, missing document breaks, [UNK] rate ...), each with its fix.
        corpus: the `CorpusStats` summary.
    """

    out_dir: str
    documents: int = 0
    heldout_documents: int = 0
    instances: int = 0
    heldout_instances: int = 0
    tokens: int = 0
    input_bytes: int = 0
    seconds: float = 0.0
    mb_per_s: float = 0.0
    peak_rss_mb: float = 0.0
    shards_written: int = 0
    shards_skipped: int = 0
    empty_documents: int = 0
    unk_tokens: int = 0
    warnings: list[str] = field(default_factory=list)
    corpus: dict = field(default_factory=dict)

    def summary(self) -> str:
        """A few human-readable lines."""
        lines = [
            f"{self.out_dir}: {self.documents} train / {self.heldout_documents} held-out documents -> "
            f"{self.instances} / {self.heldout_instances} instances, {self.tokens} tokens",
            f"{self.input_bytes / 1e6:.1f} MB in {self.seconds:.1f} s ({self.mb_per_s:.2f} MB/s), "
            f"peak RSS {self.peak_rss_mb:.0f} MiB, shards written {self.shards_written}, "
            f"skipped {self.shards_skipped}",
        ]
        lines += [f"warning: {warning}" for warning in self.warnings]
        return "\n".join(lines)


class _GroupBuilder:
    """Turns one group of documents into shard files; runs in the main process or in a worker."""

    def __init__(self, tokenizer: Any, segmenter: Segmenter | None, out_dir: Path, seed: int,
                 max_seq_length: int, short_seq_prob: float):
        self.tokenizer = tokenizer
        self.segmenter = segmenter
        self.out_dir = out_dir
        self.seed = seed
        self.max_seq_length = max_seq_length
        self.short_seq_prob = short_seq_prob
        self.special = PostProcessor(tokenizer.cls_token_id, tokenizer.sep_token_id)
        self.unk_id = getattr(tokenizer, "unk_token_id", None)
        self.dtype = token_dtype(tokenizer.vocab_size)

    def build(self, split: str, group: int, documents: list[list[str]], passes: list[int]) -> list[dict]:
        """Tokenize the group and write the shards of the given dupe passes; return their index records."""
        tokenized = [tokenize_document(sentences, self.tokenizer, self.segmenter) for sentences in documents]
        kept = [document for document in tokenized if document]
        tokens_in = sum(len(sentence) for document in kept for sentence in document)
        unk = 0
        if self.unk_id is not None:
            unk = sum(sentence.ids.count(self.unk_id) for document in kept for sentence in document)
        records = []
        for dupe in passes:
            rng = random.Random(_derive_seed(self.seed, SPLITS.index(split), group, dupe))
            ids = bytearray()
            starts = bytearray()
            rows: list[tuple[int, int, int, int]] = []
            count = 0
            for index in range(len(kept)):
                for instance in create_instances(kept, index, max_seq_length=self.max_seq_length,
                                                 short_seq_prob=self.short_seq_prob, special=self.special,
                                                 rng=rng):
                    ids += instance.ids.tobytes()
                    starts += instance.word_starts
                    rows.append((count, count + instance.segment_b_start, count + len(instance.ids),
                                 instance.nsp_label))
                    count += len(instance.ids)
            arrays = {
                "tokens": np.frombuffer(bytes(ids), dtype=np.int32).astype(self.dtype),
                "word_starts": np.frombuffer(bytes(starts), dtype=np.uint8),
                "instances": np.asarray(rows, dtype=np.int64).reshape(-1, 4),
            }
            name = shard_name(split, group, dupe)
            for key, array in arrays.items():
                _write_atomic(self.out_dir / f"{name}.{key}.npy", lambda handle, array=array: np.save(handle, array))
            records.append({
                "name": name, "split": split, "group": group, "dupe": dupe, "documents": len(kept),
                "empty_documents": len(documents) - len(kept), "instances": len(rows), "tokens": count,
                "document_tokens": tokens_in, "unk_tokens": unk,
            })
        return records


_WORKER_BUILDER: _GroupBuilder | None = None


def _init_worker(builder: _GroupBuilder) -> None:
    global _WORKER_BUILDER
    _WORKER_BUILDER = builder


def _build_in_worker(split: str, group: int, documents: list[list[str]], passes: list[int]) -> list[dict]:
    assert _WORKER_BUILDER is not None
    return _WORKER_BUILDER.build(split, group, documents, passes)


def _heldout_rate(files: list[Path], fraction: float, documents: int | None, format: str,
                  max_document_sentences: int) -> Fraction:
    if documents is not None:
        if fraction:
            raise ConfigError("give heldout_fraction or heldout_documents, not both")
        if isinstance(documents, bool) or not isinstance(documents, int) or documents < 0:
            raise ConfigError(f"heldout_documents must be a non-negative integer, got {documents!r}")
        if documents == 0:
            return Fraction(0)
        # Spreading N documents evenly needs the total: one cheap pass that reads text without tokenizing.
        total = sum(1 for _ in read_documents(files, format=format, max_document_sentences=max_document_sentences,
                                              count_duplicates=False, log_warnings=False))
        if documents >= total:
            raise ConfigError(
                f"heldout_documents={documents} leaves nothing to train on: the corpus has {total} documents"
            )
        return Fraction(documents, total)
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0.0 <= fraction < 1.0:
        raise ConfigError(f"heldout_fraction must be in [0, 1), got {fraction!r}")
    return Fraction(fraction).limit_denominator(1_000_000)


def _is_heldout(index: int, rate: Fraction) -> bool:
    """Document `index` is held out when round(i * rate) steps up: evenly spread, the first one half an
    interval in, and exactly round(total * rate) of them (so exactly N for a rate of N / total)."""
    numerator, denominator = 2 * rate.numerator, 2 * rate.denominator
    before = (index * numerator + rate.denominator) // denominator
    return ((index + 1) * numerator + rate.denominator) // denominator > before


def _peak_rss_mb() -> float:
    scale = 1.0 if sys.platform == "darwin" else 1024.0  # ru_maxrss: bytes on macOS, KiB on Linux
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) * scale / 2**20


def _settings(files: list[Path], tokenizer: Any, **values: Any) -> dict:
    return {
        "inputs": [{"path": str(path), "bytes": path.stat().st_size} for path in files],
        "vocab_size": tokenizer.vocab_size,
        **values,
    }


def _remove_shards(out_dir: Path) -> None:
    for path in out_dir.iterdir():
        if path.name == INDEX_NAME or _SHARD_FILE.fullmatch(path.name):
            path.unlink()


def _completed_shards(out_dir: Path, settings: dict, resume: bool) -> dict[str, dict]:
    """Records of shards an earlier run with the same settings finished (resume), or a clean directory."""
    for path in out_dir.iterdir():
        if _PARTIAL_FILE.fullmatch(path.name):
            path.unlink()
    index_path = out_dir / INDEX_NAME
    if not index_path.exists():
        return {}
    if not resume:
        _remove_shards(out_dir)
        return {}
    index = _read_index_file(index_path)
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
            if all((out_dir / f"{record['name']}.{key}.npy").is_file() for key in _ARRAYS):
                done[record["name"]] = record
    return done


def _index_document(settings: dict, tokenizer: Any, checksum: str, records: dict[str, dict], complete: bool,
                    stats: CorpusStats | None, warnings: list[str]) -> dict:
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
        "vocab_size": tokenizer.vocab_size,
        "vocab_checksum": checksum,
        "token_dtype": token_dtype(tokenizer.vocab_size).name,
        "settings": settings,
        "splits": splits,
    }
    if stats is not None:
        document["corpus"] = {**stats.to_dict(), "warnings": warnings}
    return document


def prepare_corpus(
    inputs: str | os.PathLike | Sequence[str | os.PathLike],
    tokenizer: Any,
    out_dir: str | os.PathLike,
    *,
    max_seq_length: int = 128,
    short_seq_prob: float = 0.1,
    dupe_factor: int = 1,
    seed: int = 12345,
    workers: int = 1,
    shard_size: int = DEFAULT_SHARD_SIZE,
    heldout_fraction: float = 0.0,
    heldout_documents: int | None = None,
    resume: bool = True,
    format: str = "auto",
    max_document_sentences: int = DEFAULT_MAX_DOCUMENT_SENTENCES,
    segmenter: Segmenter | None = None,
) -> PrepareReport:
    """Turn a text corpus into pretraining shards (module docstring), streaming in bounded memory.

    Args:
        inputs: files, folders or glob patterns of UTF-8 text (`data.corpus` explains the formats).
        tokenizer: a `bertforge.tokenization.Tokenizer` (anything with ``encode_words``, ``vocab_size``,
            ``cls_token_id``, ``sep_token_id``, ``convert_ids_to_tokens``).
        out_dir: the data directory (created if missing).
        max_seq_length: the longest instance, special tokens included.
        short_seq_prob: chance that a document uses a random shorter target length (Google: 0.1).
        dupe_factor: passes over the data with different random segment choices (Google: 10; here masks are
            dynamic, so 1 is usually enough).
        seed: the output depends only on inputs, settings and this.
        workers: processes that tokenize groups in parallel (the output does not depend on it).
        shard_size: characters of input text per group/shard.
        heldout_fraction: share of documents for the ``heldout`` split (spread evenly).
        heldout_documents: exact number of held-out documents instead (costs one extra reading pass).
        resume: skip shards an earlier run with the same settings completed; False rewrites everything.
        format: corpus format, ``"auto"`` to detect per file.
        max_document_sentences: longer documents are cut into pieces of this many sentences.
        segmenter: ``text -> words`` for Chinese whole-word masking (e.g. `jieba_segmenter()`); must be
            picklable when workers > 1.

    Returns:
        A `PrepareReport`; its warnings are also logged.

    Raises:
        ConfigError: a setting is out of range. DataError: an input cannot be read as UTF-8 text, the corpus
        holds no text, or `out_dir` holds shards of another format version or other settings (with resume).
    """
    started = time.perf_counter()
    validate_instance_settings(max_seq_length, short_seq_prob, dupe_factor)
    for name, value, low in (("workers", workers, 1), ("shard_size", shard_size, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
    if workers > 1 and segmenter is not None:
        try:
            pickle.dumps(segmenter)
        except (pickle.PicklingError, AttributeError, TypeError) as error:
            raise ConfigError(
                f"the segmenter cannot be sent to worker processes ({error}); with workers > 1 pass a module-level "
                "function (e.g. jieba_segmenter()), or use workers=1"
            ) from None
    files = resolve_inputs(inputs)
    rate = _heldout_rate(files, heldout_fraction, heldout_documents, format, max_document_sentences)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    checksum = vocab_checksum(tokenizer)
    settings = _settings(
        files, tokenizer, vocab_checksum=checksum, max_seq_length=max_seq_length, short_seq_prob=short_seq_prob,
        dupe_factor=dupe_factor, seed=seed, shard_size=shard_size, heldout_rate=str(rate), format=format,
        max_document_sentences=max_document_sentences,
        segmenter=None if segmenter is None else getattr(segmenter, "__qualname__", type(segmenter).__name__),
    )
    done = _completed_shards(out_dir, settings, resume)
    records = dict(done)
    builder = _GroupBuilder(tokenizer, segmenter, out_dir, seed, max_seq_length, short_seq_prob)
    executor = None
    if workers > 1:
        executor = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=_init_worker, initargs=(builder,))
    pending: set[Future] = set()
    written = 0

    def finish(results: list[list[dict]]) -> None:
        nonlocal written
        for result in results:
            for record in result:
                records[record["name"]] = record
                written += 1
        _write_json(out_dir / INDEX_NAME, _index_document(settings, tokenizer, checksum, records, False, None, []))

    def submit(split: str, group: int, documents: list[list[str]]) -> None:
        passes = [dupe for dupe in range(dupe_factor) if shard_name(split, group, dupe) not in done]
        if not passes:
            return
        if executor is None:
            finish([builder.build(split, group, documents, passes)])
            return
        while len(pending) >= IN_FLIGHT_PER_WORKER * workers:
            completed, _ = wait(pending, return_when=FIRST_COMPLETED)
            pending.difference_update(completed)
            finish([future.result() for future in completed])
        pending.add(executor.submit(_build_in_worker, split, group, documents, passes))

    stats = CorpusStats()
    groups = {split: {"index": 0, "documents": [], "chars": 0} for split in SPLITS}
    try:
        documents = read_documents(files, format=format, max_document_sentences=max_document_sentences, stats=stats)
        for number, document in enumerate(documents):
            split = "heldout" if _is_heldout(number, rate) else "train"
            group = groups[split]
            group["documents"].append(document.sentences)
            group["chars"] += sum(map(len, document.sentences))
            if group["chars"] >= shard_size:
                submit(split, group["index"], group["documents"])
                groups[split] = {"index": group["index"] + 1, "documents": [], "chars": 0}
        for split, group in groups.items():
            if group["documents"]:
                submit(split, group["index"], group["documents"])
        if pending:
            finish([future.result() for future in wait(pending).done])
            pending.clear()
    except BrokenProcessPool:
        raise BertforgeError(
            "a data-preparation worker process died: out of memory, or the calling program cannot be re-imported "
            "by a spawned process (code typed at an interactive prompt or piped on stdin); run from a script "
            "file, or with workers=1. Completed shards are kept: rerun to resume"
        ) from None
    finally:
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
    if stats.documents == 0:
        raise DataError(f"no text found in {len(files)} input file(s) ({files[0]}, ...): every file is empty")

    warnings = stats.warnings()
    totals = _index_document(settings, tokenizer, checksum, records, True, None, [])["splits"]
    empty = sum(record["empty_documents"] for record in records.values() if record["dupe"] == 0)
    unk = sum(record["unk_tokens"] for record in records.values() if record["dupe"] == 0)
    document_tokens = sum(record["document_tokens"] for record in records.values() if record["dupe"] == 0)
    if empty:
        warnings.append(f"{empty} documents produced no token (only whitespace or control characters); skipped")
    if document_tokens and unk > UNK_WARN_RATIO * document_tokens:
        warnings.append(
            f"{100.0 * unk / document_tokens:.1f}% of tokens are [UNK]: the vocabulary does not fit this corpus "
            "(another language or casing?); build one with bertforge.tokenization.build_vocab"
        )
    if rate and totals["heldout"]["instances"] == 0:
        warnings.append("the held-out split is empty: raise heldout_fraction or heldout_documents")
    for warning in warnings[len(stats.warnings()):]:
        log.warning(warning)
    _write_json(out_dir / INDEX_NAME, _index_document(settings, tokenizer, checksum, records, True, stats, warnings))

    seconds = time.perf_counter() - started
    input_bytes = sum(path.stat().st_size for path in files)
    return PrepareReport(
        out_dir=str(out_dir),
        documents=totals["train"]["documents"],
        heldout_documents=totals["heldout"]["documents"],
        instances=totals["train"]["instances"],
        heldout_instances=totals["heldout"]["instances"],
        tokens=totals["train"]["tokens"] + totals["heldout"]["tokens"],
        input_bytes=input_bytes,
        seconds=seconds,
        mb_per_s=input_bytes / 1e6 / max(seconds, 1e-9),
        peak_rss_mb=_peak_rss_mb(),
        shards_written=written,
        shards_skipped=len(done),
        empty_documents=empty,
        unk_tokens=unk,
        warnings=warnings,
        corpus=stats.to_dict(),
    )


def _read_index_file(path: Path) -> dict:
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
            raise DataError(
                f"no {INDEX_NAME}: not a prepared pretraining data directory; create one with prepare_corpus",
                data_dir,
            )
        data = _read_index_file(path)
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
            for key in _ARRAYS:
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


def load_report(data_dir: str | os.PathLike) -> dict:
    """The corpus report stored in a data directory's index (counts, formats, warnings)."""
    index_path = Path(data_dir) / INDEX_NAME
    return dict(_read_index_file(index_path).get("corpus", {}))

