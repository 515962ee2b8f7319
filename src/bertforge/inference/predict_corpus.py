"""`bertforge predict` from a file into a file: split among torchrun processes, resumable after a crash,
results in input order, the same bytes whatever the number of processes (docs/inference.md).

The input is cut into *chunks* of `chunk_lines` lines (blank lines count: a chunk is a fixed range of line
numbers). Rank r of N runs chunks r, r+N, ... (`processes.Ranks`) through the one predict path
(`predict_lines.predict_stream`, which names the file and line of a bad input) and writes each chunk's results to
``<output>.parts/chunk-00000.jsonl`` atomically: a chunk file that exists is finished. Every rank reads
every line (cheap) but parses and runs only its own chunks. Once every rank is done (a gloo barrier,
`processes.Group`), rank 0 concatenates the chunks in order into the output, atomically, and removes the
parts folder. Hence:

- The output appears whole or not at all: a killed or failed run never leaves a partial output file (an
  older output stays as it was until the new one replaces it).
- A rerun of the same command resumes: it skips finished chunks (and removes the temporary files a kill
  left, rank 0 before any rank writes). The parts folder's ``manifest.json`` records what decides the
  results (the model's files, task, options, batch size, input file size and mtime, chunk size); a rerun
  that differs is refused, naming what changed.
- A chunk's bytes depend only on its lines and those settings, given the same kind of device and intra-op
  thread count (torchrun sets OMP_NUM_THREADS=1; another count moves floats by rounding), so 1 and N
  processes write the same output.

Several nodes need the output's folder on a filesystem they share.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterator
from itertools import count, islice
from pathlib import Path
from typing import Any

from bertforge import storage
from bertforge.checkpoint_format import model_fingerprint
from bertforge.data.files import not_utf8, open_text
from bertforge.engine.build import DEFAULT_KIND
from bertforge.errors import ConfigError, DataError
from bertforge.inference import pipelines
from bertforge.inference.family_pipelines import DEFAULT_BATCH_SIZE, Pipeline
from bertforge.inference.predict_lines import predict_stream
from bertforge.processes import Group, Ranks
from bertforge.runtime import DEFAULT_PRECISION

log = logging.getLogger(__name__)

FORMAT_NAME = "bertforge-predict-parts"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
CHUNK_NAME = "chunk-{:05d}.jsonl"  # .format(chunk index)
DEFAULT_CHUNK_LINES = 10_000


def parts_folder(output: Path) -> Path:
    """Where the chunks of `output` are written until they are merged into it."""
    return output.with_name(output.name + ".parts")


def new_manifest(model_dir: str | os.PathLike, task: str, inputs: Path, settings: dict[str, Any],
                 chunk_lines: int) -> dict[str, Any]:
    """What a resume must match (see the module docstring)."""
    stat = inputs.stat()
    return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "model": model_fingerprint(model_dir), "task": task,
            "settings": settings, "input": {"path": str(inputs.resolve()), "size": stat.st_size,
                                            "mtime_ns": stat.st_mtime_ns},
            "chunk_lines": chunk_lines}


def start_parts(parts: Path, manifest: dict[str, Any]) -> None:
    """Prepare the parts folder (rank 0, before any rank writes): `storage.start_parts`, naming what differs
    for a folder of another run (another model, the input file changed, other options)."""
    what = {"model": "another model", "input": "the input file changed", "settings": "other options"}
    storage.start_parts(parts, manifest, what="finished chunks", manifest_name=MANIFEST_NAME,
                        differences=lambda was, now: [what.get(key, key) for key in sorted(set(was) | set(now))
                                                      if was.get(key) != now.get(key)])


def read_chunks(inputs: Path, chunk_lines: int) -> Iterator[tuple[int, list[str]]]:
    """``(chunk index, its lines)`` of the input, in order (one chunk in memory at a time)."""
    handle = open_text(inputs)
    try:
        for index in count():
            lines = list(islice(handle, chunk_lines))
            if not lines:
                return
            yield index, lines
    except UnicodeDecodeError as error:
        raise not_utf8(inputs, error) from None
    finally:
        handle.close()


def run_chunks(pipeline: Pipeline, inputs: Path, parts: Path, chunk_lines: int, options: dict[str, Any],
               ranks: Ranks) -> int:
    """Run this rank's unfinished chunks; return the number of chunks in the input."""
    chunks, done, started = 0, 0, time.perf_counter()
    for index, lines in read_chunks(inputs, chunk_lines):
        chunks = index + 1
        path = parts / CHUNK_NAME.format(index)
        if not ranks.owns(index) or path.exists():
            continue
        with storage.open_atomic(path, "w", newline="\n") as sink:
            predict_stream(pipeline, lines, sink, source=str(inputs), first_line=index * chunk_lines + 1,
                                     **options)
        done += len(lines)
        if ranks.rank == 0:  # one rank's progress: the others run at the same pace
            log.info("chunk %d done; rank 0 of %d: %.0f lines/s", index, ranks.world_size,
                     done / (time.perf_counter() - started))
    return chunks


def merge_chunks(parts: Path, output: Path, chunks: int) -> int:
    """Concatenate the chunks in order into `output` (atomically), remove the parts folder; return the
    number of results.

    Raises:
        ConfigError: a chunk is missing (on several nodes: the folder is not on a filesystem they share).
    """
    missing = [index for index in range(chunks) if not (parts / CHUNK_NAME.format(index)).is_file()]
    if missing:
        raise ConfigError(f"{parts}: chunks {missing[:5]} are missing after every rank finished; on several nodes "
                          "--output must be in a folder every node sees (a shared filesystem); rerun to finish them")
    results = 0
    with storage.open_atomic(output, "wb") as sink:
        for index in range(chunks):
            with open(parts / CHUNK_NAME.format(index), "rb") as chunk:
                for block in iter(lambda chunk=chunk: chunk.read(1 << 20), b""):
                    results += block.count(b"\n")
                    sink.write(block)
    shutil.rmtree(parts)
    return results


def predict_corpus(model_dir: str | os.PathLike, task: str, inputs: str | os.PathLike, output: str | os.PathLike, *,
                   chunk_lines: int = DEFAULT_CHUNK_LINES, device: str = "auto",
                   precision: str = DEFAULT_PRECISION, engine: str = DEFAULT_KIND, threads: int | None = None,
                   batch_size: int = DEFAULT_BATCH_SIZE, max_length: int | None = None,
                   doc_stride: int | None = None, **options: Any) -> int:
    """Predict every line of the file `inputs` into the JSONL file `output` (see the module docstring).
    Under torchrun every rank calls it with the same arguments and runs its share of the chunks.

    Args:
        model_dir, task: the model directory and the pipeline (`pipelines.load_pipeline`).
        inputs: a file of text or JSONL lines (`predict_lines.predict_stream`).
        output: the JSONL file of results, one per non-blank input line, in input order.
        chunk_lines: input lines per chunk (the unit of sharing and of resuming).
        device, precision, engine, threads, batch_size, max_length, doc_stride: the pipeline's.
        **options: the pipeline's per-call options (top_k, pooling ...).

    Returns:
        The number of results written.

    Raises:
        DataError: a bad input line (file:line). ConfigError: the parts folder holds another run's chunks, a
        setting is invalid, or another rank stopped.
    """
    if isinstance(chunk_lines, bool) or not isinstance(chunk_lines, int) or chunk_lines < 1:
        raise ConfigError(f"chunk_lines must be a positive integer, got {chunk_lines!r}")
    inputs, output = Path(inputs), Path(output)
    parts = parts_folder(output)
    ranks = Ranks.from_env()
    with Group(ranks) as group:
        pipeline = pipelines.load_pipeline(model_dir, task, device=ranks.device(device), precision=precision,
                                           engine=engine, threads=threads, batch_size=batch_size,
                                           max_length=max_length, doc_stride=doc_stride)
        merged = pipeline.check_options(options)
        settings = {"options": merged, "precision": precision, "batch_size": batch_size, "max_length": max_length,
                    "doc_stride": doc_stride}
        group.from_main(lambda: start_parts(parts, new_manifest(model_dir, task, inputs, settings, chunk_lines)))
        chunks = run_chunks(pipeline, inputs, parts, chunk_lines, options, ranks)
        if len(set(group.gather(chunks))) > 1:  # also the barrier before the merge
            raise DataError("the ranks read different numbers of lines: every rank must see the same --input "
                            "(on several nodes, a shared filesystem)", inputs)
        return group.from_main(lambda: merge_chunks(parts, output, chunks))


__all__ = ["DEFAULT_CHUNK_LINES", "parts_folder", "predict_corpus"]
