"""`bertforge demo`: BERT's two stages, end to end, on the bundled books, in a few minutes of CPU.

1. learn a WordPiece vocabulary from the books;  2. cut them into pretraining instances (shards);
3. ask a freshly initialised model to fill in masked words;  4. pretrain a small BERT (MLM + NSP) for a
fixed time budget;  5. ask again;  6. fine-tune it to tell which book a sentence comes from and report dev
accuracy against chance;  7. write a report folder (summary.md, curves, every intermediate artifact).
It uses only the public pieces (tokenization, data, training, inference) — the same calls a user makes.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bertforge.data.corpus import read_documents
from bertforge.data.preparation import prepare_corpus
from bertforge.data.text_files import resolve_inputs
from bertforge.errors import DataError
from bertforge.families.pretraining import BertForPretraining
from bertforge.model.config import BertConfig
from bertforge.model.fast_paths import set_fast_paths
from bertforge.tokenization import Tokenizer, TokenizerConfig
from bertforge.tokenization.vocab_builder import build_vocab, unk_rate
from bertforge.training.config import TrainingConfig
from bertforge.training.finetune import run_finetuning
from bertforge.training.finetune_config import (
    DataConfig,
    FeatureConfig,
    FinetuneConfig,
    FinetuneTrainingConfig,
)
from bertforge.training.pretraining import PretrainConfig, run_pretraining

log = logging.getLogger("bertforge.demo")
SEQUENCE_LENGTH = 64
MIN_PRETRAIN_STEPS = 300  # past the early plateau of predicting only frequent tokens (~250-300 steps here)
DEFAULT_MINUTES = 3.5  # the pretraining budget when none is given


@dataclass(frozen=True)
class Language:
    vocab_size: int
    min_sentence_chars: int
    probes: tuple[str, ...]


LANGUAGES = {
    "en": Language(8000, 40, (
        "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
        "must be in want of a [MASK].",
        "I opened the [MASK] and walked into the room.",
        "The night was dark and the [MASK] was cold.",
        "She could not help [MASK] at him.",
    )),
    "zh": Language(7000, 12, (
        "话说天下大[MASK]，分久必合，合久必分。",
        "宝玉听了，忙[MASK]：“姐姐何必如此。”",
        "行者道：“师父放[MASK]，我去去就来。”",
        "宋江听罢，大[MASK]道：“兄弟休怪。”",
    )),
}


def book_sentences(path: Path, min_chars: int) -> list[str]:
    return [s for doc in read_documents(path, log_warnings=False) for s in doc.sentences if len(s) >= min_chars]


def write_book_task(files: list[Path], out: Path, min_chars: int, per_book_train: int, per_book_dev: int,
                    rng: random.Random) -> tuple[Path, Path, list[str]]:
    """Sentence -> book title: train from the first 85% of each book, dev from the last 15% (no overlap)."""
    train, dev, labels = [], [], []
    for path in files:
        label = path.stem
        labels.append(label)
        sentences = book_sentences(path, min_chars)
        cut = int(len(sentences) * 0.85)
        head, tail = sentences[:cut], sentences[cut:]
        train += [(s, label) for s in rng.sample(head, min(per_book_train, len(head)))]
        dev += [(s, label) for s in rng.sample(tail, min(per_book_dev, len(tail)))]
    rng.shuffle(train)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, rows in (("train.tsv", train), ("dev.tsv", dev)):
        text = "text_a\tlabel\n" + "".join(f"{s.replace(chr(9), ' ')}\t{label}\n" for s, label in rows)
        (out / name).write_text(text, encoding="utf-8")
        paths.append(out / name)
    return paths[0], paths[1], labels


def fill_masks(model_dir: Path, probes: tuple[str, ...]) -> list[dict]:
    from bertforge.inference.pipelines import load_pipeline

    pipeline = load_pipeline(model_dir, "fill-mask", device="cpu", precision="fp32")
    results = []
    for probe, out in zip(probes, pipeline(list(probes), top_k=5)):
        guesses = [p["token"] for p in out["masks"][0]["predictions"]]
        results.append({"text": probe, "top5": guesses})
        print(f"    {probe}\n      -> {', '.join(guesses)}")
    return results


def seconds_per_step(config: BertConfig, batch: int, tokens: int) -> float:
    """Time a few training steps on a synthetic batch, to fit the pretraining run into the time budget."""
    torch.manual_seed(0)
    model = BertForPretraining(config)
    set_fast_paths(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(5, config.vocab_size, (batch, tokens))
    positions = torch.randint(1, tokens - 1, (batch, max(1, round(0.15 * tokens))))
    labels = ids.gather(1, positions)
    nsp = torch.zeros(batch, dtype=torch.long)
    timings = []
    for _ in range(4):
        start = time.perf_counter()
        model(ids, mlm_positions=positions, mlm_labels=labels, nsp_labels=nsp).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        timings.append(time.perf_counter() - start)
    return sorted(timings[1:])[1]


def run_demo(lang: str = "en", out: str | Path = "runs/demo", corpus: str | Path | None = None,
             minutes: float | None = None, model: str = "mini", seed: int = 0) -> dict:
    """Run the whole demo; returns the figures it printed (also in `out/report/summary.json`).

    `minutes` is the pretraining time budget. Without it the budget is `DEFAULT_MINUTES`, and the demo
    pretrains at least `MIN_PRETRAIN_STEPS` (longer on a slow machine, said up front); a budget given is kept
    even when it allows fewer steps, and the demo says what that costs."""
    if lang not in LANGUAGES:
        raise DataError(f"no demo for language {lang!r}; choose one of {sorted(LANGUAGES)}")
    spec = LANGUAGES[lang]
    out = Path(out)
    corpus = Path(corpus) if corpus else Path("data/demo") / lang
    if not corpus.exists():
        raise DataError("the bundled corpus is missing; run the demo from the repository root or pass --corpus",
                        path=corpus)
    files = resolve_inputs(corpus)
    rng = random.Random(seed)
    summary: dict = {"lang": lang, "corpus": [str(f) for f in files], "model": model, "seed": seed}
    started = time.perf_counter()

    print(f"[1/6] vocabulary of {spec.vocab_size} WordPiece tokens from {len(files)} books in {corpus}")
    heldout_lines = [s for f in files for s in book_sentences(f, spec.min_sentence_chars)[-200:]]
    vocab = build_vocab(files, spec.vocab_size, lang=lang)
    tokenizer = Tokenizer(vocab, TokenizerConfig(do_lower_case=True))
    tokenizer.save_pretrained(out / "vocab")
    summary["unk_rate"] = unk_rate(tokenizer, heldout_lines)
    print(f"      [UNK] rate on the books' last sentences: {100 * summary['unk_rate']:.2f}%")

    # Short instances: in a few CPU minutes the number of optimizer steps is what gets BERT past its early
    # plateau (predicting only frequent tokens, ~250-300 steps here), so each step is kept cheap.
    print(f"[2/6] pretraining instances (max {SEQUENCE_LENGTH} tokens, 50% real next sentence / 50% random)")
    report = prepare_corpus(files, tokenizer, out / "data", max_seq_length=SEQUENCE_LENGTH, heldout_documents=8,
                            seed=seed)
    tokenizer.save_pretrained(out / "data")
    print("      " + report.summary().replace("\n", "\n      "))
    summary["instances"] = report.instances

    config = BertConfig.preset(model, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id)
    initial = BertForPretraining(config)
    initial.save_pretrained(out / "initial", tokenizer=tokenizer)
    print("[3/6] fill-mask with random weights (before pretraining):")
    summary["fill_mask_before"] = fill_masks(out / "initial", spec.probes)

    pretrained = _pretrain(config, initial, out, model, minutes, seed, summary)

    print("[5/6] fill-mask after pretraining:")
    summary["fill_mask_after"] = fill_masks(pretrained, spec.probes)

    _classify_books(files, pretrained, spec, out, rng, seed, summary)
    _write_report(out, summary, started)
    return summary


def pretraining_steps(minutes: float | None, step_seconds: float) -> tuple[int, str]:
    """(steps, what to say of them) for a budget of `minutes` (None: the default budget and the step floor)
    at `step_seconds` per step, 10% of the budget kept for evaluation and saving."""
    budget = DEFAULT_MINUTES if minutes is None else minutes
    budget_steps = max(1, int(budget * 60 * 0.9 / step_seconds))
    # Fewer steps than MIN_PRETRAIN_STEPS leave the model on its plateau and the classifier after it collapses
    # to one class, which shows nothing: by default a slow or busy machine takes longer instead; a budget the
    # user gave is theirs to keep.
    if minutes is None and budget_steps < MIN_PRETRAIN_STEPS:
        return MIN_PRETRAIN_STEPS, (f"; more than the default {budget:g} min, which would allow only {budget_steps} "
                                    "steps: pass --minutes to keep to a budget")
    if budget_steps < MIN_PRETRAIN_STEPS:
        return budget_steps, (f"; --minutes {budget:g} allows fewer than {MIN_PRETRAIN_STEPS} steps: expect fill-mask "
                              "to guess frequent tokens and the book classifier to stay near chance")
    return budget_steps, ""


def _pretrain(config: BertConfig, initial: BertForPretraining, out: Path, model: str, minutes: float | None,
              seed: int, summary: dict) -> Path | None:
    """Step 4: pretrain for as many steps as the time budget allows (without a budget given, at least
    MIN_PRETRAIN_STEPS); the checkpoint directory."""
    batch = 32
    step_seconds = seconds_per_step(config, batch, SEQUENCE_LENGTH)
    steps, note = pretraining_steps(minutes, step_seconds)
    estimate = steps * step_seconds / 60 / 0.9
    print(f"[4/6] pretraining {model} ({sum(p.numel() for p in initial.parameters()) / 1e6:.1f}M parameters) for "
          f"{steps} steps of {batch} (about {estimate:.1f} min on this machine{note})")
    training = TrainingConfig(steps=steps, batch_size=batch, lr=1e-3, warmup_ratio=0.06, log_every=max(1, steps // 20),
                              eval_every=max(1, steps // 5), save_every=0, keep_last=1, seed=seed,
                              out_dir=str(out / "pretrain"), precision="fp32", device="cpu")
    result = run_pretraining(PretrainConfig(data_dir=str(out / "data"), model=model, eval_batches=20,
                                            training=training))
    summary["pretraining"] = {"steps": result.step, "seconds": result.seconds, "train": result.train,
                              "heldout": result.eval}
    print(f"      held-out: MLM accuracy {result.eval.get('mlm_acc', float('nan')):.3f}, "
          f"NSP accuracy {result.eval.get('nsp_acc', float('nan')):.3f}")
    return result.checkpoint


def _classify_books(files: list[Path], pretrained: Path | None, spec: Language, out: Path, rng: random.Random,
                    seed: int, summary: dict) -> None:
    """Step 6: fine-tune the pretrained model to tell which book a sentence comes from."""
    train_file, dev_file, books = write_book_task(files, out / "books", spec.min_sentence_chars, 600, 150, rng)
    print(f"[6/6] fine-tuning: which of {len(books)} books is a sentence from? ({', '.join(books)})")
    finetune = run_finetuning(FinetuneConfig(
        model=str(pretrained),
        data=DataConfig(format="classification", train=str(train_file), dev=str(dev_file), text_a_column="text_a",
                        label_column="label"),
        features=FeatureConfig(max_seq_length=64),
        training=FinetuneTrainingConfig(out_dir=str(out / "finetune"), epochs=3, batch_size=32, lr=3e-4, seed=seed,
                                        device="cpu", precision="fp32", progress=False)))
    accuracy = finetune.best_metrics.get("accuracy", float("nan"))
    chance = 1 / len(books)
    summary["book_classification"] = {"dev_accuracy": accuracy, "chance": chance, "books": books,
                                      "model_dir": str(finetune.model_dir)}
    print(f"      dev accuracy {accuracy:.3f} (chance {chance:.3f})")


def _write_report(out: Path, summary: dict, started: float) -> None:
    """The report folder: pretraining curves (when matplotlib is there), summary.json and summary.md."""
    report_dir = out / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    try:
        from bertforge.inference.plots import plot_run

        summary["curves"] = str(plot_run(out / "pretrain", report_dir / "pretraining_curves.png"))
    except Exception as exc:  # plots are a convenience: a missing matplotlib must not fail the demo
        log.warning("no curves drawn (%s); install the [plot] extra", exc)
    summary["seconds"] = time.perf_counter() - started
    (report_dir / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n",
                                             encoding="utf-8")
    write_summary_markdown(report_dir / "summary.md", summary)
    print(f"done in {summary['seconds'] / 60:.1f} min; report in {report_dir}")


def write_summary_markdown(path: Path, s: dict) -> None:
    pre = s["pretraining"]
    lines = [f"# bertforge demo ({s['lang']})", "",
             f"- corpus: {len(s['corpus'])} books; vocabulary [UNK] rate {100 * s['unk_rate']:.2f}%",
             f"- pretraining: {s['model']}, {pre['steps']} steps in {pre['seconds'] / 60:.1f} min; held-out MLM "
             f"accuracy {pre['heldout'].get('mlm_acc', 0):.3f}, NSP accuracy {pre['heldout'].get('nsp_acc', 0):.3f}",
             f"- book classification dev accuracy: {s['book_classification']['dev_accuracy']:.3f} "
             f"(chance {s['book_classification']['chance']:.3f})", "", "## fill-mask, before -> after", ""]
    for before, after in zip(s["fill_mask_before"], s["fill_mask_after"]):
        lines.append(f"- `{before['text']}`: {', '.join(before['top5'])} -> **{', '.join(after['top5'])}**")
    if s.get("curves"):
        lines += ["", "![pretraining curves](pretraining_curves.png)"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
