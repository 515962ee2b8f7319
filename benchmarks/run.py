"""The benchmark entry point (`make bench`, `bertforge bench`): every speed figure, side by side.

Runs, in one process and in this order: model speed against `transformers` (pretraining step, inference
fixed/variable length; `benchmarks.model_speed`), tokenizer MB/s against the pure-Python Google port and the
Rust library (`benchmarks.tokenizer_speed`), and pretraining-instance preparation MB/s with its peak memory
on 1 and 4 copies of the corpus (`benchmarks.prepare_speed`; `transformers` has no equivalent to compare).
`--write-docs` regenerates docs/benchmarks.md from this run plus the committed GPU results.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import sys
from datetime import date
from pathlib import Path

import torch

from benchmarks import model_speed, prepare_speed, tokenizer_speed

ROOT = Path(__file__).resolve().parents[1]
GPU_RESULTS = ROOT / "benchmarks" / "results" / "h200-2026-11-30"


class Tee(io.StringIO):
    """Capture what a section prints while still showing it."""

    def write(self, text: str) -> int:
        sys.__stdout__.write(text)
        return super().write(text)


def section(title: str, fn, argv: list[str]) -> str:
    print(f"\n## {title}\n", flush=True)
    buffer = Tee()
    with contextlib.redirect_stdout(buffer):
        fn(argv)
    return buffer.getvalue()


def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    import transformers

    return (f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, torch {torch.__version__}, "
            f"transformers {transformers.__version__}, {date.today().isoformat()}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--write-docs", action="store_true", help="rewrite docs/benchmarks.md")
    args = parser.parse_args(argv)
    speed_argv = (["--device", args.device] if args.device else []) + (["--quick", "--repeats", "1"]
                                                                        if args.quick else [])
    parts = {
        "model": section("Model speed against transformers", model_speed.main, speed_argv),
        "tokenizer": section("Tokenizer speed", tokenizer_speed.main,
                             ["--mb", "0.2", "--repeats", "1"] if args.quick else []),
        "prepare": section("Pretraining data preparation", prepare_speed.main,
                           ["--copies", "2"] if args.quick else []),
    }
    if args.write_docs:
        write_docs(parts)


def write_docs(parts: dict[str, str]) -> None:
    gpu = {name: (GPU_RESULTS / name).read_text(encoding="utf-8") if (GPU_RESULTS / name).exists() else
           "not measured" for name in ("env.txt", "fast_paths.md", "throughput.md", "pretrain_base.log")}
    throughput = "\n".join(line for line in gpu["throughput.md"].splitlines() if line.startswith(("|", "bf16")))
    text = f"""# Benchmarks

Every figure is a ratio measured in one run against Hugging Face `transformers` on the same machine, config,
weights, batch and precision (warm-up excluded, median of repeats). Regenerate this page with
`python -m benchmarks.run --write-docs` (CPU sections); the GPU section comes from
`OUT=dir bash benchmarks/gpu_check.sh` on the GPU machine, whose output is committed under
`benchmarks/results/`.

## CPU ({machine()})

Absolute numbers on a shared 2-core machine move with its load; the ratios are the figures to read.

### Model speed

```
{parts['model'].strip()}
```

### Tokenizer

```
{parts['tokenizer'].strip()}
```

### Pretraining data preparation

```
{parts['prepare'].strip()}
```

## GPU (one H200)

```
{gpu['env.txt'].strip()}
```

Fast paths against the plain fp32 path (`benchmarks/fast_path_check.py`):

{gpu['fast_paths.md'].strip()}

Throughput against transformers (`benchmarks/model_speed.py --device cuda`; bf16 autocast, SDPA on both sides,
fused AdamW on both sides):

{throughput}

A short `base` pretraining run on the pretrain_en shards (bf16, batch 256, 300 steps, unpadded + fused QKV,
eager), from `bertforge pretrain`:

```
{gpu['pretrain_base.log'].strip()[:3000]}
```
"""
    (ROOT / "docs" / "benchmarks.md").write_text(text, encoding="utf-8")
    print(f"wrote {ROOT / 'docs' / 'benchmarks.md'}")


if __name__ == "__main__":
    main()
