"""Preparing pretraining data: `prepare_corpus` turns a text corpus into shards, in parallel and resumably.

Text becomes ids once. `prepare_corpus` streams documents out of `data.corpus`, cuts the stream into *groups*
of about `shard_size` characters of text (documents are never split), and turns each group into instances
(`data.pretraining`) and writes them (`data.shards` owns the files), one shard per group and `dupe_factor`
pass. Hence:

- Bounded memory: a process holds the group it is working on (and the main process up to two groups per
  worker in flight), never the corpus. Random NSP segments come from the same group (see `data.pretraining`).
- Parallel and deterministic: groups go to `workers` processes; each group's randomness is derived from
  ``(seed, split, group, pass)`` only, so the output is byte-for-byte the same for the same inputs and seed,
  whatever the number of workers, and it can be split into parts across processes and machines
  (``part=``, `data.preparation_parts`) whose shards and merged index are the same bytes again.
- Resumable: each completed shard is recorded in ``index.json`` (written atomically after every shard);
  a rerun with the same settings skips recorded shards without tokenizing their text again.
- Held-out documents (`heldout_fraction` or `heldout_documents`, spread evenly over the corpus) go to a
  separate ``heldout`` split for evaluation; random B segments never cross between the splits.

This module owns that driver: settings checks, the held-out rule, the group stream and the worker pool
(`data.preparation_report` sums a run up in its `PrepareReport`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import random
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.data.corpus import DEFAULT_MAX_DOCUMENT_SENTENCES, CorpusStats, Document, read_documents
from bertforge.data.preparation_parts import Part, all_parts_finished, merge_parts
from bertforge.data.preparation_report import PrepareReport, finish_index, report_of
from bertforge.data.pretraining import (
    Instance,
    Segmenter,
    Sentence,
    create_contiguous_instances,
    create_instances,
    tokenize_document,
    validate_instance_settings,
)
from bertforge.data.shards import (
    INDEX_NAME,
    SPLITS,
    completed_shards,
    index_document,
    shard_name,
    token_dtype,
    vocab_checksum,
    write_index,
    write_shard,
)
from bertforge.data.text_files import resolve_inputs
from bertforge.errors import BertforgeError, ConfigError, DataError
from bertforge.tokenization.postprocessor import PostProcessor

log = logging.getLogger(__name__)

# Characters of input text per group (one shard per dupe pass): about 1M English or 4M Chinese tokens.
DEFAULT_SHARD_SIZE = 4_000_000
# Groups queued or running per worker process: enough to keep workers busy, few enough to bound memory.
IN_FLIGHT_PER_WORKER = 2


def _derive_seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1, np.uint64)[0])

class _GroupBuilder:
    """Turns one group of documents into shard files; runs in the main process or in a worker."""

    def __init__(self, tokenizer: Any, segmenter: Segmenter | None, out_dir: Path, seed: int,
                 max_seq_length: int, short_seq_prob: float, contiguous: bool = False):
        self.tokenizer = tokenizer
        self.segmenter = segmenter
        self.out_dir = out_dir
        self.seed = seed
        self.max_seq_length = max_seq_length
        self.short_seq_prob = short_seq_prob
        self.contiguous = contiguous
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
            for instance in self.instances(kept, rng):
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
            write_shard(self.out_dir, name, arrays)
            records.append({
                "name": name, "split": split, "group": group, "dupe": dupe, "documents": len(kept),
                "empty_documents": len(documents) - len(kept), "instances": len(rows), "tokens": count,
                "document_tokens": tokens_in, "unk_tokens": unk,
            })
        return records

    def instances(self, documents: list[list[Sentence]], rng: random.Random) -> Iterator[Instance]:
        """The group's instances: rows of consecutive text (`contiguous`), or Google's sentence pairs."""
        if self.contiguous:
            yield from create_contiguous_instances(documents, max_seq_length=self.max_seq_length,
                                                   special=self.special)
            return
        for index in range(len(documents)):
            yield from create_instances(documents, index, max_seq_length=self.max_seq_length,
                                        short_seq_prob=self.short_seq_prob, special=self.special, rng=rng)


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


def split_documents(inputs: str | os.PathLike | Sequence[str | os.PathLike], heldout_documents: int, *,
                    format: str = "auto", max_document_sentences: int = DEFAULT_MAX_DOCUMENT_SENTENCES
                    ) -> tuple[list[Document], list[Document]]:
    """The documents `prepare_corpus(inputs, ..., heldout_documents=N)` holds out, and the ones it trains on:
    the same reading and the same even spread, in memory (for probes of text a model never trained on)."""
    files = resolve_inputs(inputs)
    rate = _heldout_rate(files, 0.0, heldout_documents, format, max_document_sentences)
    heldout: list[Document] = []
    train: list[Document] = []
    documents = read_documents(files, format=format, max_document_sentences=max_document_sentences,
                               count_duplicates=False, log_warnings=False)
    for number, document in enumerate(documents):
        (heldout if _is_heldout(number, rate) else train).append(document)
    return heldout, train


def _settings(files: list[Path], tokenizer: Any, *, segmenter: Segmenter | None, contiguous: bool,
              **values: Any) -> dict:
    """The settings an index records (a resumed preparation must have the same)."""
    return {
        "inputs": [{"path": str(path), "bytes": path.stat().st_size} for path in files],
        "vocab_size": tokenizer.vocab_size,
        **values,
        "segmenter": None if segmenter is None else getattr(segmenter, "__qualname__", type(segmenter).__name__),
        # only when set: shards prepared before this setting existed keep their settings, and resume
        **({"contiguous": True} if contiguous else {}),
    }



def _check_settings(max_seq_length: int, short_seq_prob: float, dupe_factor: int, workers: int, shard_size: int,
                    seed: int, segmenter: Segmenter | None, contiguous: bool = False) -> None:
    validate_instance_settings(max_seq_length, short_seq_prob, dupe_factor)
    if contiguous and dupe_factor != 1:
        raise ConfigError(f"dupe_factor={dupe_factor} with contiguous instances would write the same rows "
                          f"{dupe_factor} times (they hold no random choice; masks are drawn anew every epoch): "
                          "use dupe_factor 1")
    for name, value, low in (("workers", workers, 1), ("shard_size", shard_size, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
    if workers > 1 and segmenter is not None:
        # Checked up front: a segmenter that cannot be pickled would otherwise fail inside the first worker.
        try:
            pickle.dumps(segmenter)
        except (pickle.PicklingError, AttributeError, TypeError) as error:
            raise ConfigError(
                f"the segmenter cannot be sent to worker processes ({error}); with workers > 1 pass a module-level "
                "function (e.g. jieba_segmenter()), or use workers=1"
            ) from None


class _ShardRecords:
    """The shard records of one preparation: those an earlier run completed plus those written now.

    ``index.json`` (a part's own index, for one part of a split preparation) is rewritten (atomically, marked
    incomplete) after every finished group, so an interrupted run loses at most the groups in flight.
    """

    def __init__(self, out_dir: Path, settings: dict, vocab_size: int, checksum: str, done: dict[str, dict],
                 index_name: str = INDEX_NAME):
        self.out_dir = out_dir
        self.index_name = index_name
        self.settings = settings
        self.vocab_size = vocab_size
        self.checksum = checksum
        self.done = done
        self.records = dict(done)
        self.written = 0

    def add(self, results: list[list[dict]]) -> None:
        for result in results:
            for record in result:
                self.records[record["name"]] = record
                self.written += 1
        write_index(self.out_dir, self.index(complete=False), self.index_name)

    def index(self, complete: bool, corpus: dict | None = None) -> dict:
        return index_document(self.settings, self.vocab_size, self.checksum, self.records, complete, corpus)


class _GroupDispatcher:
    """Builds each group's missing dupe passes, in this process (workers=1) or in a pool of spawned worker
    processes with at most `IN_FLIGHT_PER_WORKER` groups per worker queued or running (bounded memory)."""

    def __init__(self, builder: _GroupBuilder, records: _ShardRecords, workers: int, dupe_factor: int):
        self.builder = builder
        self.records = records
        self.workers = workers
        self.dupe_factor = dupe_factor
        self.executor: ProcessPoolExecutor | None = None
        if workers > 1:
            self.executor = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                                initializer=_init_worker, initargs=(builder,))
        self.pending: set[Future] = set()

    def submit(self, split: str, group: int, documents: list[list[str]]) -> None:
        passes = [dupe for dupe in range(self.dupe_factor) if shard_name(split, group, dupe) not in self.records.done]
        if not passes:
            return
        if self.executor is None:
            self.records.add([self.builder.build(split, group, documents, passes)])
            return
        while len(self.pending) >= IN_FLIGHT_PER_WORKER * self.workers:
            completed, _ = wait(self.pending, return_when=FIRST_COMPLETED)
            self.pending.difference_update(completed)
            self.records.add([future.result() for future in completed])
        self.pending.add(self.executor.submit(_build_in_worker, split, group, documents, passes))

    def drain(self) -> None:
        if self.pending:
            self.records.add([future.result() for future in wait(self.pending).done])
            self.pending.clear()

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)


def _groups(documents: Iterable[Document], rate: Fraction, shard_size: int) -> Iterator[tuple[str, int, list]]:
    """``(split, group number, the documents' sentences)`` in stream order: a split's group is full at
    `shard_size` characters; the last, partial groups follow the stream's end (train, then heldout)."""
    groups: dict[str, dict[str, Any]] = {split: {"index": 0, "documents": [], "chars": 0} for split in SPLITS}
    for number, document in enumerate(documents):
        split = "heldout" if _is_heldout(number, rate) else "train"
        group = groups[split]
        group["documents"].append(document.sentences)
        group["chars"] += sum(map(len, document.sentences))
        if group["chars"] >= shard_size:
            yield split, group["index"], group["documents"]
            groups[split] = {"index": group["index"] + 1, "documents": [], "chars": 0}
    for split, group in groups.items():
        if group["documents"]:
            yield split, group["index"], group["documents"]


def _build_groups(groups: Iterator[tuple[str, int, list]], dispatcher: _GroupDispatcher,
                  part: Part | None) -> None:
    try:
        for split, group, documents in groups:
            if part is None or part.owns(group):
                dispatcher.submit(split, group, documents)
        dispatcher.drain()
    except BrokenProcessPool:
        raise BertforgeError(
            "a data-preparation worker process died: out of memory, or the calling program cannot be re-imported "
            "by a spawned process (code typed at an interactive prompt or piped on stdin); run from a script "
            "file, or with workers=1. Completed shards are kept: rerun to resume"
        ) from None
    finally:
        dispatcher.close()


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
    part: Part | None = None,
    contiguous: bool = False,
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
        part: prepare only this part of a preparation split across processes or machines
            (`data.preparation_parts`); the last part to finish writes ``index.json``.
        contiguous: rows of consecutive text for MLM alone (`create_contiguous_instances`), not NSP pairs.

    Returns:
        A `PrepareReport`; its warnings are also logged. A part's report counts the part's shards, and its
        `merged` says whether ``index.json`` was written by this call.

    Raises:
        ConfigError: a setting is out of range. DataError: an input cannot be read as UTF-8 text, the corpus
        holds no text, or `out_dir` holds shards of another format version or other settings (with resume).
    """
    started = time.perf_counter()
    _check_settings(max_seq_length, short_seq_prob, dupe_factor, workers, shard_size, seed, segmenter, contiguous)
    files = resolve_inputs(inputs)
    rate = _heldout_rate(files, heldout_fraction, heldout_documents, format, max_document_sentences)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    checksum = vocab_checksum(tokenizer)
    settings = _settings(
        files, tokenizer, vocab_checksum=checksum, max_seq_length=max_seq_length, short_seq_prob=short_seq_prob,
        dupe_factor=dupe_factor, seed=seed, shard_size=shard_size, heldout_rate=str(rate), format=format,
        max_document_sentences=max_document_sentences, segmenter=segmenter, contiguous=contiguous,
    )
    owns, index_name = (None, INDEX_NAME) if part is None else (part.owns, part.index_name)
    records = _ShardRecords(out_dir, settings, tokenizer.vocab_size, checksum,
                            completed_shards(out_dir, settings, resume, owns, index_name), index_name)
    builder = _GroupBuilder(tokenizer, segmenter, out_dir, seed, max_seq_length, short_seq_prob, contiguous)
    dispatcher = _GroupDispatcher(builder, records, workers, dupe_factor)
    stats = CorpusStats()
    documents = read_documents(files, format=format, max_document_sentences=max_document_sentences, stats=stats)
    _build_groups(_groups(documents, rate, shard_size), dispatcher, part)
    if stats.documents == 0:
        raise DataError(f"no text found in {len(files)} input file(s) ({files[0]}, ...): every file is empty")
    run = {"input_bytes": sum(path.stat().st_size for path in files), "started": started,
           "written": records.written, "skipped": len(records.done)}
    if part is None:
        return finish_index(out_dir, records.index(complete=True), stats.to_dict(), **run)
    return _finish_part(records, stats, part, run)


def _finish_part(records: _ShardRecords, stats: CorpusStats, part: Part, run: dict) -> PrepareReport:
    """Mark the part's index complete, with the whole corpus's report (every part read all of it) for the
    merge; merge when every part has finished."""
    write_index(records.out_dir, records.index(complete=True, corpus=stats.to_dict()), records.index_name)
    report = report_of(records.out_dir, records.index(complete=True), stats.to_dict(), part=True, **run)
    report.part, report.merged = str(part), all_parts_finished(records.out_dir, part.count)
    if report.merged:
        merge_parts(records.out_dir, part.count)
    else:
        log.info("part %s of %s done; index.json is written when the last part finishes", part, records.out_dir)
    return report
