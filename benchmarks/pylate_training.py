"""PyLate's training of a ColBERT model on (anchor, positive) pairs: the reference side of
benchmarks/late_interaction_quality.py, run in PyLate's own virtual environment (it pins sentence-transformers and
transformers versions the suite does not use; docs/retrieval.md says how to make it):

    /work/pylate-venv/bin/python benchmarks/pylate_training.py --model MINILM --pairs train_pairs.tsv \
        --limit 2000 --out runs/pylate_seed1 --seed 1

The recipe is the one `bertforge finetune --format colbert-pairs` is given: the first `--limit` pairs of the
TSV (anchor<TAB>positive, with a header), one epoch, the batch size, learning rate, linear warmup then decay,
AdamW's weight decay and epsilon, gradient clipping at 1.0, the seed, the model's query and document lengths,
[unused0] / [unused1] markers, [MASK] query expansion not attended to, and PyLate's contrastive loss (in-batch
negatives, cross-entropy over MaxSim at temperature 1). It saves the model (PyLate's directory) in --out and
writes --out/pylate_training.json: the seconds `trainer.train()` took, examples, steps, versions.
Imports nothing of bertforge (it runs beside it, not inside it).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path


def read_pairs(path: Path, limit: int) -> tuple[list[str], list[str]]:
    anchors, positives = [], []
    with path.open(encoding="utf-8", newline="") as handle:
        rows = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(rows)
        a, p = header.index("anchor"), header.index("positive")
        for row in rows:
            if len(anchors) == limit:
                break
            anchors.append(row[a])
            positives.append(row[p])
    return anchors, positives


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--pairs", required=True, type=Path)
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--warmup-ratio", type=float, default=0.1)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--eps", type=float, default=1e-6)
    parser.add_argument("--query-length", type=int, default=32)
    parser.add_argument("--document-length", type=int, default=180)
    parser.add_argument("--dimension", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import pylate
    import sentence_transformers
    import torch
    import transformers
    from datasets import Dataset
    from pylate import losses, models, utils
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    if args.threads:
        torch.set_num_threads(args.threads)
    anchors, positives = read_pairs(args.pairs, args.limit)
    transformers.set_seed(args.seed)  # the projection's initialisation follows the seed, as ours does
    model = models.ColBERT(model_name_or_path=args.model, device="cpu", query_prefix="[unused0]",
                           document_prefix="[unused1]", query_length=args.query_length,
                           document_length=args.document_length, attend_to_expansion_tokens=False,
                           embedding_size=args.dimension)
    dataset = Dataset.from_dict({"anchor": anchors, "positive": positives})
    training = SentenceTransformerTrainingArguments(
        output_dir=str(args.out / "trainer"), num_train_epochs=1, per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr, warmup_ratio=args.warmup_ratio, weight_decay=args.weight_decay,
        adam_epsilon=args.eps, max_grad_norm=1.0, lr_scheduler_type="linear", seed=args.seed, data_seed=args.seed,
        save_strategy="no", logging_steps=10, report_to="none", use_cpu=True, dataloader_drop_last=False)
    trainer = SentenceTransformerTrainer(model=model, args=training, train_dataset=dataset,
                                         loss=losses.Contrastive(model=model),
                                         data_collator=utils.ColBERTCollator(model.tokenize))
    started = time.perf_counter()
    state = trainer.train()
    seconds = time.perf_counter() - started
    model.save(str(args.out))
    report = {"seconds": seconds, "examples": len(anchors), "steps": state.global_step,
              "training_loss": state.training_loss, "threads": torch.get_num_threads(),
              "versions": {"pylate": pylate.__version__, "sentence_transformers": sentence_transformers.__version__,
                           "transformers": transformers.__version__, "torch": torch.__version__,
                           "python": sys.version.split()[0]}}
    (args.out / "pylate_training.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
