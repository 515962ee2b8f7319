"""Hard negatives mined from a corpus of any size: the corpus embedded by the embedding job, each anchor's nearest
texts found by the exact vector index, the pairs written shard by shard, resumable, shared among torchrun
processes, the same bytes whatever the number of processes (`bertforge mine-negatives --corpus`,
docs/embeddings.md).

Owns `mine_corpus`: which texts compete (the corpus, plus the pairs' own positives unless told otherwise), which
are never a pair's negative (its anchor, any positive of its anchor, a repeat of a better-ranked candidate:
texts compared with their whitespace collapsed), the shards of pairs and their folder. What a pair keeps of its
candidates (range, margins, sampling) is `negative_mining.choose_negatives`, shared with the in-memory
`mine_negatives`; the vectors are `embed_corpus`'s (the corpus into `corpus_vectors`, the positives into the
parts folder) and the ranking `vector_index.VectorIndex.search_vectors`; the anchors are embedded as
`vector_search` embeds queries.

Folders: `corpus_vectors` is an embedding folder (`bertforge embed --out`, normalized float32 vectors at the
mining's window): a complete one of the same model, corpus and options is used as it is, an unfinished one is
finished, another is refused by the embedding job's own check. ``<output>.parts/`` holds the run's
``manifest.json`` (what decides the pairs' negatives: the model's files, the pairs file's bytes, the corpus's
files and how they are read, the mining settings, the shard size, the window), ``positives.jsonl`` and its
vectors, and per shard of `shard_size` pairs ``mined-00000.jsonl`` then ``progress/shard-00000.json`` (its
counts), each written atomically: a shard is done when its record exists and the sizes match. A rerun skips
done shards; a rerun with another setting is refused, naming what changed. Once every shard is done rank 0
writes `output` (atomically) from the shards in order and removes the parts folder (the corpus vectors stay,
for the next mining).

Same bytes: a shard's negatives depend only on its pairs, the vectors and the settings, given the same batch
size, kind of device and intra-op thread count (torchrun sets OMP_NUM_THREADS=1): its anchors are embedded
together, the exact top-k breaks ties by row, and `sampling="random"` draws from a generator seeded by (seed,
shard). Rank r of N mines shards r, r+N, ... (`processes.Ranks`); nodes must share the folders.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from bertforge import storage
from bertforge.checkpoint_format import model_fingerprint
from bertforge.data.corpus_records import CorpusSettings, source_files
from bertforge.data.embedding import write_text_groups
from bertforge.engine.build import DEFAULT_KIND
from bertforge.errors import ConfigError
from bertforge.inference import pipelines
from bertforge.processes import Group, Ranks
from bertforge.retrieval.embed_corpus import embed_corpus
from bertforge.retrieval.negative_mining import (
    MinedNegative,
    MiningReport,
    MiningSettings,
    choose_negatives,
    corpus_of,
    output_rows,
)
from bertforge.retrieval.query_embedding import query_pipeline
from bertforge.retrieval.store import EmbedSettings, finished, progress_path
from bertforge.retrieval.vector_index import VectorIndex, top_k_merge
from bertforge.retrieval.vector_texts import record_texts
from bertforge.runtime import DEFAULT_PRECISION

log = logging.getLogger(__name__)

FORMAT_NAME = "bertforge-mining-parts"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
MINED_NAME = "mined-{:05d}.jsonl"  # .format(shard index)
POSITIVES_NAME = "positives.jsonl"
POSITIVE_VECTORS = "positive-vectors"
DEFAULT_SHARD_SIZE = 1_000  # pairs per shard
# Counts of `MiningReport` kept per shard and summed at the merge (pairs and corpus are the run's).
SHARD_COUNTS = ("rows", "short_pairs", "dropped_pairs", "removed_by_margin", "removed_as_equal")


def parts_folder(output: Path) -> Path:
    """Where the shards of `output` are written until they are merged into it."""
    return output.with_name(output.name + ".parts")


def corpus_vectors_folder(output: Path) -> Path:
    """The default folder of the corpus's vectors: beside the output, kept after the merge."""
    return output.with_name(output.name + ".corpus-vectors")


def same_text(text: str) -> str:
    """The form two texts are compared in: whitespace runs as one space, none at the ends."""
    return " ".join(text.split())


# --- the parts folder --------------------------------------------------------------------------------------

def new_manifest(model_dir: str | os.PathLike, pairs_file: Path, pairs_columns: Sequence[str], pairs: Sequence,
                 corpus: Path, corpus_settings: CorpusSettings, settings: MiningSettings, include_positives: bool,
                 shard_size: int, max_length: int | None, precision: str) -> dict[str, Any]:
    """What a resume must match (module docstring); the pairs file by its bytes, the corpus by its files'
    names, sizes and mtimes as the embedding job records them."""
    digest = hashlib.sha256(pairs_file.read_bytes()).hexdigest()
    files = [{"name": s.name, "size": s.path.stat().st_size, "mtime_ns": s.path.stat().st_mtime_ns}
             for s in source_files(corpus, corpus_settings)]
    return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "model": model_fingerprint(model_dir),
            "pairs": {"path": str(pairs_file.absolute()), "sha256": digest, "columns": list(pairs_columns),
                      "count": len(pairs)},
            "corpus": {"path": str(corpus.absolute()), "files": files, "settings": asdict(corpus_settings)},
            "mining": {**asdict(settings), "include_positives": include_positives}, "shard_size": shard_size,
            "max_length": max_length, "precision": precision}


def start_parts(parts: Path, manifest: dict[str, Any]) -> None:
    """Prepare the parts folder (rank 0, before any rank writes): `storage.start_parts`, naming what differs
    setting by setting for a folder of another mining run."""
    storage.start_parts(parts, manifest, what="unfinished mining shards", differences=manifest_changes,
                        subfolders=("progress",), manifest_name=MANIFEST_NAME)


def manifest_changes(existing: dict[str, Any], manifest: dict[str, Any]) -> list[str]:
    """What differs between two mining manifests, in words ("mining.range_max 50 -> 30", "another model")."""
    changes = []
    for key in sorted(set(existing) | set(manifest)):
        was, now = existing.get(key), manifest.get(key)
        if was == now:
            continue
        if key == "model":
            changes.append("another model")
        elif isinstance(was, dict) and isinstance(now, dict) and key in ("mining", "pairs"):
            changes += [f"{key}.{name} {was.get(name)!r} -> {now.get(name)!r}"
                        for name in sorted(set(was) | set(now)) if was.get(name) != now.get(name)]
        else:
            changes.append(f"the {key} changed" if isinstance(was, dict) else f"{key} {was!r} -> {now!r}")
    return changes


def write_positives(parts: Path, positives: Sequence[str]) -> Path:
    """The pairs' distinct positives as a JSONL corpus for the embedding job (rank 0); an identical file is left
    as it is, so that its vectors' folder resumes (the embedding job checks the file's size and mtime)."""
    path = parts / POSITIVES_NAME
    payload = "".join(json.dumps({"id": str(i), "text": t}, ensure_ascii=False) + "\n"
                      for i, t in enumerate(positives)).encode("utf-8")
    if not path.is_file() or path.read_bytes() != payload:
        storage.write_bytes(path, payload)
    return path


def write_shard(parts: Path, index: int, mined: Sequence[MinedNegative], report: MiningReport) -> None:
    """One shard's negatives (a JSON list per row: anchor, positive, negative, rank, both cosines), then its
    record with its counts, each atomically."""
    name = MINED_NAME.format(index)
    payload = "".join(json.dumps([m.anchor, m.positive, m.negative, m.rank, m.negative_score, m.positive_score],
                                 ensure_ascii=False) + "\n" for m in mined).encode("utf-8")
    storage.write_bytes(parts / name, payload)
    storage.write_json(progress_path(parts, index), {"index": index, "mined": name, "bytes": {"mined": len(payload)},
                                                     **{k: getattr(report, k) for k in SHARD_COUNTS}})


def read_shard(parts: Path, index: int) -> Iterator[MinedNegative]:
    with open(parts / MINED_NAME.format(index), encoding="utf-8") as handle:
        for line in handle:
            yield MinedNegative(*json.loads(line))


def merge_shards(parts: Path, output: Path, shards: int, output_format: str, report: MiningReport) -> MiningReport:
    """Write `output` from every shard in order (atomically), sum their counts into `report`, remove the parts
    folder; refused (and the parts removed) when no pair found a negative.

    Raises:
        ConfigError: a shard is missing (on several nodes: the folder is not on a filesystem they share), or no
        pair found a negative.
    """
    records = [finished(parts, index) for index in range(shards)]
    missing = [index for index, record in enumerate(records) if record is None]
    if missing:
        raise ConfigError(f"{parts}: shards {missing[:5]} are missing after every rank finished; on several nodes "
                          "--out must be in a folder every node sees (a shared filesystem); rerun to finish them")
    for key in SHARD_COUNTS:
        setattr(report, key, sum(record[key] for record in records))
    if report.rows == 0:
        shutil.rmtree(parts)
        raise ConfigError(f"no pair found a negative ({report.removed_by_margin} candidates were scored too close to "
                          "their positive): lower --relative-margin (a model not trained for sentence vectors gives "
                          "every pair a cosine near 1) or --margin, or widen --range-max")
    columns, rows = output_rows((m for index in range(shards) for m in read_shard(parts, index)), output_format)
    write_text_groups(output, columns, rows)
    shutil.rmtree(parts)
    return report


# --- ranking -------------------------------------------------------------------------------------------------

class Candidates:
    """The texts that compete for anchors' nearest: the corpus folder's rows, then (`include_positives`) the
    positives folder's, numbered on after them."""

    def __init__(self, corpus: VectorIndex, positives: VectorIndex, positive_texts: Sequence[str],
                 include_positives: bool):
        self.corpus, self.positives, self.positive_texts = corpus, positives, positive_texts
        self.include_positives = include_positives
        self.count = corpus.count + (positives.count if include_positives else 0)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best rows [Q, k] and scores of both folders together (ties: the lower row first)."""
        best = self.corpus.search_vectors(queries, min(k, self.corpus.count))
        if self.include_positives:
            scores, rows = self.positives.search_vectors(queries, min(k, self.positives.count))
            best = top_k_merge(np.concatenate([best[0], scores], axis=1),
                               np.concatenate([best[1], rows + self.corpus.count], axis=1), min(k, self.count))
        return best

    def texts(self, rows: np.ndarray) -> dict[int, str]:
        """The text of each row (corpus rows read back from its input, `vector_texts.record_texts`)."""
        wanted = {int(row) for row in np.asarray(rows).ravel()}
        found = record_texts(self.corpus.manifest, {row for row in wanted if row < self.corpus.count})
        return {**found, **{row: self.positive_texts[row - self.corpus.count] for row in wanted
                            if row >= self.corpus.count}}


def nearest_candidates(candidates: Candidates, vectors: np.ndarray, exclude: Sequence[set[str]], wanted: int,
                       report: MiningReport) -> list[list[tuple[str, float]]]:
    """Each anchor's first `wanted` candidates (text, cosine), best first, leaving out the texts of its
    `exclude` set and repeats of a better-ranked text (compared as `same_text`). Searched `wanted` plus its
    exclusions deep, then deeper (twice, again) for the anchors that lost more to repeats, so a list is
    complete whatever the corpus's duplicates (a deeper search replaces the shallower list whole)."""
    found: list[list[tuple[str, float]]] = [[] for _ in exclude]
    pending = list(range(len(exclude)))
    depth = min(candidates.count, wanted + max(len(e) for e in exclude))
    while pending:
        scores, rows = candidates.search(vectors[pending], depth)
        texts = candidates.texts(rows)
        deeper = []
        for a, row_scores, row_ids in zip(pending, scores, rows):
            kept, seen, skipped = [], set(exclude[a]), 0
            for row, score in zip(row_ids, row_scores):
                key = same_text(texts[int(row)])
                if key in seen:
                    skipped += 1
                    continue
                seen.add(key)
                kept.append((texts[int(row)], float(score)))
                if len(kept) == wanted:
                    break
            if len(kept) < wanted and depth < candidates.count:
                deeper.append(a)
            else:
                found[a] = kept
                report.removed_as_equal += skipped
        pending, depth = deeper, min(candidates.count, depth * 2)
    return found


def mine_shard(pairs: Sequence[tuple[str, str]], index: int, encode: Any, candidates: Candidates,
               positive_vectors: np.ndarray, positive_row: dict[str, int], own: dict[str, set[str]],
               settings: MiningSettings) -> tuple[list[MinedNegative], MiningReport]:
    """One shard's negatives, pair by pair (`encode`: anchor texts -> unit vectors [A, D])."""
    report = MiningReport()
    anchors = list(dict.fromkeys(anchor for anchor, _ in pairs))
    vectors = np.asarray(encode(anchors), dtype=np.float32)  # [A, D], normalized like the corpus
    exclude = [own[anchor] | {same_text(anchor)} for anchor in anchors]
    lists = nearest_candidates(candidates, vectors, exclude, settings.range_max, report)
    place = {anchor: i for i, anchor in enumerate(anchors)}
    generator = np.random.default_rng([settings.seed, index])
    mined: list[MinedNegative] = []
    for anchor, positive in pairs:
        a = place[anchor]
        positive_score = float(vectors[a] @ positive_vectors[positive_row[positive]])
        chosen = choose_negatives(lists[a][settings.range_min:], positive_score, settings, generator, report)
        mined += [MinedNegative(anchor, positive, text, rank, s, positive_score) for rank, text, s in chosen]
    report.rows = len(mined)
    return mined, report


def all_vectors(index: VectorIndex) -> np.ndarray:
    """Every vector of a (small, float32) embedding folder, [N, D] in row order."""
    return np.concatenate([np.asarray(index.shard_vectors(i), dtype=np.float32) for i in range(len(index.shards))])


# --- running ---------------------------------------------------------------------------------------------

def mine_corpus(model_dir: str | os.PathLike, pairs_file: str | os.PathLike, pairs: Sequence[tuple[str, str]],
                corpus: str | os.PathLike, output: str | os.PathLike, *, settings: MiningSettings,
                pairs_columns: Sequence[str] = ("anchor", "positive"), corpus_settings: CorpusSettings | None = None,
                corpus_vectors: str | os.PathLike | None = None, include_positives: bool = True,
                output_format: str = "triplet", shard_size: int = DEFAULT_SHARD_SIZE,
                batch_size: int = pipelines.DEFAULT_BATCH_SIZE, max_length: int | None = None, device: str = "auto",
                precision: str = DEFAULT_PRECISION, engine: str = DEFAULT_KIND,
                threads: int | None = None) -> MiningReport:
    """Mine negatives for `pairs` (read from `pairs_file`, its `pairs_columns`) from `corpus` into `output` (see
    the module docstring). Under torchrun every rank calls it with the same arguments and mines its share of the
    shards.

    Args:
        corpus: a text, TSV, CSV or JSONL file, or a folder of them, read as `bertforge embed --input` reads it
            (`corpus_settings`: format, text and id columns).
        corpus_vectors: the corpus's embedding folder (default: `<output>.corpus-vectors`).
        include_positives: the pairs' positives compete besides the corpus (never as their own anchor's).
        output_format: "triplet", "labeled-pair" or "labeled-list" (`negative_mining.output_rows`).
        shard_size: pairs per shard (the unit of sharing and of resuming).
        batch_size, max_length, device, precision, engine, threads: the pipeline's (`load_pipeline`).

    Returns:
        The run's counts (on every rank).

    Raises:
        DataError: a bad corpus record (file:line). ConfigError: a folder holds another run's vectors or shards,
        a setting is invalid, no pair found a negative, or another rank stopped.
    """
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise ConfigError(f"shard_size must be a positive integer, got {shard_size!r}")
    if not pairs:
        raise ConfigError(f"{pairs_file} holds no pair to mine negatives for")
    corpus, output = Path(corpus), Path(output)
    if not corpus.exists():
        raise ConfigError(f"{corpus}: no such file or folder; --corpus names the texts to mine from (a text, TSV, "
                          "CSV or JSONL file, or a folder of them)")
    corpus_settings = corpus_settings or CorpusSettings()
    parts = parts_folder(output)
    vectors_dir = Path(corpus_vectors) if corpus_vectors is not None else corpus_vectors_folder(output)
    positives, where = corpus_of(pairs)
    own: dict[str, set[str]] = {}
    for anchor, positive in pairs:
        own.setdefault(anchor, set()).add(same_text(positive))
    embedding = {"batch_size": batch_size, "max_length": max_length, "device": device, "precision": precision,
                 "threads": threads, "engine": engine, "embedding": EmbedSettings(normalize=True)}
    ranks = Ranks.from_env()
    with Group(ranks) as group:  # the embedding job's collectives run in this group
        manifest = new_manifest(model_dir, Path(pairs_file), pairs_columns, pairs, corpus, corpus_settings, settings,
                                include_positives, shard_size, max_length, precision)
        positives_file = group.from_main(lambda: (start_parts(parts, manifest), write_positives(parts, positives))[1])
        try:
            embed_corpus(model_dir, corpus, vectors_dir, settings=corpus_settings, **embedding)
        except ConfigError as error:
            raise ConfigError(f"--corpus-vectors {vectors_dir}: {error}") from None
        embed_corpus(model_dir, positives_file, parts / POSITIVE_VECTORS,
                     settings=CorpusSettings(file_format="jsonl"), **embedding)
        candidates = Candidates(VectorIndex(vectors_dir), VectorIndex(parts / POSITIVE_VECTORS), positives,
                                include_positives)
        positive_vectors = all_vectors(candidates.positives)
        pipeline, options = query_pipeline(candidates.corpus, device=str(ranks.device(device)), batch_size=batch_size,
                                           precision=precision)
        shards, started, done = -(-len(pairs) // shard_size), time.perf_counter(), 0
        for index in range(shards):
            if not ranks.owns(index) or finished(parts, index) is not None:
                continue
            chunk = pairs[index * shard_size:(index + 1) * shard_size]
            mined, counts = mine_shard(chunk, index, lambda texts: pipeline.encode(texts, **options), candidates,
                                       positive_vectors, where, own, settings)
            write_shard(parts, index, mined, counts)
            done += len(chunk)
            if ranks.rank == 0:  # one rank's progress: the others run at the same pace
                log.info("mining shard %d of %d done; rank 0 of %d: %.0f pairs/s", index + 1, shards,
                         ranks.world_size, done / (time.perf_counter() - started))
        group.gather(shards)  # the barrier before the merge
        report = MiningReport(pairs=len(pairs), corpus=candidates.count)
        return group.from_main(lambda: merge_shards(parts, output, shards, output_format, report))


__all__ = ["DEFAULT_SHARD_SIZE", "corpus_vectors_folder", "mine_corpus", "parts_folder", "same_text"]
