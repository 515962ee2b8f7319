"""`bertforge demo`: BERT's two stages, end to end, on the bundled books, within a time budget on any CPU.

1. learn a WordPiece vocabulary from the books;  2. cut them into pretraining instances (shards);
3. ask a freshly initialised model to fill in masked words (sentences of held-out documents);  4. time a
warm-up of the pretraining on this machine as it is loaded now (at PyTorch's threads and at one: the cheaper
is kept), split what is left of the budget (--minutes, default DEFAULT_MINUTES) between pretraining and
fine-tuning (`plan_demo`), announce the whole demo's time, and pretrain a small BERT for its share of the
time (masked LM without next-sentence prediction, warmup-stable-decay on time: a machine that slows down
gets fewer steps and still decays), then report held-out MLM accuracy against the majority-token baseline;
5. ask again;  6. fine-tune it to tell which book a sentence comes from, sized to the time left, and report
dev accuracy against chance;  7. write a report folder (summary.md, curves, every intermediate artifact).
It uses only the public pieces (tokenization, data, training, inference) — the same calls a user makes.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from bertforge.data.corpus import read_documents
from bertforge.data.masking import MaskingConfig
from bertforge.data.preparation import prepare_corpus, split_documents
from bertforge.data.text_files import resolve_inputs
from bertforge.errors import ConfigError, DataError
from bertforge.families.pretraining import FAMILY as PRETRAINING
from bertforge.model.bert import BertPretrainedModel
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
from bertforge.training.pretraining import ARCH_DEFAULTS, PretrainConfig, preset_config, run_pretraining

log = logging.getLogger("bertforge.demo")
SEQUENCE_LENGTH = 64
HELDOUT_DOCUMENTS = 8  # of the books' documents, for held-out MLM accuracy (the fill-mask sentences are from them)
# The recipe, from 4-minute runs of each on the books (tiny, batch 32, lr 1e-3, one seed; docs/pretraining.md):
# held-out MLM accuracy 0.150 with NSP and the linear schedule (Google's), 0.166 without NSP, 0.155 with NSP and
# WSD, 0.226 without NSP and with WSD, whose fill-mask answers alone fit the sentences.
OBJECTIVE = "mlm"
OBJECTIVE_WORDS = "masked LM, no next-sentence prediction"
SCHEDULE = "wsd"
# For the steps a busy machine affords (hundreds, not thousands): in 600-step runs on the books (tiny, batch 32,
# one seed, docs/pretraining.md) an 8,000-token vocabulary and lr 1e-3 or 2e-3 stayed on the plateau of
# frequent tokens; 4,000 tokens at lr 2e-3 left it by step 400 (held-out MLM accuracy 2.1x the baseline at
# 600), masking 25% a little sooner (2.1x at 400); lr 3e-3 and 32-token instances stayed on it.
MASK_RATE = 0.25
# The whole demo's time budget (after the install) when --minutes is not given: warm-up, pretraining,
# fine-tuning and the report fit in it on any machine; a slower machine pretrains for fewer steps.
DEFAULT_MINUTES = 9.0
# Past the plateau of predicting only frequent tokens and punctuation: with the recipe (and MODEL_SETTINGS below),
# held-out MLM accuracy is 2.6x the majority baseline at 700 steps, 3.2x at 1,050 and 4.2x at 1,400, where 7 of
# the 8 probes' top-1 answers differ and 5 have the book's word in the top 5; a make demo of 1,200 steps: 3.4x,
# 5 of 8 and 1. A plan with fewer steps than this says what to expect.
LEARNING_STEPS = 1000
MIN_PRETRAIN_SECONDS = 30.0  # a budget too short for the machine still pretrains this long (said up front)
# The smallest preset: on 2 CPU cores the number of optimizer steps, not the width, is what gets BERT past
# its plateau in minutes; a step of "tiny" costs a fraction of one of "mini".
DEFAULT_MODEL = "tiny"
BATCH_SIZE = 32
# The model's settings for pretraining this few steps. No dropout (as Cramming): a model this small underfits in
# minutes, and a step costs less without it (1,400 steps, beside each other: 508 against 556 ms, held-out MLM
# accuracy 0.151 against 0.146; the classifier fine-tuned from it 0.726 against 0.702 on dev). Initial weights of
# std 0.05 instead of BERT's 0.02, with Adam's beta2 0.98 (RoBERTa's; `ADAM_BETAS`), tried together: held-out MLM
# accuracy 0.183 against 0.144 at 1,050 steps and 0.239 against 0.151 at 1,400, off the plateau of frequent
# tokens (fill-mask: the book's word among the top 5 for 5 of 8 probes against 0; docs/pretraining.md).
MODEL_SETTINGS = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "initializer_range": 0.05}
ADAM_BETAS = [0.9, 0.98]
PEAK_LR = 2e-3  # small BERTs need a higher peak than BERT-base's 1e-4 to leave the plateau within minutes
WARMUP_RATIO = 0.06
# Per `--arch`, the model overrides and masking rate (the rest of the recipe is shared). ModernBERT: the shape of
# benchmarks/pretrain_compare.py (BERT tiny's non-embedding parameters) at its 30% masking (docs/pretraining.md).
ARCH_RECIPES = {"bert": (MODEL_SETTINGS, MASK_RATE),
                "modernbert": ({"num_hidden_layers": 3, "intermediate_size": 176},
                               ARCH_DEFAULTS["modernbert"]["masking"]["mlm_probability"])}
DEFAULT_ARCH = "bert"
EVALUATIONS = 5  # held-out evaluations during pretraining (the curves)
EVAL_BATCHES = 20
TIMING_STEPS = 12  # the warm-up that times a step on this machine before the budget is planned
TIMING_LOG_EVERY = 4
# Fine-tuning (which book is a sentence from?): up to FINETUNE_SHARE of the time left after the warm-up, its
# training sentences cut to fit, never below FINETUNE_MIN_PER_BOOK a book.
FINETUNE_SHARE = 0.3
FINETUNE_BATCH = 32
FINETUNE_LR = 1e-3  # from a model pretrained 800 steps: dev accuracy 0.594 at 1e-3, 0.552 at 2e-3, (600 steps) 0.372 at 3e-4
FINETUNE_DEV_PER_BOOK = 150
FINETUNE_MIN_PER_BOOK = 100


@dataclass(frozen=True)
class BookTask:
    """The fine-tuning stage's size: training sentences per book, epochs, and the dev sentences per book."""

    per_book_train: int
    epochs: int
    per_book_dev: int = FINETUNE_DEV_PER_BOOK

    def steps(self, books: int) -> int:
        return self.epochs * math.ceil(books * self.per_book_train / FINETUNE_BATCH)

    def seconds(self, books: int, cost: StepCost) -> float:
        """Expected: its steps at the measured step cost, a dev evaluation per epoch, loading and saving."""
        steps = self.steps(books) * cost.step_seconds * FINETUNE_STEP_COST
        return steps + self.epochs * books * self.per_book_dev * cost.example_seconds + FINETUNE_OVERHEAD_SECONDS


# The largest: 2,400 sentences, 150 steps. Two epochs, the third's time pretraining: in that make demo dev accuracy
# was 0.614, 0.679, 0.723 after epochs 1-3 of 3.
FINETUNE_TASK = BookTask(per_book_train=600, epochs=2)
# A fine-tuning step (a batch of sentences, a 4-way head) over a pretraining step (64-token instances): 767 / 1,038
# ms; in a make demo at load 8-13, 252 steps (2,400 sentences give 2,667 windows) and 3 dev evaluations in 75 s
# beside pretraining steps of 365 ms, 0.8 with the evaluations. (A quieter run took 0.4 of 1.8 announced minutes,
# its machine's load falling; 0.3 made the demo end 0.3 min after its announcement.)
FINETUNE_STEP_COST = 0.8
FINETUNE_OVERHEAD_SECONDS = 10.0  # tokenizing the sentences, loading the model, saving the best one
REPORT_SECONDS = 15.0  # after pretraining: fill-mask, the curves and the report


@dataclass(frozen=True)
class Language:
    vocab_size: int
    min_sentence_chars: int


LANGUAGES = {"en": Language(4000, 40), "zh": Language(7000, 12)}

# The fill-mask probes, chosen by a fixed rule from the held-out documents (never trained on, never by a
# model's answers): in each held-out document, the content word its two neighbours predict best in the
# training documents. A content word is letters only, not one of the PROBE_COMMON commonest words of the
# training text, and one WordPiece token (one [MASK] stands for it); its trigram (left, word, right) must
# occur PROBE_MIN_COUNT times in the training text, its sentence have PROBE_WORDS words.
PROBE_COMMON = 100
PROBE_MIN_COUNT = 3
PROBE_WORDS = (6, 30)
PROBE_LETTERS = 3  # fewer are contractions' pieces (the "t" of "didn't"), not words; a CJK character is a word
TOP_K = 5  # fill-mask answers shown per probe
# Words as the rule counts them: a run of letters, a CJK character (BERT's unit in Chinese), a number, or one
# other character (punctuation is context too). A regular expression: the tokenizer's own pre-tokenization
# of the training text costs seconds of the demo's budget on a busy machine.
CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
WORD = re.compile(rf"[{CJK}]|[^\W\d_{CJK}]+|\d+|[^\w\s]")


@dataclass(frozen=True)
class Probe:
    """A held-out sentence with one word masked (`text`), the word the book has there (`answer`), and how well
    the training text predicts it from its two neighbours (`score`: the share of that context's occurrences
    that have this word, seen `count` times)."""

    text: str
    answer: str
    score: float
    count: int


def choose_probes(heldout: list[list[str]], train: list[list[str]], tokenizer: Tokenizer) -> list[Probe]:
    """One probe per held-out document (the documents' sentences), in order, by the rule above; a word is
    masked in one probe at most, and a document without a candidate gives none."""
    edge = ""  # the neighbour at a sentence's start or end

    def words(sentence: str) -> list[tuple[str, int, int]]:
        return [(m[0].lower(), m.start(), m.end()) for m in WORD.finditer(sentence)]

    trigrams: Counter[tuple[str, str, str]] = Counter()
    contexts: Counter[tuple[str, str]] = Counter()
    frequency: Counter[str] = Counter()
    for document in train:
        for sentence in document:
            seen = [edge, *(w for w, _, _ in words(sentence)), edge]
            frequency.update(seen[1:-1])
            for left, word, right in zip(seen, seen[1:], seen[2:]):
                trigrams[left, word, right] += 1
                contexts[left, right] += 1
    common = {word for word, _ in frequency.most_common(PROBE_COMMON)}
    single: dict[str, bool] = {}

    def content(word: str) -> bool:
        if word not in single:
            single[word] = (word.isalpha() and (len(word) >= PROBE_LETTERS or re.fullmatch(f"[{CJK}]", word))
                            and word not in common
                            and tokenizer.tokenize(word) == [word])
        return single[word]

    probes: list[Probe] = []
    used: set[str] = set()
    for document in heldout:
        best: Probe | None = None
        for sentence in document:
            spans = words(sentence)
            if not PROBE_WORDS[0] <= sum(w.isalpha() for w, _, _ in spans) <= PROBE_WORDS[1]:
                continue
            seen = [edge, *(w for w, _, _ in spans), edge]
            for i, (word, start, end) in enumerate(spans):
                count = trigrams[seen[i], word, seen[i + 2]]
                if count < PROBE_MIN_COUNT or word in used or not content(word):
                    continue
                score = count / contexts[seen[i], seen[i + 2]]
                if best is None or (score, count) > (best.score, best.count):
                    best = Probe(f"{sentence[:start]}[MASK]{sentence[end:]}", sentence[start:end], score, count)
        if best is not None:
            probes.append(best)
            used.add(best.answer.lower())
    return probes


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


def fill_masks(model_dir: Path, probes: list[Probe]) -> list[dict]:
    """The model's TOP_K likeliest tokens for each probe's [MASK], as it ranks them (nothing left out), beside
    the word the book has there."""
    from bertforge.inference.pipelines import load_pipeline

    # PyTorch, whatever `--engine auto` would pick: a few sentences are not worth an ONNX export of a model
    # that changes between the two calls.
    pipeline = load_pipeline(model_dir, "fill-mask", device="cpu", precision="fp32", engine="torch")
    results = []
    for probe, out in zip(probes, pipeline([p.text for p in probes], top_k=TOP_K)):
        guesses = [p["token"] for p in out["masks"][0]["predictions"]]
        results.append({"text": probe.text, "top5": guesses, "answer": probe.answer})
        print(f"    {probe.text}   (the book: {probe.answer})\n      -> {', '.join(guesses)}")
    print(f"    {describe_variety(answer_variety(results))}")
    return results


def answer_variety(results: list[dict]) -> dict[str, int]:
    """How far fill-mask answers depend on the sentence: distinct top-1 answers over the probes (a model on the
    plateau of frequent tokens answers the same one everywhere), and the probes whose book word is among the
    model's answers (case aside: the vocabulary is lowercased)."""
    return {"probes": len(results), "distinct_top1": len({r["top5"][0] for r in results if r["top5"]}),
            "book_word_in_top5": sum(r["answer"].lower() in r["top5"] for r in results)}


def describe_variety(variety: dict[str, int]) -> str:
    return (f"distinct top-1 answers: {variety['distinct_top1']} of {variety['probes']}; the book's word among the "
            f"top {TOP_K}: {variety['book_word_in_top5']} of {variety['probes']}")


def run_demo(lang: str = "en", out: str | Path = "runs/demo", corpus: str | Path | None = None,
             minutes: float | None = None, model: str = DEFAULT_MODEL, seed: int = 0,
             arch: str = DEFAULT_ARCH) -> dict:
    """Run the whole demo within `minutes` (default DEFAULT_MINUTES) from its start to its report; returns the
    figures it printed (also in `out/report/summary.json`).

    After the vocabulary, the instances and the first fill-mask, a warm-up times a pretraining step on this
    machine as it is loaded now; the rest of the budget is split between pretraining (a time budget of its own)
    and fine-tuning, and the whole demo's time is announced. Fine-tuning is sized again from what is left when
    pretraining ends. `arch` picks the encoder pretrained (`ARCH_RECIPES`: bert, or modernbert)."""
    if lang not in LANGUAGES:
        raise DataError(f"no demo for language {lang!r}; choose one of {sorted(LANGUAGES)}")
    if arch not in ARCH_RECIPES:
        raise ConfigError(f"--arch {arch!r} is not an architecture the demo pretrains; use {sorted(ARCH_RECIPES)}")
    if minutes is not None and not 0 < minutes < math.inf:
        raise ConfigError(f"--minutes {minutes:g} is not a time budget: give the demo's minutes, e.g. "
                          f"--minutes {DEFAULT_MINUTES:g}")
    spec = LANGUAGES[lang]
    out = Path(out)
    corpus = Path(corpus) if corpus else Path("data/demo") / lang
    if not corpus.exists():
        raise DataError("the bundled corpus is missing; run the demo from the repository root or pass --corpus",
                        path=corpus)
    files = resolve_inputs(corpus)
    rng = random.Random(seed)
    budget = 60 * (DEFAULT_MINUTES if minutes is None else minutes)
    summary: dict = {"lang": lang, "corpus": [str(f) for f in files], "model": model, "arch": arch, "seed": seed,
                     "budget_minutes": budget / 60}
    started = time.perf_counter()

    print(f"[1/6] vocabulary of {spec.vocab_size} WordPiece tokens from {len(files)} books in {corpus}; the demo's "
          f"time budget is {budget / 60:g} min (--minutes)")
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

    settings = pretraining_settings(model, out / "data", out / "pretrain", 1, seed, arch=arch)
    initial = PRETRAINING.training.model_class_for(OBJECTIVE, arch)(preset_config(settings, tokenizer))
    initial.save_pretrained(out / "initial", tokenizer=tokenizer)
    heldout, train = split_documents(files, HELDOUT_DOCUMENTS)
    probes = choose_probes([d.sentences for d in heldout], [d.sentences for d in train], tokenizer)
    summary["probes"] = [asdict(p) for p in probes]
    print(f"[3/6] fill-mask with random weights (before pretraining), the model's top {TOP_K} as it ranks them; "
          f"in each held-out document the word its neighbours predict best in the training text is masked:")
    summary["fill_mask_before"] = fill_masks(out / "initial", probes)
    summary["fill_mask_variety_before"] = answer_variety(summary["fill_mask_before"])

    pretrained, plan, cost = _pretrain(initial, out, model, arch, seed, budget, started, len(files), summary)

    print(f"[5/6] fill-mask after pretraining, the model's top {TOP_K} as it ranks them:")
    summary["fill_mask_after"] = fill_masks(pretrained, probes)
    summary["fill_mask_variety"] = answer_variety(summary["fill_mask_after"])

    # Sized again for the time left at the step cost pretraining saw (a machine that slowed down fine-tunes on
    # fewer sentences rather than overrunning).
    left = budget - (time.perf_counter() - started) - REPORT_SECONDS
    task = book_task_for(min(left, plan.finetune_seconds), len(files), cost)
    _classify_books(files, pretrained, spec, out, rng, seed, task, cost.threads, summary)
    summary["announced_minutes"] = plan.total / 60
    _write_report(out, summary, started)
    return summary


@dataclass(frozen=True)
class StepCost:
    """What a pretraining step and a held-out evaluation cost on this machine, measured (seconds), and the
    intra-op threads they were measured with."""

    step_seconds: float
    eval_seconds: float
    threads: int = 1

    @property
    def example_seconds(self) -> float:
        """An evaluation's cost per example (it scores EVAL_BATCHES batches of BATCH_SIZE)."""
        return self.eval_seconds / (EVAL_BATCHES * BATCH_SIZE)


def book_task_for(seconds: float, books: int, cost: StepCost) -> BookTask:
    """The largest fine-tuning stage (up to FINETUNE_TASK) that fits `seconds` at `cost`, never below
    FINETUNE_MIN_PER_BOOK sentences per book (fewer teach the classifier nothing)."""
    task = FINETUNE_TASK
    while task.per_book_train > FINETUNE_MIN_PER_BOOK and task.seconds(books, cost) > seconds:
        task = replace(task, per_book_train=max(FINETUNE_MIN_PER_BOOK, int(task.per_book_train * 0.8)))
    return task


@dataclass(frozen=True)
class DemoPlan:
    """How the demo spends its time budget on this machine, in seconds from its start: what the first steps
    took (`spent`), then pretraining for a time budget of its own (its schedule decays on that time, so a
    machine that slows down gets fewer steps, not a longer run), the last held-out evaluation, fine-tuning and
    the report. Pretraining gets what the rest leaves; the steps it is expected to hold come from the measured
    step cost."""

    budget: float
    spent: float
    cost: StepCost
    books: int
    finetune: BookTask
    finetune_seconds: float
    pretrain_seconds: float

    @property
    def steps(self) -> int:
        """Pretraining steps expected: its time less the evaluations inside it, at the measured step cost."""
        evaluating = (EVALUATIONS - 1) * self.cost.eval_seconds
        return max(1, int((self.pretrain_seconds - evaluating) / self.cost.step_seconds))

    @property
    def total(self) -> float:
        return (self.spent + self.pretrain_seconds + self.cost.eval_seconds + self.finetune_seconds
                + REPORT_SECONDS)


def plan_demo(budget: float, spent: float, cost: StepCost, books: int) -> DemoPlan:
    """Split what is left of `budget` seconds after `spent` between pretraining and fine-tuning at the measured
    `cost`: fine-tuning gets up to FINETUNE_SHARE of it (its size shrunk to fit), pretraining the rest, at least
    MIN_PRETRAIN_SECONDS (then the total is over the budget, and the announcement says so)."""
    left = budget - spent - cost.eval_seconds - REPORT_SECONDS
    task = book_task_for(FINETUNE_SHARE * left, books, cost)
    finetune = task.seconds(books, cost)
    return DemoPlan(budget, spent, cost, books, task, finetune, max(MIN_PRETRAIN_SECONDS, left - finetune))


def announce_plan(plan: DemoPlan, model: str, parameters: int, started_at: float) -> str:
    """The promise, printed before pretraining: the whole demo's time and when it ends, and how it is spent."""
    ends = time.strftime("%H:%M", time.localtime(started_at + plan.total))
    over = "" if plan.total <= plan.budget * 1.01 else f", over the {plan.budget / 60:.1f} min budget"
    few = "" if plan.steps >= LEARNING_STEPS else (
        f"; fewer than the {LEARNING_STEPS} steps the recipe needs to leave its plateau on the books: expect "
        f"fill-mask to guess frequent tokens (--minutes {minutes_for(plan, LEARNING_STEPS)} would allow them)")
    return (f"[4/6] the demo takes about {plan.total / 60:.1f} min in all (ends about {ends}){over}: "
            f"{plan.spent / 60:.1f} min so far, pretraining {model} ({parameters / 1e6:.1f}M parameters, "
            f"{OBJECTIVE_WORDS}) for {plan.pretrain_seconds / 60:.1f} min, about {plan.steps} steps of "
            f"{BATCH_SIZE} at {1000 * plan.cost.step_seconds:.0f} ms per step ({plan.cost.threads} "
            f"thread{'s' if plan.cost.threads > 1 else ''}, timed in a warm-up on this machine now), then "
            f"fine-tuning for about {plan.finetune_seconds / 60:.1f} min{few}")


def minutes_for(plan: DemoPlan, steps: int) -> int:
    """The shortest budget (whole minutes) in which `plan`'s machine would pretrain for `steps`."""
    minutes = math.ceil(plan.budget / 60)
    while plan_demo(60 * minutes, plan.spent, plan.cost, plan.books).steps < steps:
        minutes += 1
    return minutes


def pretraining_settings(model: str, data_dir: Path, out_dir: Path, steps: int, seed: int,
                         progress: bool = True, minutes: float = 0.0, arch: str = DEFAULT_ARCH) -> PretrainConfig:
    """The demo's pretraining run on the CPU, batches of BATCH_SIZE, EVALUATIONS held-out evaluations: `steps`
    steps, or with `minutes` a time budget that ends the run (`steps` is then what it is expected to hold, for
    the cadence of logs and evaluations); a preset of `arch` with its `ARCH_RECIPES` entry."""
    overrides, mask_rate = ARCH_RECIPES[arch]
    training = TrainingConfig(steps=0 if minutes else steps, minutes=minutes, batch_size=BATCH_SIZE, lr=PEAK_LR,
                              schedule=SCHEDULE, warmup_ratio=WARMUP_RATIO, betas=list(ADAM_BETAS),
                              log_every=max(1, steps // 20),
                              eval_every=max(1, steps // EVALUATIONS), save_every=0, keep_last=1, seed=seed,
                              out_dir=str(out_dir), precision="fp32", device="cpu", progress=progress)
    return PretrainConfig(data_dir=str(data_dir), arch=arch, model=model, model_overrides=dict(overrides),
                          eval_batches=EVAL_BATCHES, objective=OBJECTIVE,
                          masking=MaskingConfig(mlm_probability=mask_rate), training=training)


def measure_step_cost(model: str, data_dir: Path, out_dir: Path, seed: int, limit: float = 0.0,
                      arch: str = DEFAULT_ARCH) -> StepCost:
    """Time the demo's own pretraining on this machine, as it is loaded now: a warm-up run of TIMING_STEPS
    steps on the prepared data (or fewer, when `limit` seconds end it first) and one held-out evaluation, at
    PyTorch's current thread count. The first logging window is left out (first-call costs) where the run
    logged two; the times come from the run's own metrics log."""
    config = pretraining_settings(model, data_dir, out_dir, TIMING_STEPS, seed, False, limit / 60, arch)
    # One evaluation, at the end, after the last timed step.
    config = replace(config, training=replace(config.training, steps=TIMING_STEPS, log_every=TIMING_LOG_EVERY,
                                              eval_every=0))
    quiet = logging.getLogger("bertforge")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # the warm-up's own log lines would read like the real run's
    try:
        result = run_pretraining(config)
    finally:
        quiet.setLevel(level)
    events = read_metrics(out_dir)
    train = [e for e in events if e["split"] == "train"]
    evaluation = next(e for e in events if e["split"] == "eval")
    shutil.rmtree(out_dir, ignore_errors=True)
    if len(train) >= 2:
        step_seconds = (train[-1]["time"] - train[0]["time"]) / max(1, train[-1]["step"] - train[0]["step"])
    else:  # cut short by `limit`: every step, the first-call costs included
        step_seconds = result.seconds / max(1, result.step)
    last_step = train[-1]["time"] if train else evaluation["time"]
    return StepCost(step_seconds=max(step_seconds, 1e-3), eval_seconds=max(0.0, evaluation["time"] - last_step),
                    threads=torch.get_num_threads())


def choose_threads(measure: Callable[[float], StepCost], threads: int) -> tuple[StepCost, str]:
    """The cheaper of `measure(limit)` at one thread and at PyTorch's `threads`, left set; and what each cost.
    The second warm-up gets the time the first one's steps took (`limit`, seconds): a thread count that is
    much slower is seen in a few steps.

    On a busy 2-core machine two intra-op threads wait on each other at every operation of a model this small
    (one of them shares its core with the other jobs): a step cost 6.6 s with 2 threads and 0.5 s with 1 on a
    2-core Xeon at load 17. On an idle machine the second thread pays."""
    torch.set_num_threads(1)
    costs = [measure(0.0)]
    if threads > 1:
        torch.set_num_threads(threads)
        costs.append(measure(TIMING_STEPS * costs[0].step_seconds))
    best = min(costs, key=lambda c: c.step_seconds)
    torch.set_num_threads(best.threads)
    said = ", ".join(f"{c.threads} thread{'s' if c.threads > 1 else ''} {1000 * c.step_seconds:.0f} ms"
                     for c in costs)
    return best, said


def _pretrain(initial: BertPretrainedModel, out: Path, model: str, arch: str, seed: int, budget: float,
              started: float, books: int, summary: dict) -> tuple[Path | None, DemoPlan, StepCost]:
    """Step 4: time a warm-up, plan the rest of the budget and say so, then pretrain for the time planned;
    the checkpoint directory, the plan, and the step cost the run saw (the warm-up's, raised by as much as the
    run fell short of the steps expected)."""
    data, timing, threads = out / "data", out / "timing", torch.get_num_threads()
    cost, said = choose_threads(lambda limit: measure_step_cost(model, data, timing, seed, limit, arch), threads)
    plan = plan_demo(budget, time.perf_counter() - started, cost, books)
    named = model if arch == DEFAULT_ARCH else f"a {arch} {model}"
    print(announce_plan(plan, named, sum(p.numel() for p in initial.parameters()), time.time() - plan.spent))
    print(f"      warm-up step times: {said}")
    began = time.perf_counter()
    result = run_pretraining(pretraining_settings(model, out / "data", out / "pretrain", plan.steps, seed,
                                                  minutes=plan.pretrain_seconds / 60, arch=arch))
    minutes_taken = (time.perf_counter() - began) / 60
    heldout = result.eval
    baseline = heldout.get("mlm_majority_acc", float("nan"))
    summary["pretraining"] = {"steps": result.step, "expected_steps": plan.steps, "seconds": result.seconds,
                              "train": result.train, "heldout": heldout, "planned_minutes": plan.pretrain_seconds / 60,
                              "minutes": minutes_taken, "step_seconds_measured": cost.step_seconds,
                              "eval_seconds_measured": cost.eval_seconds, "threads": cost.threads,
                              "warm_up": said}
    print(f"      took {minutes_taken:.1f} min (planned {plan.pretrain_seconds / 60:.1f}), {result.step} steps "
          f"(expected {plan.steps})")
    print(f"      held-out MLM accuracy {heldout.get('mlm_acc', float('nan')):.3f}, "
          f"{heldout.get('mlm_acc', float('nan')) / baseline:.1f}x the majority-token baseline {baseline:.3f} "
          f"(always guessing the most frequent token)")
    slower = max(1.0, plan.steps / max(1, result.step))
    seen = replace(cost, step_seconds=cost.step_seconds * slower, eval_seconds=cost.eval_seconds * slower)
    return result.checkpoint, plan, seen


def _classify_books(files: list[Path], pretrained: Path | None, spec: Language, out: Path, rng: random.Random,
                    seed: int, task: BookTask, threads: int, summary: dict) -> None:
    """Step 6: fine-tune the pretrained model to tell which book a sentence comes from (`task`'s size), at the
    thread count pretraining used (loading a pipeline may have set another)."""
    train_file, dev_file, books = write_book_task(files, out / "books", spec.min_sentence_chars,
                                                  task.per_book_train, task.per_book_dev, rng)
    print(f"[6/6] fine-tuning: which of {len(books)} books is a sentence from? ({', '.join(books)}); "
          f"{task.per_book_train} sentences of each, {task.epochs} epochs")
    torch.set_num_threads(threads)
    began = time.perf_counter()
    finetune = run_finetuning(FinetuneConfig(
        model=str(pretrained),
        data=DataConfig(format="classification", train=str(train_file), dev=str(dev_file), text_a_column="text_a",
                        label_column="label"),
        features=FeatureConfig(max_seq_length=SEQUENCE_LENGTH),
        training=FinetuneTrainingConfig(out_dir=str(out / "finetune"), epochs=task.epochs, batch_size=FINETUNE_BATCH,
                                        lr=FINETUNE_LR, seed=seed, device="cpu", precision="fp32", progress=False)))
    accuracy = finetune.best_metrics.get("accuracy", float("nan"))
    chance = 1 / len(books)
    summary["book_classification"] = {"dev_accuracy": accuracy, "chance": chance, "books": books,
                                      "per_book_train": task.per_book_train, "epochs": task.epochs,
                                      "minutes": (time.perf_counter() - began) / 60,
                                      "model_dir": str(finetune.model_dir)}
    print(f"      dev accuracy {accuracy:.3f} (chance {chance:.3f}) in {(time.perf_counter() - began) / 60:.1f} min")


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
    print(f"done in {summary['seconds'] / 60:.1f} min (announced {summary['announced_minutes']:.1f}); report in "
          f"{report_dir}")


def write_summary_markdown(path: Path, s: dict) -> None:
    pre = s["pretraining"]
    lines = [f"# bertforge demo ({s['lang']})", "",
             f"- corpus: {len(s['corpus'])} books; vocabulary [UNK] rate {100 * s['unk_rate']:.2f}%",
             f"- time: {s['seconds'] / 60:.1f} min, announced {s['announced_minutes']:.1f} (budget "
             f"{s['budget_minutes']:g} min)",
             f"- pretraining: {s['model']}, {OBJECTIVE_WORDS}, {SCHEDULE} schedule, {pre['steps']} steps in "
             f"{pre['seconds'] / 60:.1f} min; held-out MLM accuracy {pre['heldout'].get('mlm_acc', 0):.3f} "
             f"(majority-token baseline {pre['heldout'].get('mlm_majority_acc', 0):.3f})",
             f"- book classification dev accuracy: {s['book_classification']['dev_accuracy']:.3f} "
             f"(chance {s['book_classification']['chance']:.3f})", "",
             f"- fill-mask after pretraining: {describe_variety(s['fill_mask_variety'])} (before: "
             f"{describe_variety(s['fill_mask_variety_before'])})", "",
             f"## fill-mask, before -> after (the model's top {TOP_K}; the book's word in brackets)", ""]
    for before, after in zip(s["fill_mask_before"], s["fill_mask_after"]):
        lines.append(f"- `{before['text']}` [{before['answer']}]: {', '.join(before['top5'])} -> "
                     f"**{', '.join(after['top5'])}**")
    if s.get("curves"):
        lines += ["", "![pretraining curves](pretraining_curves.png)"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
