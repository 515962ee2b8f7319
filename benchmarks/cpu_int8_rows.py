"""Where PyTorch's two dynamic int8 linears cross: oneDNN's pack against the x86 engine's (fbgemm), by rows.

For every encoder linear shape of MiniLM and BERT-base, times `Int8Linear` packed for each engine on inputs
of 8 to 96 rows (best of 3 rounds of 300 calls, fixed threads) and prints microseconds per call and the
first row count at which oneDNN is the faster, next to the cutoff `quantization.small_rows` uses
(`SMALL_WORK / sqrt(in x out)`). On a CPU without AMX, oneDNN is not the int8 engine and this does not apply.

    python -m benchmarks.cpu_int8_rows [--threads 2] [--out benchmarks/results/cpu_int8_rows.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings
from pathlib import Path

import torch

from bertforge.engine.int8 import SMALL_WORK, Int8Linear, has_amx

SHAPES = [(384, 1152), (384, 384), (384, 1536), (1536, 384), (768, 2304), (768, 768), (768, 3072), (3072, 768)]
ROWS = (8, 16, 24, 32, 40, 48, 56, 64, 80, 96)


def per_call_us(run, calls: int = 300, rounds: int = 3) -> float:
    for _ in range(20):
        run()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/cpu_int8_rows.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore", UserWarning)
    results = []
    generator = torch.Generator().manual_seed(0)
    for inputs, outputs in SHAPES:
        weight = torch.randn(outputs, inputs, generator=generator) * 0.05
        onednn, x86 = (Int8Linear(weight, None, engine) for engine in ("onednn", "x86"))
        times = {}
        for rows in ROWS:
            x = torch.randn(rows, inputs, generator=generator)
            times[rows] = tuple(per_call_us(lambda linear=linear, x=x: linear(x)) for linear in (onednn, x86))
        crossing = next((rows for rows, (a, b) in times.items() if a < b), None)
        cutoff = int(SMALL_WORK / (inputs * outputs) ** 0.5)
        results.append({"shape": [inputs, outputs], "us_onednn_x86": times, "onednn_faster_from": crossing,
                        "small_rows_cutoff": cutoff})
        print(f"[{inputs} -> {outputs}] oneDNN faster from {crossing} rows (cutoff used: {cutoff}); "
              + " ".join(f"{r}:{a:.0f}/{b:.0f}" for r, (a, b) in times.items()))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_suffix(".tmp")
    temporary.write_text(json.dumps({"machine": platform.processor() or platform.machine(), "amx": has_amx(),
                                     "threads": args.threads, "results": results}, indent=1))
    temporary.replace(out)


if __name__ == "__main__":
    main()
