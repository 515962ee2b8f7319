"""Where a pretraining step and a variable-length inference batch spend their GPU time, on each side.

Runs a few bf16 train steps of BertForPretraining (bertforge, fused QKV, MLM head at masked positions) and of
transformers' BertForPreTraining on the same batch, then (with `--inference`) the encoder on the same
variable-length inference batches (lengths uniform in 16..T, unpadded on our side), under `torch.profiler`,
and prints the kernels sorted by GPU time with each side's total. Meant for the GPU check
(`benchmarks/gpu_check.sh`), to explain a ratio rather than guess at it.

    python -m benchmarks.gpu_profile --preset base --batch 256 --tokens 128 --inference
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.model_speed import inference_calls, pretraining_steps


def profile_steps(step, steps: int, rows: int, device: torch.device) -> str:
    cuda = device.type == "cuda"
    for _ in range(3):  # warm-up: allocator, cuBLAS heuristics
        step()
    if cuda:
        torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()
    table = events.table(sort_by="cuda_time_total" if cuda else "self_cpu_time_total", row_limit=rows,
                         max_name_column_width=60)
    total = sum(e.self_device_time_total if cuda else e.self_cpu_time_total for e in events) / 1e3 / steps
    return f"{table}\n{'GPU' if cuda else 'CPU'} time per step: {total:.1f} ms (sum of self times)\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--inference", action="store_true",
                        help="also profile variable-length inference (batch 512 on CUDA, 8 on CPU)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    # Same weights and batch on both sides; bf16 autocast, fused AdamW on CUDA (as in benchmarks.model_speed).
    step_ours, step_theirs = pretraining_steps(args.preset, args.batch, args.tokens, device, "bf16")

    for name, step in (("bertforge", step_ours), ("transformers", step_theirs)):
        print(f"## {name}: {args.preset} T={args.tokens} B={args.batch}, bf16 autocast, fused AdamW\n")
        print(profile_steps(step, args.steps, args.rows, device), flush=True)
    if args.inference:
        batch = 512 if device.type == "cuda" else 8
        call_ours, call_theirs, real_tokens = inference_calls(args.preset, batch, args.tokens, device, "bf16", True)
        for name, call in (("bertforge", call_ours), ("transformers", call_theirs)):
            print(f"## {name}: inference {args.preset} T={args.tokens} B={batch} variable 16..T "
                  f"({real_tokens} real tokens), bf16 autocast\n")
            print(profile_steps(call, args.steps, args.rows, device), flush=True)


if __name__ == "__main__":
    main()
