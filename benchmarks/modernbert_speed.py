"""ModernBERT encoder forward, ours (`model/modernbert.py`) against transformers' `ModernBertModel`, in one process.

Both sides hold the same random weights (copied through our key table) of a ModernBERT-base-shaped config
(22 layers, hidden 768, GeGLU 1,152, a global layer every third layer, 128-token window), fp32 on the CPU, the
same thread count, the same batch of full-length rows (every token real). transformers runs its SDPA attention
(its default on CPU: no flash kernels there; its eager attention is slower); ours runs twice: the model as
constructed, and through the engine every inference command runs (`engine.build_engine`, torch at fp32: the
model plus row chunks, `engine.row_chunks`). Each shape times the sides in turn, the order rotated every repeat,
after untimed warm-ups, and reports the median wall time and process CPU time of each, the ratios (theirs /
ours) and the largest difference of the outputs. `--layers` keeps the preset's shapes with fewer layers (the
same share of global layers when a multiple of 3), for a loaded machine. `--neighbours N` runs N CPU-bound
processes beside the timed calls (`python -c 'while 1: pass'`, as `benchmarks.shared_cpu`), for the figure on a
busy machine.

    python -m benchmarks.modernbert_speed --shapes 32x512,32x2048 --threads 2
    python -m benchmarks.modernbert_speed --shapes 32x512 --threads 2 --neighbours 1
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import time

import torch

from benchmarks.shared_cpu import start_neighbours, stop_neighbours
from bertforge.checkpoint_format import hf_state_dict
from bertforge.engine.build import build_engine
from bertforge.engine.plan import EnginePlan
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


def time_sides(sides: dict, warmup: int, repeats: int) -> dict[str, tuple[float, float]]:
    """Per side, (median wall s, median process CPU s) per call, the sides called in turn, the order rotated every
    repeat, so that a load change on a shared machine hits every side alike."""
    for _ in range(warmup):
        for run in sides.values():
            run()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    names = list(sides)
    for repeat in range(repeats):
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            wall, cpu = time.perf_counter(), time.process_time()
            sides[name]()
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    return {name: (statistics.median(t[0] for t in pairs), statistics.median(t[1] for t in pairs))
            for name, pairs in times.items()}


def time_shape(ours, theirs, rows: int, tokens: int, warmup: int, repeats: int, engine=None) -> dict:
    """{side: (median wall s, median CPU s)} for "ours", "theirs" (and "engine" when given) on one batch of `rows`
    full rows of `tokens`, and "diff": the largest |ours - theirs| (and |engine - theirs|) of the outputs."""
    generator = torch.Generator().manual_seed(rows * tokens)
    ids = torch.randint(5, ours.config.vocab_size, (rows, tokens), generator=generator)
    mask = torch.ones_like(ids)
    outputs = {}

    def runner(name, model, **inputs):
        @torch.inference_mode()
        def run():
            outputs[name] = model(**inputs).last_hidden_state
        return run

    sides = {"ours": runner("ours", ours, input_ids=ids, attention_mask=mask),
             "theirs": runner("theirs", theirs, input_ids=ids, attention_mask=mask)}
    if engine is not None:
        sides["engine"] = runner("engine", engine, input_ids=ids, attention_mask=mask)
    result = time_sides(sides, warmup, repeats)
    result["diff"] = max(float((outputs[name] - outputs["theirs"]).abs().max()) for name in sides if name != "theirs")
    return result


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """"32x512,8x2048" -> [(32, 512), (8, 2048)] (rows x tokens)."""
    return [tuple(int(n) for n in part.split("x")) for part in text.split(",")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="32x512,32x2048", help="rows x tokens per batch, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls of each side per shape")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--layers", type=int, default=None, help="the preset's layer count when not given")
    parser.add_argument("--neighbours", type=int, default=0, help="CPU-bound processes running beside the calls")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    overrides = {} if args.layers is None else {"num_hidden_layers": args.layers}
    config = ModernBertConfig.preset(args.preset, **overrides)
    ours, theirs = twins(config)
    engine = build_engine(copy.deepcopy(ours), EnginePlan(torch.device("cpu"), "fp32", "torch", threads=args.threads))
    import transformers

    with open("/proc/loadavg") as handle:
        load = " ".join(handle.read().split()[:3])
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {load}; torch "
          f"{torch.__version__}, transformers {transformers.__version__}; threads {args.threads}; fp32; preset "
          f"{args.preset}, {config.num_hidden_layers} layers; warmup {args.warmup}, {args.repeats} timed repeats "
          f"each, order rotated; {args.neighbours} CPU-bound processes beside")
    print("| rows x tokens | ours s (CPU s) | ours, engine s (CPU s) | transformers s (CPU s) | theirs / ours wall "
          "(CPU) | theirs / engine wall (CPU) | max abs diff |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    neighbours = start_neighbours(args.neighbours)
    try:
        for rows, tokens in parse_shapes(args.shapes):
            report_shape(ours, theirs, engine, rows, tokens, args)
    finally:
        stop_neighbours(neighbours)
    with open("/proc/loadavg") as handle:
        print(f"load after: {' '.join(handle.read().split()[:3])}")


def report_shape(ours, theirs, engine, rows: int, tokens: int, args: argparse.Namespace) -> None:
    """One table row: the three sides timed on one shape."""
    result = time_shape(ours, theirs, rows, tokens, args.warmup, args.repeats, engine)
    (ours_s, ours_c), (engine_s, engine_c), (theirs_s, theirs_c) = (result[k] for k in ("ours", "engine", "theirs"))
    print(f"| {rows} x {tokens} | {ours_s:.2f} ({ours_c:.2f}) | {engine_s:.2f} ({engine_c:.2f}) | {theirs_s:.2f} "
          f"({theirs_c:.2f}) | {theirs_s / ours_s:.2f}x ({theirs_c / ours_c:.2f}x) | {theirs_s / engine_s:.2f}x "
          f"({theirs_c / engine_c:.2f}x) | {result['diff']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
