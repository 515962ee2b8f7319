"""ModernBERT encoder forward, ours (`model/modernbert.py`) against transformers' `ModernBertModel`, in one process.

Both sides hold the same random weights (copied through our key table) of a ModernBERT-base-shaped config
(22 layers, hidden 768, GeGLU 1,152, a global layer every third layer, 128-token window), fp32 on the CPU, the
same thread count, the same batch of full-length rows (every token real). transformers runs its SDPA attention
(its default on CPU: no flash kernels there); ours runs as constructed (its unpadded layout). Each shape times
the two sides alternately (ours, theirs, theirs, ours, ...: `model_speed.time_pair`) after untimed warm-ups and
reports the medians, their ratio and the largest difference of the outputs.

    python -m benchmarks.modernbert_speed --shapes 32x512,8x2048 --threads 2
"""

from __future__ import annotations

import argparse
import os
import platform

import torch

from benchmarks.model_speed import time_pair
from bertforge.checkpoint_format import hf_state_dict
from bertforge.interop import modernbert as hf_modernbert
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.modernbert import ModernBertModel


def twins(config: ModernBertConfig, seed: int = 0):
    """(ours, theirs) in eval mode with the same weights."""
    import transformers

    torch.manual_seed(seed)
    ours = ModernBertModel(config).eval()
    data = hf_modernbert.config_to_hf(config.to_dict(), "ModernBertModel")
    theirs = transformers.ModernBertModel(transformers.ModernBertConfig.from_dict(data, attn_implementation="sdpa"))
    theirs = theirs.eval()
    state = {k.removeprefix(hf_modernbert.THEIR_ENCODER_PREFIX): v for k, v in hf_state_dict(ours).items()}
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"weight copy failed: missing {missing[:4]}, unexpected {unexpected[:4]}")
    return ours, theirs


def time_shape(ours, theirs, rows: int, tokens: int, warmup: int, repeats: int) -> tuple[float, float, float]:
    """(our median s, their median s, max |ours - theirs|) on one batch of `rows` full rows of `tokens`."""
    generator = torch.Generator().manual_seed(rows * tokens)
    ids = torch.randint(5, ours.config.vocab_size, (rows, tokens), generator=generator)
    mask = torch.ones_like(ids)
    outputs = {}

    @torch.inference_mode()
    def run_ours():
        outputs["ours"] = ours(ids, attention_mask=mask).last_hidden_state

    @torch.inference_mode()
    def run_theirs():
        outputs["theirs"] = theirs(input_ids=ids, attention_mask=mask).last_hidden_state

    ours_s, theirs_s = time_pair(run_ours, run_theirs, torch.device("cpu"), warmup, repeats)
    return ours_s, theirs_s, float((outputs["ours"] - outputs["theirs"]).abs().max())


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """"32x512,8x2048" -> [(32, 512), (8, 2048)] (rows x tokens)."""
    return [tuple(int(n) for n in part.split("x")) for part in text.split(",")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="32x512,8x2048", help="rows x tokens per batch, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls of each side per shape")
    parser.add_argument("--preset", default="base")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    config = ModernBertConfig.preset(args.preset)
    ours, theirs = twins(config)
    import transformers

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; torch {torch.__version__}, "
          f"transformers {transformers.__version__}; threads {args.threads}; fp32; preset {args.preset}; "
          f"warmup {args.warmup}, {args.repeats} timed repeats each, alternated")
    print("| rows x tokens | ours s/batch | transformers s/batch | speed-up (theirs / ours) | max abs diff |")
    print("|---|---:|---:|---:|---:|")
    for rows, tokens in parse_shapes(args.shapes):
        ours_s, theirs_s, diff = time_shape(ours, theirs, rows, tokens, args.warmup, args.repeats)
        print(f"| {rows} x {tokens} | {ours_s:.2f} | {theirs_s:.2f} | {theirs_s / ours_s:.2f}x | {diff:.1e} |",
              flush=True)

if __name__ == "__main__":
    main()
