"""Fast paths against the plain fp32 path on one device: the correctness half of the GPU check.

For BertModel (base) on a variable-length batch: plain fp32 vs {bf16 autocast, unpadded, fused QKV,
torch.compile}; and a pretraining training step's loss and gradient norm under the same switches. Prints
max |difference| at real tokens, relative to the named tolerance, and exits non-zero on a failure.
"""

from __future__ import annotations

import argparse
import sys

import torch

from bertforge.families.pretraining import BertForPretraining
from bertforge.model import BertConfig, BertModel
from bertforge.model.fast_paths import set_fast_paths

FP32_ATOL = 1e-4  # TF32 is off; differences are reduction-order only
BF16_ATOL = 1.5e-1  # bf16 (8-bit mantissa) through 12 layers, hidden values O(1) after LayerNorm
BF16_LOSS_RTOL = 2e-2


def batch(config: BertConfig, rows: int, tokens: int, device: torch.device):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, config.vocab_size, (rows, tokens), generator=generator)
    lengths = torch.randint(16, tokens + 1, (rows,), generator=generator)
    mask = (torch.arange(tokens)[None, :] < lengths[:, None]).long()
    return ids.to(device), mask.to(device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    config = BertConfig.preset(args.preset)
    torch.manual_seed(0)
    model = BertModel(config).to(device).eval()
    ids, mask = batch(config, 32, 128, device)
    real = mask.bool()
    failures = []

    def run(unpad: bool, fused: bool, dtype, compiled: bool = False) -> torch.Tensor:
        set_fast_paths(model, unpad=unpad, fused_qkv=fused)
        fn = torch.compile(model) if compiled else model
        with torch.inference_mode(), torch.autocast(device.type, dtype=dtype or torch.float32,
                                                    enabled=dtype is not None):
            return fn(ids, attention_mask=mask).last_hidden_state.float()

    reference = run(False, False, None)
    cases = [("unpad+fused fp32", True, True, None, False, FP32_ATOL),
             ("plain bf16", False, False, torch.bfloat16, False, BF16_ATOL),
             ("unpad+fused bf16", True, True, torch.bfloat16, False, BF16_ATOL)]
    if not args.no_compile:
        cases.append(("compile fused bf16", False, True, torch.bfloat16, True, BF16_ATOL))
    print(f"| case ({args.preset}, B=32, T=128, lengths 16..128) | max abs diff vs plain fp32 | tolerance | ok |")
    print("|---|---|---|---|")
    for name, unpad, fused, dtype, compiled, tol in cases:
        diff = (run(unpad, fused, dtype, compiled)[real] - reference[real]).abs().max().item()
        ok = diff <= tol
        failures += [] if ok else [name]
        print(f"| {name} | {diff:.2e} | {tol:.0e} | {'yes' if ok else 'NO'} |", flush=True)

    # One training step: loss and gradient norm, plain fp32 vs unpadded+fused bf16.
    torch.manual_seed(1)
    pretraining = BertForPretraining(config.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    pretraining.to(device)
    positions = torch.stack([torch.randperm(14, generator=torch.Generator().manual_seed(i))[:4] + 1
                             for i in range(ids.shape[0])]).to(device)
    labels = ids.gather(1, positions)
    nsp = (torch.arange(ids.shape[0], device=device) % 2)
    results = {}
    for name, fast, dtype in (("plain fp32", False, None), ("unpad+fused bf16", True, torch.bfloat16)):
        pretraining.zero_grad(set_to_none=True)
        set_fast_paths(pretraining, unpad=fast, fused_qkv=fast)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            out = pretraining(ids, None, mask, mlm_positions=positions, mlm_labels=labels, nsp_labels=nsp)
        out.loss.backward()
        norm = torch.sqrt(sum(p.grad.float().pow(2).sum() for p in pretraining.parameters() if p.grad is not None))
        results[name] = (out.loss.item(), norm.item())
    (l0, g0), (l1, g1) = results["plain fp32"], results["unpad+fused bf16"]
    loss_ok = abs(l1 - l0) / l0 <= BF16_LOSS_RTOL
    failures += [] if loss_ok else ["train step loss"]
    print(f"\ntrain step: loss fp32 {l0:.5f} vs fast bf16 {l1:.5f} (rel {abs(l1 - l0) / l0:.1e}, tol "
          f"{BF16_LOSS_RTOL:.0e}); grad norm {g0:.4f} vs {g1:.4f}")
    print("FAILED: " + ", ".join(failures) if failures else "all fast paths within tolerance")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
