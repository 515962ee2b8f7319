"""A compressed token index over a multi-vector folder (`bertforge embed --multi-vector`), PLAID-like: built by
`bertforge index` (faiss, the `search` extra), kept beside the shards, and searched by `bertforge search` and
`POST /search` instead of scoring every document token by exact MaxSim (`multi_vector_search`).

Owns: building it (`build_token_index`, in parts that a killed build resumes), its files, extending it by the
shards `bertforge add` appends (`open_token_index`, `update_token_index`), opening it (memory-mapped) and searching
it (`TokenIndex.search_tokens`, the same ([Q, k] MaxSim scores, [Q, k] global rows) as
`MultiVectorIndex.search_tokens`).

What it stores: `--centroids` unit centroids found by faiss' spherical k-means on a seeded sample of the folder's
token vectors; each token as the id of its nearest centroid (by inner product, uint16 up to 65,536 centroids)
and its residual (the token less that centroid) coded by a faiss codec (`--residual`: "SQ4", faiss'
ScalarQuantizer at 4 bits a number, 64 bytes for 128 numbers, the default; "SQ8"; "PQ<m>", a product
quantizer of m bytes); per shard an inverted list: for each centroid, the tokens assigned to it.

How it searches a query (its token vectors, embedded with the query role):
1. candidates by token retrieval: each query token's `nprobe` best centroids; the tokens there, rebuilt from
   centroid + decoded residual, are scored against that query token and its best `probe_tokens` kept; their
   documents are the candidates, each estimated as the sum over query tokens of its best kept score, or, where
   none of its tokens was kept for a query token, that token's lowest kept score (the imputation of Lee et al.,
   2023, "XTR"); the best `candidates` go on. (PLAID's centroid interaction, every candidate's tokens replaced by
   their centroids, ranked the exact top 10 far worse: measured in docs/notes/token_index.md.)
2. approximate MaxSim (`families.colbert.maxsim`, the one home of it) against their tokens rebuilt from
   centroid + decoded residual; the best `rescore` go on;
3. exact MaxSim against the folder's own token vectors (`MultiVectorIndex.rescore`): the hits and their scores
   are exact search's, the index only decides which documents are scored.
Deleted rows and rows a filter excludes are dropped from the candidates; where fewer than k candidates remain,
the allowed rows are searched exactly.

Files: `token-index.json` beside the manifest (the commit point: the settings, the folder state it was built
from, each file's size and sha256) and the folder `token-index/`: `centroids.npy`, `codec.faiss`, `trained.json`
(what they were trained on), and per shard `cells-00000.npy` ([M] centroid ids), `residuals-00000.npy` ([M, code]
uint8), `lists-00000.npy` (the shard's token numbers, by centroid), `starts-00000.npy` ([C + 1], where each
centroid's list starts) with their record `part-00000.json`. Every file is written atomically and is a pure function of the
folder and the settings (no time, no thread count): a build killed at any step, run again, reuses the trained
files and finished parts it finds intact and ends with the same bytes as a build never killed.

Memory: the sample (at most `centroids` x `sample_per_centroid` vectors) while training, then one block of
`BLOCK_TOKENS` vectors and one shard's codes at a time; at search the parts are memory-mapped, only the centroids
and the codec are read into memory.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge import storage
from bertforge.errors import ConfigError
from bertforge.families.colbert import maxsim
from bertforge.retrieval.index_sources import files_problem
from bertforge.retrieval.multi_vector_search import MultiVectorIndex, padded_queries
from bertforge.retrieval.store import VectorFolder
from bertforge.retrieval.vector_ann import import_faiss
from bertforge.retrieval.vector_index import check_top_k, top_k_merge

log = logging.getLogger(__name__)

RECORD_NAME = "token-index.json"
FOLDER_NAME = "token-index"
FORMAT_NAME = "bertforge-token-index"
FORMAT_VERSION = 2  # 2: token lists per centroid (1 listed documents)
CENTROIDS_NAME, CODEC_NAME, TRAINED_NAME = "centroids.npy", "codec.faiss", "trained.json"
PART_FILES = {"cells": "cells-{:05d}.npy", "residuals": "residuals-{:05d}.npy", "lists": "lists-{:05d}.npy",
              "starts": "starts-{:05d}.npy"}
PART_RECORD = "part-{:05d}.json"
PART_FILE = re.compile(r"^(?:cells|residuals|lists|starts|part)-(\d{5})\.(?:npy|json)$")
BLOCK_TOKENS = 1 << 16  # token vectors read, assigned and coded at once while building
CODEC = re.compile(r"^(?:SQ4|SQ8|PQ\d+)$")
TRAINING = ("centroids", "residual", "sample_per_centroid", "iterations", "seed")  # what the trained files depend on


@dataclass(frozen=True)
class TokenIndexSettings:
    """How a token index is built (`TRAINING`) and searched by default (nprobe, probe_tokens, candidates,
    rescore: the module docstring's three steps).

    centroids: k-means centroids (None: the power of two at most 4 x sqrt(tokens), 8,192 for 5 million tokens);
    residual: the faiss codec of residuals ("SQ4", "SQ8", "PQ<m>"); sample_per_centroid: token vectors sampled per
    centroid for training; iterations: k-means iterations; seed: the sample's and k-means' seed. nprobe: centroids
    probed per query token; probe_tokens: tokens kept per query token; candidates: documents scored from centroid
    + residual; rescore: documents scored exactly.
    """

    centroids: int | None = None
    residual: str = "SQ4"
    sample_per_centroid: int = 32
    iterations: int = 20
    seed: int = 0
    nprobe: int = 16
    probe_tokens: int = 1024
    candidates: int = 4096
    rescore: int = 256

    def __post_init__(self) -> None:
        for name in ("centroids", "sample_per_centroid", "iterations", "nprobe", "probe_tokens", "candidates",
                     "rescore"):
            value = getattr(self, name)
            if value is None and name == "centroids":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"token index: {name} must be a positive integer, got {value!r}")
        if not isinstance(self.residual, str) or not CODEC.match(self.residual):
            raise ConfigError(f"token index: residual must be SQ4, SQ8 or PQ<bytes> (faiss codecs), got "
                              f"{self.residual!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"token index: seed must be an integer, got {self.seed!r}")


def auto_centroids(tokens: int) -> int:
    """The default number of centroids: the largest power of two at most 4 x sqrt(tokens) (at least 1)."""
    return 1 << max(0, int(np.floor(np.log2(max(1.0, 4 * np.sqrt(tokens))))))


def shards_key(folder: VectorFolder, shards: int | None = None) -> str:
    """sha256 over what decides the indexed tokens: each shard's token vectors and offsets files (their recorded
    sha256) and row count, in order (the first `shards`), the dtype and width."""
    parts = {"dtype": folder.manifest["dtype"], "dim": folder.dim,
             "shards": [[s["sha256"]["multivectors"], s["sha256"]["offsets"], s["count"]]
                        for s in folder.shards[:shards]]}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def shard_key(folder: VectorFolder, index: int) -> list[Any]:
    shard = folder.shards[index]
    return [shard["sha256"]["multivectors"], shard["sha256"]["offsets"], shard["count"]]


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def write_files(home: Path, payloads: dict[str, bytes]) -> dict[str, dict[str, Any]]:
    """Write each payload atomically under its name in `home`; their {"sha256", "bytes"}."""
    for name, payload in payloads.items():
        storage.write_bytes(home / name, payload)
    return {name: {"sha256": hashlib.sha256(payload).hexdigest(), "bytes": len(payload)}
            for name, payload in payloads.items()}


def read_record(path: Path) -> dict[str, Any] | None:
    """A JSON record of the index (None: missing or unreadable, then rebuilt)."""
    try:
        record = storage.read_json(path, what="token index record")
    except (FileNotFoundError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def token_blocks(rows: Any) -> Any:
    """(first token, float32 block) of one shard's token vectors, `BLOCK_TOKENS` at a time."""
    for start in range(0, len(rows.tokens), BLOCK_TOKENS):
        yield start, np.array(rows.tokens[start:start + BLOCK_TOKENS], dtype=np.float32)


# --- building ---------------------------------------------------------------------------------------------------

@dataclass
class Trained:
    """The centroids, their faiss inner-product index (nearest centroid) and the residual codec."""

    centroids: np.ndarray
    nearest: Any
    codec: Any
    digest: str  # sha256 of trained.json: what each part was coded with

    def assign(self, block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(centroid ids [n], residual codes [n, code]) of float32 token vectors [n, D]."""
        _, nearest = self.nearest.search(block, 1)
        cells = nearest[:, 0].astype(np.int64)
        return cells, self.codec.sa_encode(np.ascontiguousarray(block - self.centroids[cells]))

    def decode(self, cells: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """The approximate token vectors [n, D] float32: centroid + decoded residual."""
        return self.centroids[cells] + self.codec.sa_decode(np.ascontiguousarray(codes))


def loaded_trained(home: Path, record: dict[str, Any]) -> Trained:
    faiss = import_faiss()
    centroids = np.load(home / CENTROIDS_NAME, allow_pickle=False).astype(np.float32)
    codec = faiss.deserialize_index(np.frombuffer((home / CODEC_NAME).read_bytes(), dtype=np.uint8))
    nearest = faiss.IndexFlatIP(centroids.shape[1])
    nearest.add(centroids)
    digest = storage.file_sha256(home / TRAINED_NAME)
    return Trained(centroids, nearest, codec, digest)


def trained_problem(home: Path, record: Any, wanted: dict[str, Any]) -> str | None:
    """Why `trained.json` (and the files it names) cannot be reused for `wanted` (its settings and folder key)."""
    if record is None:
        return "not trained yet"
    if {key: record.get(key) for key in wanted} != wanted:
        return "trained with other settings or on another state of the folder"
    return files_problem(home, record.get("files"), TRAINED_NAME)


def train(folder: VectorFolder, home: Path, settings: TokenIndexSettings) -> Trained:
    """The centroids and codec of `settings` for the folder, reused from `home` when trained there already on
    its present state; else trained on a seeded sample of its token vectors (streamed: only the sample is held)."""
    wanted = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "shards_key": shards_key(folder),
              "settings": {name: getattr(settings, name) for name in TRAINING}}
    record = read_record(home / TRAINED_NAME)
    problem = trained_problem(home, record, wanted)
    if problem is None:
        return loaded_trained(home, record)
    faiss = import_faiss()
    total = sum(int(s.get("vector_count", folder.shard_token_rows(i).offsets[-1])) for i, s in enumerate(folder.shards))
    if total == 0:
        raise ConfigError(f"{folder.directory} holds no token vectors to index")
    count = min(settings.centroids or auto_centroids(total), total)
    wanted_sample = min(total, count * settings.sample_per_centroid)
    rng, sample = np.random.default_rng(settings.seed), []
    for index in range(len(folder.shards)):
        for _, block in token_blocks(folder.shard_token_rows(index)):
            sample.append(block if wanted_sample == total else block[rng.random(len(block)) < wanted_sample / total])
    points = np.ascontiguousarray(np.concatenate(sample))
    del sample
    count = min(count, len(points))
    kmeans = faiss.Kmeans(folder.dim, count, niter=settings.iterations, seed=settings.seed, spherical=True,
                          min_points_per_centroid=1, max_points_per_centroid=max(len(points), 1))
    kmeans.train(points)
    centroids = np.ascontiguousarray(kmeans.centroids, dtype=np.float32)
    index = faiss.IndexFlatIP(folder.dim)
    index.add(centroids)
    _, nearest = index.search(points, 1)
    codec = faiss.index_factory(folder.dim, settings.residual, faiss.METRIC_INNER_PRODUCT)
    codec.train(np.ascontiguousarray(points - centroids[nearest[:, 0]]))
    files = write_files(home, {CENTROIDS_NAME: npy_bytes(centroids),
                               CODEC_NAME: faiss.serialize_index(codec).tobytes()})
    storage.write_json(home / TRAINED_NAME, {**wanted, "centroids": count, "sample": len(points),
                                             "code_bytes": int(codec.sa_code_size()), "faiss": faiss.__version__,
                                             "files": files})
    log.info("token index: %d centroids and a %s residual codec trained on %d of %d token vectors", count,
             settings.residual, len(points), total)
    return loaded_trained(home, read_record(home / TRAINED_NAME))


def encode_part(folder: VectorFolder, home: Path, index: int, trained: Trained) -> dict[str, Any]:
    """Shard `index`'s part (its tokens' centroid ids and residual codes, its inverted lists) and its record,
    reused when `home` holds it already, coded with `trained`, intact."""
    path = home / PART_RECORD.format(index)
    wanted = {"part": index, "shard": shard_key(folder, index), "trained": trained.digest}
    record = read_record(path)
    if record is not None and {key: record.get(key) for key in wanted} == wanted \
            and files_problem(home, record.get("files"), path.name) is None:
        return record
    rows = folder.shard_token_rows(index)
    cell_dtype = np.uint16 if len(trained.centroids) <= 1 << 16 else np.int32
    cells = np.empty(len(rows.tokens), dtype=cell_dtype)
    codes = np.empty((len(rows.tokens), trained.codec.sa_code_size()), dtype=np.uint8)
    for start, block in token_blocks(rows):
        cells[start:start + len(block)], codes[start:start + len(block)] = trained.assign(block)
    lists = np.argsort(cells, kind="stable").astype(np.int32)  # the tokens by centroid, in token order within one
    starts = np.searchsorted(cells[lists], np.arange(len(trained.centroids) + 1)).astype(np.int64)
    arrays = {"cells": cells, "residuals": codes, "lists": lists, "starts": starts}
    files = write_files(home, {PART_FILES[kind].format(index): npy_bytes(array) for kind, array in arrays.items()})
    record = {**wanted, "tokens": len(cells), "entries": len(lists), "files": files}
    storage.write_json(path, record)
    return record


def index_record(folder: VectorFolder, home: Path, settings: TokenIndexSettings, trained: Trained,
                 parts: list[dict[str, Any]]) -> dict[str, Any]:
    """`token-index.json`: the settings, the folder state, the trained files' and every part's files."""
    files = {f"{FOLDER_NAME}/{name}": entry for part in parts for name, entry in part["files"].items()}
    trained_record = read_record(home / TRAINED_NAME)
    for name, entry in {**trained_record["files"], TRAINED_NAME: storage.file_record(home / TRAINED_NAME)}.items():
        files[f"{FOLDER_NAME}/{name}"] = entry
    tokens = sum(part["tokens"] for part in parts)
    size = sum(entry["bytes"] for entry in files.values())
    return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "kind": "plaid", "settings": asdict(settings),
            "centroids": int(len(trained.centroids)), "code_bytes": int(trained.codec.sa_code_size()),
            "shards_key": shards_key(folder), "shards": len(folder.shards), "count": folder.count, "tokens": tokens,
            "bytes": size, "bytes_per_token": round(size / max(tokens, 1), 3), "files": files}


def sweep_parts(home: Path, shards: int) -> None:
    """Remove the part files of shards past `shards` (a folder compacted into fewer shards)."""
    for path in home.iterdir() if home.is_dir() else ():
        match = PART_FILE.match(path.name)
        if match is not None and int(match[1]) >= shards:
            path.unlink(missing_ok=True)


def build_token_index(directory: str | os.PathLike, settings: TokenIndexSettings | None = None,
                      ) -> dict[str, Any]:
    """Build (or finish building) the token index of a complete multi-vector folder; return its record.

    The trained files, then each shard's part, then `token-index.json` (the commit point), each atomically: a
    build killed at any step leaves the folder searched as before (exactly, or through the index it had, unless
    this build has other settings or the folder changed since: that record is removed first), and the same
    command run again reuses what is intact and ends with the bytes of a build never killed.

    Raises:
        ConfigError: not a complete multi-vector folder, a bad setting, a shard that is not what the manifest
            records, or faiss missing.
    """
    settings = settings or TokenIndexSettings()
    folder = MultiVectorIndex(directory)
    import_faiss()
    home, commit = folder.directory / FOLDER_NAME, folder.directory / RECORD_NAME
    home.mkdir(exist_ok=True)
    storage.remove_stale_temporaries(home)
    storage.remove_stale_temporaries(folder.directory, RECORD_NAME)
    existing = read_record(commit)
    if existing is not None and (existing.get("settings") != asdict(settings)
                                 or existing.get("shards_key") != shards_key(folder)):
        commit.unlink()  # that index no longer describes what will be in token-index/: searches go exact meanwhile
    trained = train(folder, home, settings)
    parts = [encode_part(folder, home, index, trained) for index in range(len(folder.shards))]
    record = index_record(folder, home, settings, trained, parts)
    storage.write_json(commit, record)
    sweep_parts(home, len(folder.shards))
    log.info("token index of %d token vectors (%d documents): %d centroids, %.1f bytes a token, %s", record["tokens"],
             record["count"], record["centroids"], record["bytes_per_token"], commit)
    return record


# --- opening and searching --------------------------------------------------------------------------------------

@dataclass
class Part:
    """One shard's part, memory-mapped."""

    base: int  # the shard's first global row
    offsets: np.ndarray  # the shard's [n + 1] token offsets
    cells: np.ndarray
    residuals: np.ndarray
    lists: np.ndarray
    starts: np.ndarray


def spans(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The indices starts[i]..stops[i]-1 of every i, one after another."""
    lengths = stops - starts
    total = int(lengths.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths) + np.repeat(starts,
                                                                                                           lengths)


class TokenIndex:
    """A multi-vector folder's token index, opened (`open_token_index`): parts memory-mapped."""

    def __init__(self, folder: MultiVectorIndex, record: dict[str, Any]):
        self.folder, self.record = folder, record
        self.settings = TokenIndexSettings(**record["settings"])
        home = folder.directory / FOLDER_NAME
        self.trained = loaded_trained(home, read_record(home / TRAINED_NAME) or {})
        self.parts = []
        for index in range(record["shards"]):
            arrays = {kind: np.load(home / name.format(index), mmap_mode="r", allow_pickle=False)
                      for kind, name in PART_FILES.items()}
            self.parts.append(Part(int(folder.offsets[index]), folder.shard_token_rows(index).offsets, **arrays))

    def candidates(self, query: np.ndarray, nprobe: int, keep: int,
                   allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """(sorted global rows, their estimated MaxSim) of the documents found by token retrieval (module docstring,
        step 1) for one query [q, D]: each query token's `keep` best tokens among its `nprobe` centroids' lists;
        rows not `allowed` left out."""
        centroids = self.trained.centroids
        count = len(query)
        nprobe = min(nprobe, len(centroids))
        probed = np.argpartition(-(query @ centroids.T), nprobe - 1, axis=1)[:, :nprobe]  # [q, nprobe]
        own = np.zeros((count, len(centroids)), dtype=bool)  # which query tokens probed each centroid
        own[np.arange(count)[:, None], probed] = True
        union = np.flatnonzero(own.any(axis=0))
        best = np.full((count, 0), -np.inf, dtype=np.float32)  # the kept scores [q, <= keep] and their rows
        best_rows = np.zeros((count, 0), dtype=np.int64)
        for part in self.parts:
            listed = spans(part.starts[union], part.starts[union + 1])
            for block in range(0, len(listed), BLOCK_TOKENS):  # bounds the decoded vectors and their scores
                tokens = np.asarray(part.lists[listed[block:block + BLOCK_TOKENS]], dtype=np.int64)
                cells = np.asarray(part.cells[tokens], dtype=np.int64)
                scores = query @ self.trained.decode(cells, part.residuals[tokens]).T  # [q, t]
                scores[~own[:, cells]] = -np.inf  # a token counts for the query tokens that probed its centroid
                rows = np.searchsorted(part.offsets, tokens, side="right") - 1 + part.base  # [t]
                if allowed is not None:
                    scores[:, ~allowed[rows]] = -np.inf
                best = np.concatenate([best, scores], axis=1)
                best_rows = np.concatenate([best_rows, np.broadcast_to(rows, scores.shape)], axis=1)
                if best.shape[1] > keep:
                    kept = np.argpartition(-best, keep - 1, axis=1)[:, :keep]
                    best, best_rows = np.take_along_axis(best, kept, 1), np.take_along_axis(best_rows, kept, 1)
        found = best > -np.inf
        found_rows = np.unique(best_rows[found])
        if not len(found_rows):
            return found_rows, np.zeros(0, dtype=np.float32)
        # per query token, a document none of whose tokens was kept gets the lowest kept score (0: none kept)
        floor = np.where(found.any(axis=1), np.where(found, best, np.inf).min(axis=1), 0.0).astype(np.float32)
        estimate = np.full((count, len(found_rows)), -np.inf, dtype=np.float32)
        token, slot = np.nonzero(found)
        np.maximum.at(estimate, (token, np.searchsorted(found_rows, best_rows[token, slot])), best[token, slot])
        return found_rows, np.where(estimate > -np.inf, estimate, floor[:, None]).sum(axis=0)

    def approximate(self, query: torch.Tensor, mask: torch.Tensor, rows: np.ndarray) -> np.ndarray:
        """MaxSim [n] of one padded query against documents `rows` rebuilt from centroid + residual (step 2)."""
        shard_of = np.searchsorted(self.folder.offsets, rows, side="right") - 1
        order = np.argsort(shard_of, kind="stable")  # read shard by shard, scored in that order, put back
        vectors, lengths = [], []
        for shard in np.unique(shard_of):
            part = self.parts[shard]
            local = rows[order][shard_of[order] == shard] - part.base
            first, last = part.offsets[local], part.offsets[local + 1]
            tokens = spans(first, last)
            vectors.append(self.trained.decode(np.asarray(part.cells[tokens], dtype=np.int64),
                                               part.residuals[tokens]))
            lengths.append(last - first)
        owner = np.repeat(np.arange(len(rows)), np.concatenate(lengths))
        scores = np.empty(len(rows), dtype=np.float32)
        scores[order] = maxsim(query, mask, torch.from_numpy(np.concatenate(vectors)), torch.from_numpy(owner),
                               len(rows)).numpy()[0]
        return scores

    def search_tokens(self, queries: list[np.ndarray], top_k: int, rows: np.ndarray | None = None, *,
                      nprobe: int | None = None, probe_tokens: int | None = None, candidates: int | None = None,
                      rescore: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """([Q, k] exact MaxSim scores, [Q, k] global rows), best first (equal scores: lower row first), of the
        documents the index finds for queries [q_i, D] (embedded with the query role), among the live rows (and
        `rows`, [count] bool, when given); nprobe, probe_tokens, candidates, rescore: the index's settings unless
        given."""
        check_top_k(top_k)
        settings = TokenIndexSettings(**{**asdict(self.settings), **{name: value for name, value in (
            ("nprobe", nprobe), ("probe_tokens", probe_tokens), ("candidates", candidates), ("rescore", rescore))
            if value is not None}})
        allowed = self.folder.allowed(rows)
        k = min(top_k, self.folder.live_count if allowed is None else int(allowed.sum()))
        all_scores = np.zeros((len(queries), k), np.float32)
        all_rows = np.zeros((len(queries), k), np.int64)
        for q, query in enumerate(queries):
            padded, mask = padded_queries([query], self.folder.dim)
            found, approximate = self.candidates(np.asarray(query, dtype=np.float32), settings.nprobe,
                                                 settings.probe_tokens, allowed)
            if len(found) < k:  # few rows allowed, or few candidates: the exact top k of the allowed rows
                scores, best = self.folder.search_tokens([query], top_k, rows=rows)
            else:
                _, found = top_k_merge(approximate[None, :].astype(np.float32), found[None, :],
                                       min(len(found), max(settings.candidates, k)))
                approximate = self.approximate(padded, mask, found[0])
                _, found = top_k_merge(approximate[None, :], found, min(found.shape[1], max(settings.rescore, k)))
                scores, best = top_k_merge(self.folder.rescore([query], found), found, k)
            all_scores[q], all_rows[q] = scores[0], best[0]
        return all_scores, all_rows


def index_problem(folder: VectorFolder, record: Any) -> str | None:
    """What makes `token-index.json` unusable for the folder as it is (another version, another state of the
    folder, a file that is not the one built), or None; appended shards are not a problem (`appended_from`)."""
    if not isinstance(record, dict) or record.get("format") != FORMAT_NAME or record.get("version") != FORMAT_VERSION:
        return f"{RECORD_NAME} is not a bertforge token index of this version"
    try:
        TokenIndexSettings(**record["settings"])
    except (KeyError, TypeError, ConfigError):
        return f"{RECORD_NAME} records no valid settings"
    if record.get("shards_key") != shards_key(folder) and appended_from(folder, record) is None:
        return (f"it was built from another state of the folder ({record.get('count')} rows in "
                f"{record.get('shards')} shards then, {folder.count} rows in {len(folder.shards)} now: re-embedded "
                "or compacted since)")
    return files_problem(folder.directory, record.get("files"), RECORD_NAME)


def appended_from(folder: VectorFolder, record: dict[str, Any]) -> int | None:
    """The shards an index was built from when the folder's later shards were added since (`bertforge add`)."""
    first = record.get("shards")
    if isinstance(first, int) and 0 < first < len(folder.shards) and record.get("shards_key") == shards_key(folder,
                                                                                                           first):
        return first
    return None


def extend_index(folder: MultiVectorIndex, record: dict[str, Any]) -> dict[str, Any]:
    """The index of a folder grown by `bertforge add`: the new shards coded with the trained centroids and codec
    (nothing is trained again), then a new `token-index.json`."""
    home = folder.directory / FOLDER_NAME
    trained = loaded_trained(home, read_record(home / TRAINED_NAME) or {})
    settings = TokenIndexSettings(**record["settings"])
    parts = [encode_part(folder, home, index, trained) for index in range(len(folder.shards))]
    extended = index_record(folder, home, settings, trained, parts)
    storage.write_json(folder.directory / RECORD_NAME, extended)
    log.info("%s: token index extended to %d shards", folder.directory, len(folder.shards))
    return extended


def open_token_index(folder: MultiVectorIndex) -> TokenIndex | None:
    """The folder's token index, None when it has none (searched exactly then); one built before shards were
    added is extended by them first (and saved).

    Raises:
        ConfigError: the index is not the folder's as it is now (built from another state of it, a file missing
            or changed: the message names it and the command that builds it again), or faiss is missing.
    """
    path = folder.directory / RECORD_NAME
    if not path.exists():
        return None
    try:
        record = storage.read_json(path, what="token index record")
        problem = index_problem(folder, record)
    except ValueError as error:
        record, problem = None, str(error)
    if problem is not None:
        raise ConfigError(f"{path}: {problem}; run `bertforge index --index {folder.directory}` to build the token "
                          "index again, or search with --exact")
    import_faiss()
    if appended_from(folder, record) is not None:
        try:
            record = extend_index(folder, record)
        except OSError as error:
            raise ConfigError(f"{path}: the folder gained shards since the token index was built and it cannot be "
                              f"extended here ({error}); run `bertforge index --index {folder.directory}` where the "
                              "folder is writable, or search with --exact") from None
    return TokenIndex(folder, record)


def update_token_index(directory: Path, rebuild: bool = False) -> None:
    """After `bertforge add` (extend by the new shards) or `compact` (`rebuild`: trained again from the compacted
    shards with the recorded settings); nothing without an index."""
    record = read_record(directory / RECORD_NAME)
    if record is None:
        return
    if rebuild:
        known = {f.name for f in fields(TokenIndexSettings)}
        build_token_index(directory, TokenIndexSettings(**{k: v for k, v in record.get("settings", {}).items()
                                                           if k in known}))
    else:
        open_token_index(MultiVectorIndex(directory))


__all__ = ["FOLDER_NAME", "RECORD_NAME", "TokenIndex", "TokenIndexSettings", "build_token_index",
           "open_token_index", "update_token_index"]
