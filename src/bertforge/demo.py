"""`bertforge demo`: BERT's two stages, end to end, on the bundled books, in a few minutes of CPU.

1. learn a WordPiece vocabulary from the books;  2. cut them into pretraining instances (shards);
3. ask a freshly initialised model to fill in masked words (sentences of held-out documents);  4. pretrain
a small BERT for the steps a time budget holds on this machine, or for --minutes (masked LM without
next-sentence prediction, warmup-stable-decay schedule: the recipe that learned most in the same minutes
here), said up front from a timed warm-up of a few steps on this machine, and report held-out MLM accuracy against the majority-token
baseline;  5. ask again;  6. fine-tune it to tell which book a sentence comes from and report dev
accuracy against chance;  7. write a report folder (summary.md, curves, every intermediate artifact).
It uses only the public pieces (tokenization, data, training, inference) — the same calls a user makes.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from bertforge.data.corpus import read_documents
from bertforge.data.masking import MaskingConfig
from bertforge.data.preparation import prepare_corpus
from bertforge.data.text_files import resolve_inputs
from bertforge.errors import DataError
from bertforge.families.pretraining import FAMILY as PRETRAINING
from bertforge.families.pretraining import BertForPretraining
from bertforge.model.config import BertConfig
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
from bertforge.training.logging import read_metrics
from bertforge.training.pretraining import PretrainConfig, run_pretraining

log = logging.getLogger("bertforge.demo")
SEQUENCE_LENGTH = 64
HELDOUT_DOCUMENTS = 8  # of the books' documents, for held-out MLM accuracy (the fill-mask sentences are from them)
# The recipe, from 4-minute runs of each on the books (tiny, batch 32, lr 1e-3, one seed; docs/pretraining.md):
# held-out MLM accuracy 0.150 with NSP and the linear schedule (Google's), 0.166 without NSP, 0.155 with NSP and
# WSD, 0.226 without NSP and with WSD, whose fill-mask answers alone fit the sentences.
OBJECTIVE = "mlm"
OBJECTIVE_WORDS = "masked LM, no next-sentence prediction"
SCHEDULE = "wsd"
MASK_RATE = 0.15
# Past the plateau of predicting only frequent tokens and punctuation: with that recipe, at 1,251 steps the
# held-out MLM accuracy is 2.4x the majority baseline but fill-mask still answers ", . the" everywhere; at
# 3,120 steps it is 3.8x and the answers differ by sentence ("house, room, door"; "elizabeth, mr, he").
MIN_PRETRAIN_STEPS = 3000
DEFAULT_MINUTES = 5.0  # the pretraining budget when none is given (~3,500 steps on a quiet 2-core machine)
# The smallest preset: on 2 CPU cores the number of optimizer steps, not the width, is what gets BERT past
# its plateau in minutes; a step of "tiny" costs a fraction of one of "mini".
DEFAULT_MODEL = "tiny"
BATCH_SIZE = 32
PEAK_LR = 1e-3  # small BERTs need a higher peak than BERT-base's 1e-4 to leave the plateau within minutes
WARMUP_RATIO = 0.06
EVALUATIONS = 5  # held-out evaluations during pretraining (the curves)
EVAL_BATCHES = 20
TIMING_STEPS = 15  # the warm-up that times a step on this machine before the budget is turned into steps
TIMING_LOG_EVERY = 5


@dataclass(frozen=True)
class Language:
    vocab_size: int
    min_sentence_chars: int
    probes: tuple[str, ...]
    answers: tuple[str, ...] = ()  # the word each probe's text had, where it is a sentence of the books


LANGUAGES = {
    # Sentences of the held-out documents (never trained on), each with one word a reader can fill in.
    "en": Language(8000, 40, (
        "Lucy was really tired, and we intended to creep off to [MASK] as soon as we could.",
        "I lit a match and found that she was not in the [MASK].",
        "He took her [MASK] and patted it as he replied:--",
        "“Are they, indeed?” cried [MASK], with the greatest satisfaction.",
        "In about a week after the arrival of Elizabeth’s letter we returned to [MASK].",
    ), ("bed", "room", "hand", "Elizabeth", "Geneva")),
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


def fill_masks(model_dir: Path, spec: Language) -> list[dict]:
    """The model's five likeliest tokens for each probe's [MASK], as it ranks them (nothing left out), beside
    the word the book has there."""
    from bertforge.inference.pipelines import load_pipeline

    pipeline = load_pipeline(model_dir, "fill-mask", device="cpu", precision="fp32")
    results = []
    answers = spec.answers or ("",) * len(spec.probes)
    for probe, answer, out in zip(spec.probes, answers, pipeline(list(spec.probes), top_k=5)):
        guesses = [p["token"] for p in out["masks"][0]["predictions"]]
        results.append({"text": probe, "top5": guesses, "answer": answer})
        book = f"   (the book: {answer})" if answer else ""
        print(f"    {probe}{book}\n      -> {', '.join(guesses)}")
    return results


def run_demo(lang: str = "en", out: str | Path = "runs/demo", corpus: str | Path | None = None,
             minutes: float | None = None, model: str = DEFAULT_MODEL, seed: int = 0) -> dict:
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
    # plateau (predicting only frequent tokens), so each step is kept cheap.
    print(f"[2/6] pretraining instances (max {SEQUENCE_LENGTH} tokens)")
    report = prepare_corpus(files, tokenizer, out / "data", max_seq_length=SEQUENCE_LENGTH,
                            heldout_documents=HELDOUT_DOCUMENTS, seed=seed)
    tokenizer.save_pretrained(out / "data")
    print("      " + report.summary().replace("\n", "\n      "))
    summary["instances"] = report.instances

    config = BertConfig.preset(model, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id)
    initial = PRETRAINING.training.model_class_for(OBJECTIVE)(config)
    initial.save_pretrained(out / "initial", tokenizer=tokenizer)
    print("[3/6] fill-mask with random weights (before pretraining), the model's top 5 as it ranks them:")
    summary["fill_mask_before"] = fill_masks(out / "initial", spec)

    pretrained = _pretrain(config, initial, out, model, minutes, seed, summary)

    print("[5/6] fill-mask after pretraining, the model's top 5 as it ranks them:")
    summary["fill_mask_after"] = fill_masks(pretrained, spec)

    _classify_books(files, pretrained, spec, out, rng, seed, summary)
    _write_report(out, summary, started)
    return summary


def pretraining_budget(minutes: float | None, step_seconds: float) -> tuple[float, int, str]:
    """(minutes, steps expected, what to say of them): the pretraining time budget for `minutes` (None: the
    default budget, raised to what MIN_PRETRAIN_STEPS take at `step_seconds` per step) and the steps it holds,
    10% of the budget kept for evaluation."""
    budget = DEFAULT_MINUTES if minutes is None else minutes
    budget_steps = max(1, int(budget * 60 * 0.9 / step_seconds))
    # Fewer steps than MIN_PRETRAIN_STEPS leave the model on its plateau and the classifier after it collapses
    # to one class, which shows nothing: by default a slow or busy machine takes longer instead; a budget the
    # user gave is theirs to keep.
    if minutes is None and budget_steps < MIN_PRETRAIN_STEPS:
        needed = MIN_PRETRAIN_STEPS * step_seconds / 0.9 / 60
        return needed, MIN_PRETRAIN_STEPS, (f"; more than the default {budget:g} min, which would allow only "
                                            f"{budget_steps} steps: pass --minutes to keep to a budget")
    if budget_steps < MIN_PRETRAIN_STEPS:
        return budget, budget_steps, (f"; --minutes {budget:g} allows fewer than {MIN_PRETRAIN_STEPS} steps: expect "
                                      "fill-mask to guess frequent tokens and the book classifier to stay near chance")
    return budget, budget_steps, ""


def pretraining_length(minutes: float | None, budget: float, steps: int) -> tuple[int, float]:
    """(steps, minutes) that end the pretraining run: a budget the user gave (`minutes`) ends it on time; the
    default ends it after the `steps` the measured warm-up expects of `budget`, so a machine that slows down
    after the warm-up (other jobs start) takes longer rather than stopping before the model has learned (a 2-core
    machine whose load rose from 2 to 15 gave 420 of 3,000 steps in the time: fill-mask answered ', . the')."""
    return (0, budget) if minutes is not None else (steps, 0.0)


@dataclass(frozen=True)
class StepCost:
    """What a pretraining step and a held-out evaluation cost on this machine, measured (seconds)."""

    step_seconds: float
    eval_seconds: float


def pretraining_settings(model: str, data_dir: Path, out_dir: Path, steps: int, seed: int,
                         progress: bool = True, minutes: float = 0.0) -> PretrainConfig:
    """The demo's pretraining run on the CPU, batches of BATCH_SIZE, EVALUATIONS held-out evaluations: `steps`
    steps, or with `minutes` a time budget that ends the run (`steps` is then what it is expected to hold, for
    the cadence of logs and evaluations)."""
    training = TrainingConfig(steps=0 if minutes else steps, minutes=minutes, batch_size=BATCH_SIZE, lr=PEAK_LR,
                              schedule=SCHEDULE, warmup_ratio=WARMUP_RATIO, log_every=max(1, steps // 20),
                              eval_every=max(1, steps // EVALUATIONS), save_every=0, keep_last=1, seed=seed,
                              out_dir=str(out_dir), precision="fp32", device="cpu", progress=progress)
    return PretrainConfig(data_dir=str(data_dir), model=model, eval_batches=EVAL_BATCHES, objective=OBJECTIVE,
                          masking=MaskingConfig(mlm_probability=MASK_RATE), training=training)


def measure_step_cost(model: str, data_dir: Path, out_dir: Path, seed: int) -> StepCost:
    """Time the demo's own pretraining on this machine, as it is loaded now: a warm-up run of
    TIMING_STEPS steps on the prepared data and one held-out evaluation. The first logging window is left
    out (first-call costs); the times come from the run's own metrics log."""
    config = pretraining_settings(model, data_dir, out_dir, TIMING_STEPS, seed, progress=False)
    # One evaluation, at the end, after the last timed step.
    config = replace(config, training=replace(config.training, log_every=TIMING_LOG_EVERY, eval_every=0))
    quiet = logging.getLogger("bertforge")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # the warm-up's own log lines would read like the real run's
    try:
        run_pretraining(config)
    finally:
        quiet.setLevel(level)
    events = read_metrics(out_dir)
    train = [e for e in events if e["split"] == "train"]
    evaluation = next(e for e in events if e["split"] == "eval")
    shutil.rmtree(out_dir, ignore_errors=True)
    step_seconds = (train[-1]["time"] - train[0]["time"]) / max(1, train[-1]["step"] - train[0]["step"])
    return StepCost(step_seconds=max(step_seconds, 1e-3), eval_seconds=max(0.0, evaluation["time"] - train[-1]["time"]))


def _pretrain(config: BertConfig, initial: BertForPretraining, out: Path, model: str, minutes: float | None,
              seed: int, summary: dict) -> Path | None:
    """Step 4: pretrain for a time budget given, else for the steps the default budget holds at the step time of
    a measured warm-up (at least MIN_PRETRAIN_STEPS), said up front; the checkpoint directory."""
    cost = measure_step_cost(model, out / "data", out / "timing", seed)
    budget, steps, note = pretraining_budget(minutes, cost.step_seconds)
    # The run ends when its steps are done (the default) or its time budget is spent (--minutes; the schedule
    # then decays on time), and evaluates once more.
    run_steps, run_minutes = pretraining_length(minutes, budget, steps)
    estimate = budget + cost.eval_seconds / 60
    length = f"{run_steps} steps of {BATCH_SIZE}, about {budget:.1f} min" if run_steps else \
        f"{budget:.1f} min, about {steps} steps of {BATCH_SIZE}"
    print(f"[4/6] pretraining {model} ({sum(p.numel() for p in initial.parameters()) / 1e6:.1f}M parameters, "
          f"{OBJECTIVE_WORDS}) for {length} ({estimate:.1f} min with the last evaluation) at "
          f"{1000 * cost.step_seconds:.0f} ms per step, timed in a warm-up of {TIMING_STEPS} steps on this machine "
          f"now{note}")
    started = time.perf_counter()
    result = run_pretraining(pretraining_settings(model, out / "data", out / "pretrain", steps, seed,
                                                  minutes=run_minutes))
    minutes_taken = (time.perf_counter() - started) / 60
    heldout = result.eval
    baseline = heldout.get("mlm_majority_acc", float("nan"))
    summary["pretraining"] = {"steps": result.step, "seconds": result.seconds, "train": result.train,
                              "heldout": heldout, "estimated_minutes": estimate, "minutes": minutes_taken,
                              "step_seconds_measured": cost.step_seconds, "eval_seconds_measured": cost.eval_seconds}
    print(f"      took {minutes_taken:.1f} min (estimated {estimate:.1f}), {result.step} steps")
    nsp = f"; NSP accuracy {heldout['nsp_acc']:.3f} (chance 0.5)" if "nsp_acc" in heldout else ""
    print(f"      held-out MLM accuracy {heldout.get('mlm_acc', float('nan')):.3f}, "
          f"{heldout.get('mlm_acc', float('nan')) / baseline:.1f}x the majority-token baseline {baseline:.3f} "
          f"(always guessing the most frequent token){nsp}")
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
             f"- pretraining: {s['model']}, {OBJECTIVE_WORDS}, {SCHEDULE} schedule, {pre['steps']} steps in "
             f"{pre['seconds'] / 60:.1f} min; held-out MLM accuracy {pre['heldout'].get('mlm_acc', 0):.3f} "
             f"(majority-token baseline {pre['heldout'].get('mlm_majority_acc', 0):.3f})",
             f"- book classification dev accuracy: {s['book_classification']['dev_accuracy']:.3f} "
             f"(chance {s['book_classification']['chance']:.3f})", "",
             "## fill-mask, before -> after (the model's top 5; the book's word in brackets)", ""]
    for before, after in zip(s["fill_mask_before"], s["fill_mask_after"]):
        book = f" [{before['answer']}]" if before.get("answer") else ""
        lines.append(f"- `{before['text']}`{book}: {', '.join(before['top5'])} -> **{', '.join(after['top5'])}**")
    if s.get("curves"):
        lines += ["", "![pretraining curves](pretraining_curves.png)"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
