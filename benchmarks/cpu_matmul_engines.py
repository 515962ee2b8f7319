"""One linear layer on BERT-base's projection shapes, in every CPU kernel `--precision` can run: fp32 `F.linear`,
bf16 with the weight packed once for oneDNN (`engine.bf16.Bf16Linear`, where oneDNN has bf16 kernels), and
int8 dynamic quantization packed for each quantized engine this PyTorch build has (`Int8Linear`): the
figures behind `quantization.quantization_engine`'s choice (docs/cpu_inference.md).

    python -m benchmarks.cpu_matmul_engines [--threads 2] [--calls 30]

Prints GFLOP/s (multiply-adds x 2 per second, best of three rounds of --calls calls) per shape and kernel.
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import torch

from bertforge.engine.bf16 import Bf16Linear, onednn_bf16
from bertforge.engine.int8 import Int8Linear, has_amx, quantization_engine

SHAPES = ((70, 768, 3072), (70, 3072, 768), (70, 768, 2304), (1024, 768, 3072), (1024, 3072, 768),
          (2300, 768, 3072))


def rate(run, flops: float, calls: int) -> float:
    run()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        best = min(best, (time.perf_counter() - start) / calls)
    return flops / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engines = [e for e in ("x86", "fbgemm", "onednn") if e in torch.backends.quantized.supported_engines]
    print(f"torch {torch.__version__}; AMX {has_amx()}; oneDNN bf16 {onednn_bf16()}; int8 engine chosen: "
          f"{quantization_engine()}; {args.threads} threads")
    names = ["fp32", "bf16 packed" if onednn_bf16() else "bf16 cast once", *[f"int8 {e}" for e in engines]]
    print("| [tokens, in] x [in -> out] | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    with torch.inference_mode():
        for tokens, inner, outer in SHAPES:
            x, weight, bias = torch.randn(tokens, inner), torch.randn(outer, inner), torch.randn(outer)
            flops = 2 * tokens * inner * outer
            bf16, x_bf16 = Bf16Linear(weight, bias), x.bfloat16()
            int8 = [Int8Linear(weight, bias, engine) for engine in engines]
            kernels = [partial(torch.nn.functional.linear, x, weight, bias), partial(bf16, x_bf16)]
            kernels += [partial(module, x) for module in int8]
            rates = [rate(kernel, flops, args.calls) for kernel in kernels]
            print(f"| [{tokens}, {inner}] x [{inner} -> {outer}] | " + " | ".join(f"{r:,.0f}" for r in rates) + " |")

if __name__ == "__main__":
    main()
