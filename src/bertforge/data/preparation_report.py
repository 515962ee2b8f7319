"""What a data preparation did: `PrepareReport`, its warnings, and the final ``index.json`` they go into.

Shared by the one-process driver (`data.preparation`) and the merge of a preparation split into parts
(`data.preparation_parts`), so that both write the same complete index from the same shard records.
"""

from __future__ import annotations

import logging
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bertforge.data.shards import index_document, write_index

log = logging.getLogger(__name__)

UNK_WARN_RATIO = 0.01


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
        part: ``"i/n"`` when this run prepared one part of a split preparation (its counts are the part's).
        merged: whether ``index.json`` is complete (False only for a part whose siblings have not finished).
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
    part: str | None = None
    merged: bool = True

    def summary(self) -> str:
        """A few human-readable lines."""
        what = f"{self.out_dir}" if self.part is None else f"{self.out_dir} (part {self.part})"
        lines = [
            f"{what}: {self.documents} train / {self.heldout_documents} held-out documents -> "
            f"{self.instances} / {self.heldout_instances} instances, {self.tokens} tokens",
            f"{self.input_bytes / 1e6:.1f} MB in {self.seconds:.1f} s ({self.mb_per_s:.2f} MB/s), "
            f"peak RSS {self.peak_rss_mb:.0f} MiB, shards written {self.shards_written}, "
            f"skipped {self.shards_skipped}",
        ]
        if not self.merged:
            lines.append(f"part {self.part} done; {self.out_dir}/index.json is written once every part has "
                         f"finished (by the last one, or by `bertforge prepare --merge {self.out_dir}`)")
        lines += [f"warning: {warning}" for warning in self.warnings]
        return "\n".join(lines)


def peak_rss_mb() -> float:
    scale = 1.0 if sys.platform == "darwin" else 1024.0  # ru_maxrss: bytes on macOS, KiB on Linux
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) * scale / 2**20


def preparation_warnings(corpus: list[str], empty: int, unk: int, document_tokens: int,
                         heldout_missing: bool) -> list[str]:
    """The corpus warnings plus the ones tokenizing found; the latter are logged here (read_documents has
    logged the corpus's own)."""
    warnings = list(corpus)
    if empty:
        warnings.append(f"{empty} documents produced no token (only whitespace or control characters); skipped")
    if document_tokens and unk > UNK_WARN_RATIO * document_tokens:
        warnings.append(
            f"{100.0 * unk / document_tokens:.1f}% of tokens are [UNK]: the vocabulary does not fit this corpus "
            "(another language or casing?); build one with bertforge.tokenization.build_vocab"
        )
    if heldout_missing:
        warnings.append("the held-out split is empty: raise heldout_fraction or heldout_documents")
    for warning in warnings[len(corpus):]:
        log.warning(warning)
    return warnings


def report_of(out_dir: Path, index: dict, corpus: dict, *, input_bytes: int, started: float, written: int,
              skipped: int, part: bool = False) -> PrepareReport:
    """Sum up a run from its index document (a part's or the whole's, every shard record present) and the
    corpus report (`CorpusStats.to_dict()` of the whole corpus, whose "warnings" are the corpus's own); the
    report's warnings add those tokenizing found (logged here; a part does not judge the held-out split,
    which may lie in other parts)."""
    totals = index["splits"]
    # Documents are counted on the first pass only: every dupe pass sees the same documents.
    first = [record for split in totals.values() for record in split["shards"] if record["dupe"] == 0]
    empty = sum(record["empty_documents"] for record in first)
    unk = sum(record["unk_tokens"] for record in first)
    document_tokens = sum(record["document_tokens"] for record in first)
    heldout_missing = not part and index["settings"]["heldout_rate"] != "0" and totals["heldout"]["instances"] == 0
    warnings = preparation_warnings(list(corpus.get("warnings", [])), empty, unk, document_tokens, heldout_missing)
    seconds = time.perf_counter() - started
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
        peak_rss_mb=peak_rss_mb(),
        shards_written=written,
        shards_skipped=skipped,
        empty_documents=empty,
        unk_tokens=unk,
        warnings=warnings,
        corpus=dict(corpus),
    )


def finish_index(out_dir: Path, index: dict, corpus: dict, **run: int | float) -> PrepareReport:
    """`report_of` the whole preparation, and its complete ``index.json`` (with the corpus report and every
    warning) written: the last step of one process and of the merge of parts alike."""
    report = report_of(out_dir, index, corpus, **run)
    records = {record["name"]: record for split in index["splits"].values() for record in split["shards"]}
    write_index(out_dir, index_document(index["settings"], index["vocab_size"], index["vocab_checksum"], records,
                                        True, {**corpus, "warnings": report.warnings}))
    return report
