"""Where a pretraining step spends its GPU time: bertforge and transformers, one profile each.

Runs a few bf16 train steps of BertForPretraining (bertforge, fused QKV, MLM head at masked positions) and of
transformers' BertForPreTraining on the same batch, under `torch.profiler`, and prints the kernels sorted by
GPU time with each side's total. Meant for the GPU check (`benchmarks/gpu_check.sh`), to explain a ratio
rather than guess at it.

    python -m benchmarks.gpu_profile --preset base --batch 256 --tokens 128
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.model_speed import copy_weights, hf_config, pretraining_batch
from bertforge.model import BertConfig
from bertforge.tasks.pretraining import BertForPretraining


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
    import transformers

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    fused = device.type == "cuda"
    config = BertConfig.preset(args.preset)
    torch.manual_seed(0)
    ours = BertForPretraining(config).to(device)
    ours.bert.set_fast_path(fused_qkv=True)
    theirs = transformers.BertForPreTraining(hf_config(config)).to(device)
    copy_weights(ours, theirs)
    data = pretraining_batch(config, args.batch, args.tokens, device)
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-5, fused=fused)
    opt_theirs = torch.optim.AdamW(theirs.parameters(), lr=1e-5, fused=fused)

    def step_ours():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = ours(data["ids"], data["types"], data["mask"], mlm_positions=data["positions"],
                       mlm_labels=data["labels"], nsp_labels=data["nsp"])
        out.loss.backward()
        opt_ours.step()
        opt_ours.zero_grad(set_to_none=True)

    def step_theirs():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = theirs(input_ids=data["ids"], token_type_ids=data["types"], attention_mask=data["mask"],
                         labels=data["full_labels"], next_sentence_label=data["nsp"])
        out.loss.backward()
        opt_theirs.step()
        opt_theirs.zero_grad(set_to_none=True)

    for name, step in (("bertforge", step_ours), ("transformers", step_theirs)):
        print(f"## {name}: {args.preset} T={args.tokens} B={args.batch}, bf16 autocast, fused AdamW\n")
        print(profile_steps(step, args.steps, args.rows, device), flush=True)


if __name__ == "__main__":
    main()
