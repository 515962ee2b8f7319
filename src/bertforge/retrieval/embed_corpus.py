"""Embedding a corpus of any size into a vector folder: streamed, resumable after a crash, shared among
torchrun processes, the same shards whatever the number of processes (docs/retrieval.md).

Owns: the embed job, `embed_corpus` (what a shard's vectors are: `embed_shard`; which shards are left:
`run_shards`; `--truncate false`'s check before any model work: `check_fit`). The folder's format (manifest,
shard files, what a resume must match, what is finished) is `store`'s, which the job writes through; which
process embeds which shard is `bertforge.processes` (`Ranks`, `Group`); how files become (id, text) records and
shards is `data.corpus_records`.

Resuming: rank 0 writes the manifest before any shard ("complete": false) and once every rank has finished
("complete": true). After a `kill -9` at any moment the rerun removes temporary files (rank 0, before any rank
writes), skips done shards and rewrites the rest with the same bytes: a shard's bytes depend only on its records
and the settings (its windows batched by length, the same batches every run) given the same batch size, kind of
device and intra-op thread count (torchrun sets OMP_NUM_THREADS=1; other thread counts move vectors by float
rounding, about 1e-7). A rerun with another model, `EmbedSettings`, shard size, input settings or input files
(names, sizes, mtimes) is refused, naming what changed.

Long texts: a text longer than the model's window is cut to it, the rule of every embedding route of the server
(`wire_inputs`), and said: the progress display counts the cut texts, each shard's record and the final
manifest hold "truncated" (its settings "truncate"), and a warning names the first one;
`EmbedSettings(truncate=False)` (`--truncate false`) refuses the run before any model work, naming the first
over-long text's file and line (`check_fit`). `--chunk` embeds whole texts as several vectors instead.

Processes: rank r of N embeds shards r, r+N, ...; every rank reads every line to count records but parses
and tokenizes only its own. The ranks meet in a gloo group (CPU collectives, whatever the device) after rank
0 has prepared the folder, and at the end, when rank 0 checks every shard's record and writes the manifest;
nodes must share the folder. Memory is flat in the corpus size: one shard at a time.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

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
from bertforge.retrieval.fields import (
    FieldSpec,
    fields_of,
    import_pyarrow,
    parse_fields,
    record_values,
    shard_metadata,
)
from bertforge.retrieval.multi_vector_search import MULTI_VECTOR_TASK, document_window
from bertforge.retrieval.sparse_vectors import SPARSE_TASK, encode_sparse_parsed
from bertforge.retrieval.store import (
    DTYPES,
    MANIFEST_NAME,
    EmbedSettings,
    TokenRows,
    describe_changes,
    embed_settings,
    finish_output,
    finished,
    new_manifest,
    read_manifest,
    start_output,
    write_shard,
)
from bertforge.retrieval.text_chunks import chunk_spans, late_chunk_vectors, per_text
from bertforge.retrieval.vector_quantization import DEFAULT_CALIBRATION_SIZE, QUANTIZED_DTYPES, calibrate
from bertforge.runtime import DEFAULT_PRECISION

log = logging.getLogger(__name__)

DEFAULT_SHARD_SIZE = 10_000


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
    if embed_settings(manifest).dtype not in QUANTIZED_DTYPES:  # sparse runs are float32
        return manifest
    existing = read_manifest(out)
    if existing is not None and not describe_changes(existing, manifest) and "calibration" in existing:
        return {**manifest, "calibration": existing["calibration"]}
    sample = list(itertools.islice(read_records(sources, settings), DEFAULT_CALIBRATION_SIZE))
    _, vectors, _, _ = embed_shard(pipeline, options, manifest["embedding"]["prompt"], sample, settings,
                                   manifest["input"]["settings"]["single_file"],
                                   truncate=embed_settings(manifest).truncate)
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
                ) -> tuple[list[str], np.ndarray | SparseRows | TokenRows, int, list[str]]:
    """(ids, vectors [n, D] float32, tokens, where the texts cut to the window are) of one shard, as
    `pipeline.encode(texts, prompt=prompt)` makes them (an embed-sparse pipeline's: `SparseRows`, as
    `sparse_vectors.encode_sparse`; an embed-multi-vector pipeline's: `TokenRows`, each document's token vectors);
    every record is parsed and checked before the model runs, whose batches go
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
        if pipeline.task == MULTI_VECTOR_TASK:
            vectors = TokenRows.from_rows([output.vectors.numpy() for output in outputs], pipeline.model.dimension)
        else:
            vectors = np.stack([vector.numpy() for vector in outputs])  # [n, D], as `encode` returns them
    where = dict.fromkeys(f"{records[rows[row].owner][0].path}:{records[rows[row].owner][1]}" for row in cut)
    return ids, vectors, tokens, list(where)


def rows_metadata(specs: Sequence[FieldSpec], values: list[list[Any]], spans: list[list[int]] | None,
                  first_record: int) -> Any:
    """A shard's metadata table (`fields.shard_metadata`; None without fields): its records' `values`, one row
    per record, or per chunk (`spans`: [record, start, end], record counted from the input's first)."""
    if not specs:
        return None
    owners = range(len(values)) if spans is None else [span[0] - first_record for span in spans]
    return shard_metadata(specs, values, owners)


def run_shards(out: Path, pipeline: EmbedPipeline, options: dict[str, Any], sources: Sequence[SourceFile],
               settings: CorpusSettings, manifest: dict[str, Any], ranks: Ranks,
               progress: EmbedProgress | None = None) -> tuple[int, int]:
    """Embed this rank's shards that are not done yet; return (records, shards) of the whole corpus."""
    records, shards, done = 0, 0, np.zeros(3)  # done: this rank's texts, tokens, seconds
    single = manifest["input"]["settings"]["single_file"]
    specs = fields_of(manifest)
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
        chunking, spans = embed_settings(manifest).chunking, []
        values = [record_values(record, specs) for record in chunk] if specs else []  # refused before the model
        ids, vectors, tokens, cut = embed_shard(
            pipeline, options, manifest["embedding"]["prompt"], chunk, settings, single,
            progress.advance if progress is not None else None, chunking, records - count, spans,
            embed_settings(manifest).truncate, progress.truncated if progress is not None else None)
        kept = spans if chunking is not None else None
        write_shard(out, index, ids, vectors, manifest["dtype"], tokens, manifest.get("calibration"), kept, len(cut),
                    rows_metadata(specs, values, kept, records - count))
        if cut:
            log.warning("shard %d: %d of %d texts are longer than the model's window of %d tokens and were cut to "
                        "it (first: %s); --chunk TOKENS embeds whole texts as several vectors, --truncate false "
                        "refuses them", index, len(cut), count, pipeline.max_length, cut[0])
        done += (count, tokens, time.perf_counter() - started)
        if ranks.rank == 0:  # the progress of one rank of N: the others run at the same pace
            log.info("shard %d: %d texts, %d tokens; rank 0 of %d: %.0f texts/s, %.0f tokens/s", index, count,
                     tokens, ranks.world_size, done[0] / done[2], done[1] / done[2])
    return records, shards


def embed_corpus(model_dir: str | os.PathLike, inputs: str | os.PathLike, out_dir: str | os.PathLike,
                 embedding: EmbedSettings | None = None, *, settings: CorpusSettings | None = None,
                 shard_size: int = DEFAULT_SHARD_SIZE, batch_size: int = pipelines.DEFAULT_BATCH_SIZE,
                 max_length: int | None = None, device: str = "auto", precision: str = DEFAULT_PRECISION,
                 engine: str = DEFAULT_KIND, threads: int | None = None,
                 progress: EmbedProgress | None = None, fields: Sequence[str | FieldSpec] = ()) -> dict[str, Any]:
    """Embed every record of `inputs` into shards under `out_dir`; a rerun resumes (see the module docstring).
    Under torchrun every rank calls it with the same arguments and embeds its share of the shards.

    Args:
        model_dir: a saved model directory (any model's encoder embeds).
        inputs: a text, TSV, CSV or JSONL file, or a folder of them (recursive, sorted).
        out_dir: the output folder (created; a rerun of the same run resumes in it).
        embedding: how texts become vectors (`store.EmbedSettings`: pooling, normalize, prompt, dtype, sparse,
            max_terms, chunking; default: the model's dense vectors as float32). The manifest stores them
            resolved (the model's pooling and normalize where not given, the prompt's text).
        settings: how records become texts and ids (default: `CorpusSettings()`).
        shard_size: records per shard.
        batch_size, max_length, device, precision, engine, threads: the pipeline's (`load_pipeline`).
        progress: told the texts to embed, each finished batch and the texts cut to the window (rank 0 only;
            `bertforge embed`'s bar).
        fields: metadata stored per record ("NAME[:TYPE]" or `fields.FieldSpec`: a JSON Lines key or a TSV/CSV
            column, read by its type), one Parquet file a shard; what `search --filter` filters on.

    Returns:
        The final manifest (on every rank): {"count", "dim", "dtype", "settings", "shards": [...], ...}.

    Raises:
        DataError: a bad input line (file:line), before the model runs on its shard.
        ConfigError: the folder holds another run's vectors, or a setting is invalid.
    """
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise ConfigError(f"shard_size must be a positive integer, got {shard_size!r}")
    embedding = embedding or EmbedSettings()
    settings = settings or CorpusSettings()
    specs = parse_fields(fields)
    if specs:
        import_pyarrow()  # the extra is named before any model work
    out = Path(out_dir)
    ranks = Ranks.from_env()
    with Group(ranks) as group:
        sources = source_files(inputs, settings)
        task = SPARSE_TASK if embedding.sparse else MULTI_VECTOR_TASK if embedding.multi_vector else "embed"
        if embedding.multi_vector and max_length is None:
            max_length = document_window(model_dir)  # documents are cut (and counted) where the model cuts them
        pipeline = pipelines.load_pipeline(model_dir, task, device=ranks.device(device), precision=precision,
                                           engine=engine, threads=threads, batch_size=batch_size,
                                           max_length=max_length)
        options = pipeline.check_options(embedding.options())
        chunk = embedding.chunk
        if chunk is not None and chunk + 2 > pipeline.max_length:  # [CLS] chunk [SEP] must fit the window
            raise ConfigError(f"--chunk {chunk} does not fit the model's window of {pipeline.max_length} tokens with "
                              f"[CLS] and [SEP]; use --chunk {pipeline.max_length - 2} or less")
        if not embedding.truncate and not embedding.late_chunking:  # late chunks run whole texts a window at a time
            check_fit(pipeline, pipeline.prompt_text(embedding.prompt_name, embedding.prompt), sources, settings,
                      Path(inputs).is_file(), embedding.chunking, shard_size, ranks)
        manifest = group.from_main(lambda: start_output(out, calibration_of(out, first_manifest(
            model_dir, pipeline, options, embedding, inputs, sources, settings, shard_size, specs),
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


def first_manifest(model_dir: str | os.PathLike, pipeline: EmbedPipeline, options: dict[str, Any],
                   embedding: EmbedSettings, inputs: str | os.PathLike, sources: Sequence[SourceFile],
                   settings: CorpusSettings, shard_size: int, fields: Sequence[FieldSpec] = ()) -> dict[str, Any]:
    """The run's manifest before any shard (`store.new_manifest`): its settings resolved against the model (its
    pooling and normalize where not given, the prompt's text), the options queries are embedded with, and the
    width of a vector (dense: a probe's, pooling modes may be concatenated; sparse: the vocabulary's)."""
    prefix = pipeline.prompt_text(embedding.prompt_name, embedding.prompt)
    chunk = embedding.chunk
    resolved = replace(embedding, prompt_name=None, prompt=prefix, pooling=options.get("pooling"),
                       normalize=None if embedding.sparse or embedding.multi_vector else options["normalize"],
                       max_terms=options.get("max_terms") if embedding.sparse else None,
                       chunk_overlap=None if chunk is None else embedding.chunk_overlap or 0)
    vectors = {k: v for k, v in options.items() if k not in ("tokens", "token_vectors")}  # not how results show
    if embedding.sparse:
        dim = pipeline.config.vocab_size
    elif embedding.multi_vector:
        dim = pipeline.model.dimension
    else:
        dim = int(pipeline.encode(["probe"], prompt=prefix, **options).shape[1])
    return new_manifest(model_dir, resolved, {**vectors, "prompt": prefix, "max_length": pipeline.max_length,
                                              "precision": pipeline.precision},
                        dim, inputs, sources, settings, shard_size, fields)


__all__ = ["DEFAULT_SHARD_SIZE", "DTYPES", "INPUT_FORMATS", "MANIFEST_NAME", "CorpusSettings", "EmbedSettings",
           "Ranks", "embed_corpus", "read_manifest", "read_records"]
