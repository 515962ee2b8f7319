"""Embedding a corpus of any size into vector shards: streamed, resumable after a crash, shared among
torchrun processes, the same shards whatever the number of processes (docs/embeddings.md).

Owns: the output folder and its manifest (`start_output`, `finish_output`), what a resume must match
(`identity`), and `embed_corpus`. Which process embeds which shard is `bertforge.processes` (`Ranks`,
`Group`); how files become (id, text) records and shards is `data.corpus_records`; `vector_search` reads
the output.

Output: per shard `vectors-00000.npy` ([n, D], record order; sparse runs: `indptr-`, `terms-` and `weights-00000.npy`,
compressed rows, `retrieval.sparse_vectors`), `ids-00000.jsonl` (JSON strings), then
`progress/shard-00000.json` (count, tokens, sizes, sha256), each atomically (`storage`): a shard is done when
its record exists and the sizes match. Rank 0 writes `manifest.json` before any shard ("complete": false)
and once every rank has finished (every shard's record, "complete": true). After a `kill -9` at any moment
the rerun removes temporary files (rank 0, before any rank writes), skips done shards and rewrites the rest
with the same bytes: a shard's bytes depend only on its records and the settings (its windows batched by
length, the same batches every run) given the same batch size, kind of device and intra-op thread count
(torchrun sets OMP_NUM_THREADS=1; other thread counts move vectors by float rounding, about 1e-7). A rerun
with another model, embedding options, dtype, shard size, input settings or input files (names, sizes,
mtimes) is refused, naming what changed.

Long texts: a text longer than the model's window is cut to it, the rule of every embedding route of the server
(`wire_inputs`), and said: the progress display counts the cut texts, each shard's record and the final
manifest hold "truncated" (the manifest also "truncate", the setting), and a warning names the first one;
`truncate=False` (`--truncate false`) refuses the run before any model work, naming the first over-long
text's file and line (`check_fit`). `--chunk` embeds whole texts as several vectors instead.

Processes: rank r of N embeds shards r, r+N, ...; every rank reads every line to count records but parses
and tokenizes only its own. The ranks meet in a gloo group (CPU collectives, whatever the device) after rank
0 has prepared the folder, and at the end, when rank 0 checks every shard's record and writes the manifest;
nodes must share the folder. Memory is flat in the corpus size: one shard at a time.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from bertforge import storage
from bertforge.checkpoint_format import tokenizer_source, weights_file
from bertforge.data.corpus_records import (
    INPUT_FORMATS,
    CorpusSettings,
    Record,
    SourceFile,
    parse_record,
    read_records,
    shard_chunks,
    source_files,
)
from bertforge.engine.build import DEFAULT_KIND
from bertforge.errors import ConfigError, DataError, InputError
from bertforge.inference import pipelines
from bertforge.inference.pipelines import EmbedPipeline, feature_tokens
from bertforge.inference.wire_inputs import AUTO_TRUNCATE, EmbedText, Fix, noting_cuts, text_window
from bertforge.metrics.sparse import SparseRows
from bertforge.processes import Group, Ranks
from bertforge.retrieval.sparse_vectors import SPARSE_FILES, SPARSE_TASK, encode_sparse_parsed, sparse_arrays
from bertforge.retrieval.text_chunks import check_chunking, chunk_spans, late_chunk_vectors, per_text
from bertforge.retrieval.vector_quantization import (
    DEFAULT_CALIBRATION_SIZE,
    QUANTIZED_DTYPES,
    calibrate,
    coded,
)
from bertforge.runtime import DEFAULT_PRECISION

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
PROGRESS_DIR = "progress"
FORMAT_NAME = "bertforge-embeddings"
FORMAT_VERSION = 1
DEFAULT_SHARD_SIZE = 10_000
DTYPES = ("float32", "float16", *QUANTIZED_DTYPES)
# Files of a model directory that decide its vectors (a README or an ONNX export beside them do not).
MODEL_FILES = ("config.json", "vocab.txt", "tokenizer_config.json", "*.safetensors", "*.safetensors.index.json",
               "pytorch_model*.bin")



VECTORS_NAME = "vectors-{:05d}.npy"  # .format(shard index)
IDS_NAME = "ids-{:05d}.jsonl"
SPANS_NAME = "spans-{:05d}.jsonl"  # --chunk runs: [record, start, end] of each row (its record's characters)
CODES_NAME = "codes-{:05d}.npy"  # binary shards: the int8 codes that rescore their candidates


def progress_path(out: Path, index: int) -> Path:
    return out / PROGRESS_DIR / f"shard-{index:05d}.json"


# --- the output folder -----------------------------------------------------------------------------------

def model_fingerprint(model_dir: str | os.PathLike) -> str:
    """sha256 over the files that decide a model's vectors (config, tokenizer, weights): a moved copy of the
    same model has the same fingerprint, a retrained one another."""
    folder = Path(model_dir)
    files = {weights_file(folder), *(path for pattern in MODEL_FILES for path in folder.glob(pattern))}
    vocabulary = tokenizer_source(folder)  # tokenizer.json where there is no vocab.txt (sentence-transformers 6)
    if vocabulary.is_file():
        files.add(vocabulary)
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(f"{path.relative_to(folder).as_posix()}\0{path.stat().st_size}\0".encode())
        with open(path, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def identity(manifest: dict[str, Any]) -> dict[str, Any]:
    """What a resume must match: the model's files, the embedding options, the output's dtype and shard
    size, how the input is read and the input files themselves (the batch size and device may change: they
    move vectors only by float rounding)."""
    return {"format": [manifest["format"], manifest["version"]], "model": manifest["model"]["fingerprint"],
            "kind": manifest.get("kind", "dense"), "chunking": manifest.get("chunking"),
            "embedding": manifest["embedding"], "dtype": manifest["dtype"], "shard_size": manifest["shard_size"],
            "input settings": manifest["input"]["settings"], "input files": manifest["input"]["files"]}


def describe_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Plain phrases for the identity keys that differ between a manifest and this run."""
    changes = []
    for key, was in identity(old).items():
        now = identity(new)[key]
        if was == now:
            continue
        if key == "model":
            changes.append(f"another model (the folder's was {old['model']['path']})")
        elif key == "input files":
            before, after = ({f["name"]: f for f in files} for files in (was, now))
            names = sorted(set(before) ^ set(after)) or [n for n in after if before[n] != after[n]]
            changes.append(f"the input files changed ({', '.join(names[:3])})")
        elif isinstance(was, dict):
            changes += [f"{name} {was.get(name)!r} -> {now.get(name)!r}" for name in sorted(set(was) | set(now))
                        if was.get(name) != now.get(name)]
        else:
            changes.append(f"{key} {was!r} -> {now!r}")
    return changes


def new_manifest(model_dir: str | os.PathLike, pipeline: EmbedPipeline, options: dict[str, Any], prompt: str,
                 inputs: str | os.PathLike, sources: Sequence[SourceFile], settings: CorpusSettings,
                 shard_size: int, dtype: str) -> dict[str, Any]:
    """The manifest of a run before any shard: its identity, "complete": false. The width of dense vectors is
    that of a probe's (pooling modes may be concatenated); that of sparse ones the vocabulary's ("kind":
    "sparse", scored by dot product)."""
    stats = [(source.name, source.path.stat()) for source in sources]
    files = [{"name": name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns} for name, stat in stats]
    sparse = pipeline.task == SPARSE_TASK
    return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "complete": False,
            "model": {"path": str(Path(model_dir).resolve()), "fingerprint": model_fingerprint(model_dir)},
            "kind": "sparse" if sparse else "dense",
            # the options that make the vectors (not those of how a result is shown: tokens, token_vectors)
            "embedding": {**{k: v for k, v in options.items() if k not in ("tokens", "token_vectors")},
                          "prompt": prompt, "max_length": pipeline.max_length, "precision": pipeline.precision},
            "similarity": "dot" if sparse or not options["normalize"] else "cosine",
            "dim": pipeline.config.vocab_size if sparse else
            int(pipeline.encode(["probe"], prompt=prompt, **options).shape[1]),
            "dtype": dtype, "shard_size": shard_size,
            # absolute, not resolved: the files are named as the user named them (a symlinked input keeps its
            # name, which --show-text looks up again)
            "input": {"path": str(Path(inputs).absolute()), "files": files,
                      "settings": {**asdict(settings), "single_file": Path(inputs).is_file()}},
            "count": None, "tokens": None, "truncated": None, "shards": []}


def read_manifest(out: Path) -> dict[str, Any] | None:
    """The folder's manifest, None when it has none."""
    try:
        manifest = storage.read_json(out / MANIFEST_NAME, what="embedding manifest")
    except FileNotFoundError:
        return None
    except ValueError as error:
        raise ConfigError(f"{error}; delete the folder to start over") from None
    try:
        identity(manifest)
    except (KeyError, TypeError):
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
        foreign = [p.name for p in out.iterdir() if not p.name.endswith(".tmp")]
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
    for stale in [*out.glob(".*.tmp"), *(out / PROGRESS_DIR).glob(".*.tmp")]:
        stale.unlink(missing_ok=True)  # a killed run's half-written file; its shard is redone
    storage.write_json(out / MANIFEST_NAME, manifest)
    return manifest


def finished(out: Path, index: int) -> dict[str, Any] | None:
    """The record of shard `index` when it is done (record present, both files of the recorded sizes)."""
    try:
        record = json.loads(progress_path(out, index).read_text(encoding="utf-8"))
        for kind in record["bytes"]:
            if (out / record[kind]).stat().st_size != record["bytes"][kind]:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record


def write_shard(out: Path, index: int, ids: Sequence[str], vectors: np.ndarray | SparseRows, dtype: str,
                tokens: int, calibration: dict[str, Any] | None = None,
                spans: Sequence[Sequence[int]] | None = None, truncated: int = 0) -> dict[str, Any]:
    """Write one shard's vectors (coded as `dtype`: `vector_quantization.coded`; a binary shard also its int8
    codes; sparse rows as `sparse_vectors.sparse_arrays`), then its ids, then its record (each atomically, the
    record with its texts cut to the window, `truncated`); return the record."""
    if isinstance(vectors, SparseRows):
        arrays = sparse_arrays(vectors)
    else:
        arrays = coded(vectors, dtype, calibration)  # {"vectors": ..., maybe "codes": ...}
    names = {"vectors": VECTORS_NAME.format(index), "codes": CODES_NAME.format(index), "ids": IDS_NAME.format(index),
             "spans": SPANS_NAME.format(index),
             **{kind: name.format(index) for kind, name in SPARSE_FILES.items()}}
    data = {}
    for kind, array in arrays.items():
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        data[kind] = buffer.getvalue()
    data["ids"] = "".join(json.dumps(ident, ensure_ascii=False) + "\n" for ident in ids).encode("utf-8")
    if spans is not None:
        data["spans"] = "".join(json.dumps(list(span)) + "\n" for span in spans).encode("utf-8")
    for kind, payload in data.items():
        storage.write_bytes(out / names[kind], payload)
    record = {"index": index, **{kind: names[kind] for kind in data}, "count": len(ids), "tokens": tokens,
              "truncated": truncated, "bytes": {kind: len(payload) for kind, payload in data.items()},
              "sha256": {kind: hashlib.sha256(payload).hexdigest() for kind, payload in data.items()}}
    if isinstance(vectors, SparseRows):
        record["nonzero"] = len(vectors.indices)  # stored terms, all texts together
    storage.write_json(progress_path(out, index), record)
    return record


def finish_output(out: Path, manifest: dict[str, Any], shards: int) -> dict[str, Any]:
    """The final manifest (rank 0, once every rank is done): every shard's record, read back from disk.

    Raises:
        ConfigError: a shard is missing (on several nodes: the folder is not on a filesystem they share).
    """
    records: list[Any] = [finished(out, index) for index in range(shards)]
    missing = [index for index, record in enumerate(records) if record is None]
    if missing:
        raise ConfigError(f"{out}: shards {missing[:5]} are missing after every rank finished; on several nodes "
                          "--out must be a folder every node sees (a shared filesystem); rerun to finish them")
    final = {**manifest, "complete": True, "count": sum(r["count"] for r in records),
             "tokens": sum(r["tokens"] for r in records),
             "truncated": sum(r.get("truncated", 0) for r in records), "shards": records}
    storage.write_json(out / MANIFEST_NAME, final)
    return final


# --- running ---------------------------------------------------------------------------------------------

class EmbedProgress(Protocol):
    """What `embed_corpus` tells a progress display (rank 0 only): the texts this process will embed and
    those already done by an earlier run (`start`, once), then the texts of each model batch as it finishes,
    and the texts cut to the model's window as their windows are made (`truncated`, ahead of the model)."""

    def start(self, total: int, done: int) -> None: ...

    def advance(self, texts: int) -> None: ...

    def truncated(self, texts: int) -> None: ...


def rank_texts(sources: Sequence[SourceFile], settings: CorpusSettings, shard_size: int, ranks: Ranks,
               out: Path) -> tuple[int, int]:
    """(texts of this rank's shards, texts of those already done): one pass counting the records, so that
    the progress display has a total and an ETA (reading is cheap beside embedding)."""
    count = sum(1 for _ in read_records(sources, settings))
    total = done = 0
    for index in range(0, -(-count // shard_size)):
        if ranks.owns(index):
            size = min(shard_size, count - index * shard_size)
            total += size
            done += size if finished(out, index) is not None else 0
    return total, done


def calibration_of(out: Path, manifest: dict[str, Any], pipeline: EmbedPipeline, options: dict[str, Any],
                   sources: Sequence[SourceFile], settings: CorpusSettings) -> dict[str, Any]:
    """The manifest with its int8 calibration (int8 and binary runs; rank 0, before any shard): that of the
    folder's earlier run of the same identity (its shards were coded with it), else the ranges of the vectors
    of the corpus's first `DEFAULT_CALIBRATION_SIZE` records (`vector_quantization.calibrate`)."""
    if manifest["dtype"] not in QUANTIZED_DTYPES or manifest.get("kind") == "sparse":
        return manifest
    existing = read_manifest(out)
    if existing is not None and not describe_changes(existing, manifest) and "calibration" in existing:
        return {**manifest, "calibration": existing["calibration"]}
    sample = list(itertools.islice(read_records(sources, settings), DEFAULT_CALIBRATION_SIZE))
    _, vectors, _, _ = embed_shard(pipeline, options, manifest["embedding"]["prompt"], sample, settings,
                                   manifest["input"]["settings"]["single_file"],
                                   truncate=manifest.get("truncate", AUTO_TRUNCATE))
    return {**manifest, "calibration": calibrate(vectors)}


@dataclass(frozen=True)
class ShardText:
    """One row a shard embeds: its record (`owner`, the index in the shard's records), id, the text the model
    reads (prompt included; late chunking: the record's text, prompted by `late_chunk_vectors`) and, with
    --chunk, its [record number, start, end]."""

    owner: int
    ident: str
    text: str
    span: list[int] | None = None


def shard_texts(pipeline: EmbedPipeline, prompt: str, records: Sequence[Record], settings: CorpusSettings,
                single_file: bool, chunking: dict[str, int] | None = None, first_record: int = 0) -> list[ShardText]:
    """The rows of `records`, each record parsed and checked (DataError naming its file and line): one per
    record, or one per chunk (`text_chunks.chunk_spans`) with --chunk."""
    rows = []
    for owner, record in enumerate(records):
        ident, text = parse_record(record, settings, single_file)
        try:
            text = pipeline.parse(text)
        except InputError as error:
            raise DataError(f"{error} (blank lines are skipped; this one holds only invisible characters or is "
                            "an empty field): fix or remove it", record[0].path, record[1]) from None
        if chunking is None or chunking["late"]:
            rows.append(ShardText(owner, ident, prompt + text if chunking is None else text))
            continue
        for chunk in chunk_spans(pipeline.tokenizer, text, chunking["chunk"], chunking["chunk_overlap"]):
            rows.append(ShardText(owner, ident, prompt + text[chunk.start:chunk.end],
                                  [first_record + owner, chunk.start, chunk.end]))
    return rows


def refusal_fix(pipeline: EmbedPipeline) -> Fix:
    """What `bertforge embed --truncate false` says to do with a text longer than the model's window."""
    room = pipeline.max_length - pipeline.tokenizer.post_processor.added(False)
    return Fix(f"embed it whole as several vectors with --chunk TOKENS (at most {room}), or leave out "
               "--truncate false to have it cut to the window (and the cut counted)")


def check_fit(pipeline: EmbedPipeline, prompt: str, sources: Sequence[SourceFile], settings: CorpusSettings,
              single_file: bool, chunking: dict[str, int] | None, shard_size: int, ranks: Ranks) -> None:
    """`--truncate false`: DataError naming the first text of this rank's shards that does not fit the model's
    window (its file and line, its tokens, the limit and the fix: `wire_inputs`' rule), before any model work
    (the tokenizer reads them once more: the price of refusing)."""
    fix = refusal_fix(pipeline)
    for _, _, records in shard_chunks(read_records(sources, settings), shard_size, ranks.owns):
        for row in shard_texts(pipeline, prompt, records or [], settings, single_file, chunking):
            try:
                text_window(EmbedText(text=row.text, truncate=False, fix=fix), 0, pipeline.tokenizer,
                            pipeline.max_length, name="the text")
            except InputError as error:
                raise DataError(str(error), records[row.owner][0].path, records[row.owner][1]) from None


def embed_shard(pipeline: EmbedPipeline, options: dict[str, Any], prompt: str, records: Sequence[Record],
                settings: CorpusSettings, single_file: bool,
                on_batch: Callable[[int], None] | None = None, chunking: dict[str, int] | None = None,
                first_record: int = 0, spans: list[list[int]] | None = None, truncate: bool = AUTO_TRUNCATE,
                on_truncated: Callable[[int], None] | None = None,
                ) -> tuple[list[str], np.ndarray | SparseRows, int, list[str]]:
    """(ids, vectors [n, D] float32, tokens, where the texts cut to the window are) of one shard, as
    `pipeline.encode(texts, prompt=prompt)` makes them (an embed-sparse pipeline's: `SparseRows`, as
    `sparse_vectors.encode_sparse`); every record is parsed and checked before the model runs, whose batches go
    by length while a thread tokenizes the next ones (`evaluation.run_streamed`; `on_batch(texts)` after each
    batch, in records even where a record makes several rows: `text_chunks.per_text`).

    A text longer than the model's window is cut to it (`wire_inputs`' rule, `truncate`; `on_truncated(texts)`
    as their windows are made) and its "file:line" returned, once per record; `truncate` False refuses it
    (`check_fit` refuses it before any model work).

    `chunking` ({"chunk", "chunk_overlap"} in tokens, `embed --chunk`): every record becomes one row per chunk
    (`text_chunks.chunk_spans`), each with the record's id; `spans` then gets [record, start, end] per row
    (record: `first_record` + its place in `records`; start, end: the chunk's characters of the text)."""
    rows = shard_texts(pipeline, prompt, records, settings, single_file, chunking, first_record)
    ids = [row.ident for row in rows]
    if chunking is not None and chunking["late"]:  # one pass per text (window), pooled per chunk: nothing is cut
        vectors, chunks, tokens = late_chunk_vectors(pipeline, options, prompt, [row.text for row in rows],
                                                     chunking["chunk"], chunking["chunk_overlap"], on_batch)
        rows_ids = []
        for number, (ident, mine) in enumerate(zip(ids, chunks), start=first_record):
            rows_ids += [ident] * len(mine)
            if spans is not None:
                spans += [[number, c.start, c.end] for c in mine]
        return rows_ids, vectors, tokens, []
    if spans is not None and chunking is not None:
        spans += [row.span for row in rows]
    fix = refusal_fix(pipeline)
    parsed = [EmbedText(text=row.text, truncate=truncate, fix=fix) for row in rows]
    cut: list[int] = []  # rows whose window was cut
    features = noting_cuts(pipeline.features, cut, on_truncated)
    on_batch = per_text(on_batch, len(records), len(parsed))  # told in records, though chunks are more
    if pipeline.task == SPARSE_TASK:
        vectors, tokens = encode_sparse_parsed(pipeline, parsed, options, on_batch, features=features)
    else:  # `encode_parsed`'s steps, with a progress display told of every batch
        made, outputs = pipeline.stream(parsed, options, on_batch=on_batch, features=features)
        tokens = sum(feature_tokens(feature) for feature in made)
        vectors = np.stack([vector.numpy() for vector in outputs])  # [n, D], as `encode` returns them
    where = dict.fromkeys(f"{records[rows[row].owner][0].path}:{records[rows[row].owner][1]}" for row in cut)
    return ids, vectors, tokens, list(where)


def run_shards(out: Path, pipeline: EmbedPipeline, options: dict[str, Any], sources: Sequence[SourceFile],
               settings: CorpusSettings, manifest: dict[str, Any], ranks: Ranks,
               progress: EmbedProgress | None = None) -> tuple[int, int]:
    """Embed this rank's shards that are not done yet; return (records, shards) of the whole corpus."""
    records, shards, done = 0, 0, np.zeros(3)  # done: this rank's texts, tokens, seconds
    single = manifest["input"]["settings"]["single_file"]
    if progress is not None:
        progress.start(*rank_texts(sources, settings, manifest["shard_size"], ranks, out))

    def wanted(index: int) -> bool:
        return ranks.owns(index) and finished(out, index) is None

    chunks = shard_chunks(read_records(sources, settings), manifest["shard_size"], wanted)
    for index, count, chunk in chunks:
        records, shards = records + count, index + 1
        if chunk is None:
            continue
        started = time.perf_counter()
        chunking, spans = manifest.get("chunking"), []
        ids, vectors, tokens, cut = embed_shard(
            pipeline, options, manifest["embedding"]["prompt"], chunk, settings, single,
            progress.advance if progress is not None else None, chunking, records - count, spans,
            manifest.get("truncate", AUTO_TRUNCATE), progress.truncated if progress is not None else None)
        write_shard(out, index, ids, vectors, manifest["dtype"], tokens, manifest.get("calibration"),
                    spans if chunking is not None else None, len(cut))
        if cut:
            log.warning("shard %d: %d of %d texts are longer than the model's window of %d tokens and were cut to "
                        "it (first: %s); --chunk TOKENS embeds whole texts as several vectors, --truncate false "
                        "refuses them", index, len(cut), count, pipeline.max_length, cut[0])
        done += (count, tokens, time.perf_counter() - started)
        if ranks.rank == 0:  # the progress of one rank of N: the others run at the same pace
            log.info("shard %d: %d texts, %d tokens; rank 0 of %d: %.0f texts/s, %.0f tokens/s", index, count,
                     tokens, ranks.world_size, done[0] / done[2], done[1] / done[2])
    return records, shards


def check_output(shard_size: int, dtype: str, truncate: bool) -> None:
    """ConfigError for a setting of the output that cannot work."""
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise ConfigError(f"shard_size must be a positive integer, got {shard_size!r}")
    if dtype not in DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not supported; use one of {DTYPES}")
    if not isinstance(truncate, bool):
        raise ConfigError(f"truncate must be true or false, got {truncate!r}")


def check_sparse_run(sparse: bool, dtype: str, normalize: bool | None, max_terms: int | None) -> None:
    """ConfigError for a setting that does not apply to the run's kind of vectors."""
    if sparse and dtype != "float32":
        raise ConfigError(f"sparse vectors are stored as float32 weights of their non-zero terms; remove --dtype "
                          f"{dtype} (or --max-terms N keeps fewer terms)")
    if sparse and normalize is not None:
        raise ConfigError("sparse vectors are scored by their dot product as the model made them; remove "
                          "--normalize / --no-normalize")
    if not sparse and max_terms is not None:
        raise ConfigError("--max-terms prunes sparse vectors; add --sparse (a masked-LM model) or remove it")


def embed_corpus(model_dir: str | os.PathLike, inputs: str | os.PathLike, out_dir: str | os.PathLike, *,
                 settings: CorpusSettings | None = None, shard_size: int = DEFAULT_SHARD_SIZE,
                 dtype: str = "float32", batch_size: int = pipelines.DEFAULT_BATCH_SIZE, max_length: int | None = None,
                 device: str = "auto", precision: str = DEFAULT_PRECISION, engine: str = DEFAULT_KIND,
                 threads: int | None = None, pooling: str | None = None,
                 normalize: bool | None = None, prompt_name: str | None = None,
                 prompt: str | None = None, progress: EmbedProgress | None = None, sparse: bool = False,
                 max_terms: int | None = None, chunk: int | None = None,
                 chunk_overlap: int | None = None, late_chunking: bool = False,
                 truncate: bool = AUTO_TRUNCATE) -> dict[str, Any]:
    """Embed every record of `inputs` into shards under `out_dir`; a rerun resumes (see the module docstring).
    Under torchrun every rank calls it with the same arguments and embeds its share of the shards.

    Args:
        model_dir: a saved model directory (any model's encoder embeds).
        inputs: a text, TSV, CSV or JSONL file, or a folder of them (recursive, sorted).
        out_dir: the output folder (created; a rerun of the same run resumes in it).
        settings: how records become texts and ids (default: `CorpusSettings()`).
        shard_size: records per shard; dtype: on disk (computed in float32): "float32", "float16", "int8"
            (calibrated on the first records) or "binary" (sign bits, plus int8 codes for rescoring).
        batch_size, max_length, device, precision, engine, threads: the pipeline's (`load_pipeline`).
        pooling, normalize: embedding options (None: the model's, e.g. a sentence-transformers directory's).
        prompt_name, prompt: a prefix before every text (`EmbedPipeline.prompt_text`; default: the model's).
        progress: told the texts to embed and each finished batch (rank 0 only; `bertforge embed`'s bar).
        sparse: SPLADE vectors of a masked-LM model (the embed-sparse task) as compressed rows; `pooling` is
            then the SPLADE pooling (max, sum) and `max_terms` keeps each text's largest that many weights.
        chunk, chunk_overlap: cut every text into windows of `chunk` tokens overlapping by `chunk_overlap`
            (default 0), one row each, with its record's id and its characters in `spans-NNNNN.jsonl`
            (`text_chunks`); the manifest's "chunking" records them. `late_chunking`: the whole text (a
            window at a time) runs through the model once and each chunk is the mean of its tokens' vectors
            (`text_chunks.late_chunk_vectors`; mean pooling, dense vectors only).
        truncate: a text longer than the model's window is cut to it and counted (`wire_inputs`' rule: the
            progress display is told, each shard's record and the manifest hold "truncated", a warning names
            the first); False refuses the run before any model work, naming the first such text's file and line
            (`check_fit`). --chunk keeps whole texts instead.

    Returns:
        The final manifest (on every rank): {"count", "dim", "dtype", "shards": [...], ...}.

    Raises:
        DataError: a bad input line (file:line), before the model runs on its shard.
        ConfigError: the folder holds another run's vectors, or a setting is invalid.
    """
    check_output(shard_size, dtype, truncate)
    check_sparse_run(sparse, dtype, normalize, max_terms)
    check_chunking(chunk, chunk_overlap)
    if late_chunking and (chunk is None or sparse):
        raise ConfigError("--late-chunking pools dense token vectors per chunk: add --chunk TOKENS" if chunk is None
                          else "--late-chunking applies to dense vectors; remove it or --sparse")
    chunking = None if chunk is None else {"chunk": chunk, "chunk_overlap": chunk_overlap or 0, "late": late_chunking}
    settings = settings or CorpusSettings()
    out = Path(out_dir)
    ranks = Ranks.from_env()
    with Group(ranks) as group:
        sources = source_files(inputs, settings)
        pipeline = pipelines.load_pipeline(model_dir, SPARSE_TASK if sparse else "embed", device=ranks.device(device),
                                           precision=precision, engine=engine, threads=threads,
                                           batch_size=batch_size, max_length=max_length)
        given = {name: value for name, value in (("pooling", pooling), ("normalize", normalize),
                                                 ("max_terms", max_terms)) if value is not None}
        options, prefix = pipeline.check_options(given), pipeline.prompt_text(prompt_name, prompt)
        if chunking is not None and chunk + 2 > pipeline.max_length:  # [CLS] chunk [SEP] must fit the window
            raise ConfigError(f"--chunk {chunk} does not fit the model's window of {pipeline.max_length} tokens with "
                              f"[CLS] and [SEP]; use --chunk {pipeline.max_length - 2} or less")
        chunked = {"truncate": truncate, **({} if chunking is None else {"chunking": chunking})}
        if not truncate and not late_chunking:  # late chunks run whole texts a window at a time: none is cut
            check_fit(pipeline, prefix, sources, settings, Path(inputs).is_file(), chunking, shard_size, ranks)
        manifest = group.from_main(lambda: start_output(out, calibration_of(out, {**new_manifest(
            model_dir, pipeline, options, prefix, inputs, sources, settings, shard_size, dtype), **chunked},
            pipeline, options, sources, settings)))
        if manifest["complete"]:
            return manifest
        records, shards = run_shards(out, pipeline, options, sources, settings, manifest, ranks,
                                     progress if ranks.rank == 0 else None)
        if len(set(group.gather(records))) > 1:  # also the barrier before the final manifest
            raise DataError("the ranks read different numbers of records: every rank must see the same --input "
                            "(on several nodes, a shared filesystem)", inputs)
        if records == 0:
            raise DataError("no texts to embed (only blank lines or headers); is this the right input?", inputs)
        return group.from_main(lambda: finish_output(out, manifest, shards))


__all__ = ["DEFAULT_SHARD_SIZE", "DTYPES", "INPUT_FORMATS", "MANIFEST_NAME", "CorpusSettings", "Ranks",
           "embed_corpus", "read_manifest", "read_records"]
