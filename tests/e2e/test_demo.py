"""The demo's pieces: its fill-mask sentences are held-out text, and the timed warm-up and the plan that keep
the demo within its time budget on any machine."""

from fractions import Fraction
from pathlib import Path

import pytest

from bertforge import demo
from bertforge.data.corpus import read_documents
from bertforge.data.preparation import _is_heldout, prepare_corpus
from bertforge.data.text_files import resolve_inputs
from bertforge.tokenization import Tokenizer, TokenizerConfig
from bertforge.tokenization.vocab_builder import build_vocab

ROOT = Path(__file__).resolve().parents[2]
BOOKS = ROOT / "data" / "demo" / "en"


def test_demo_fill_mask_sentences_are_held_out_text():
    documents = list(read_documents(resolve_inputs(BOOKS), log_warnings=False, count_duplicates=False))
    rate = Fraction(demo.HELDOUT_DOCUMENTS, len(documents))
    heldout, train = set(), set()
    for number, document in enumerate(documents):
        (heldout if _is_heldout(number, rate) else train).update(document.sentences)
    probes, answers = demo.LANGUAGES["en"].probes, demo.LANGUAGES["en"].answers
    assert len(probes) == len(answers)
    for probe, answer in zip(probes, answers):  # the word the demo prints beside each probe is the book's
        assert probe.count("[MASK]") == 1
        sentence = probe.replace("[MASK]", answer)
        assert sentence in heldout and sentence not in train, sentence


def test_demo_step_cost_is_measured_on_the_prepared_data(tmp_path, monkeypatch):
    lines = (BOOKS / "jekyll_and_hyde.txt").read_text(encoding="utf-8").splitlines()[200:800]
    files = []
    for part in range(6):  # one document per file
        files.append(tmp_path / f"part{part}.txt")
        files[-1].write_text("\n".join(lines[part * 100:(part + 1) * 100]), encoding="utf-8")
    tokenizer = Tokenizer(build_vocab(files, 300), TokenizerConfig())
    tokenizer.save_pretrained(tmp_path / "data")
    prepare_corpus(files, tokenizer, tmp_path / "data", max_seq_length=32, heldout_documents=1, seed=1)
    monkeypatch.setattr(demo, "TIMING_STEPS", 6)
    monkeypatch.setattr(demo, "TIMING_LOG_EVERY", 2)
    monkeypatch.setattr(demo, "EVAL_BATCHES", 2)

    cost = demo.measure_step_cost("tiny", tmp_path / "data", tmp_path / "timing", seed=0)
    assert cost.step_seconds > 0 and cost.eval_seconds >= 0
    assert not (tmp_path / "timing").exists()  # the warm-up leaves nothing behind
    cut = demo.measure_step_cost("tiny", tmp_path / "data", tmp_path / "timing", seed=0, limit=1e-6)
    assert cut.step_seconds > 0 and cut.eval_seconds >= 0  # a warm-up its limit ends after one step


def test_demo_pretrains_its_recipe_for_the_time_budget(tmp_path):
    config = demo.pretraining_settings("tiny", tmp_path / "data", tmp_path / "out", 3500, seed=0, minutes=5.0)
    training = config.training
    assert (config.objective, training.schedule, config.masking.mlm_probability) == ("mlm", "wsd", 0.25)
    assert training.minutes == 5.0 and training.steps == 0  # the budget ends the run, not a step count
    assert training.eval_every == 700 and training.log_every == 175  # the evaluations spread over the steps expected
    timed = demo.pretraining_settings("tiny", tmp_path / "data", tmp_path / "out", 15, seed=0)
    assert timed.training.steps == 15 and timed.training.minutes == 0  # the warm-up: the same recipe, by steps


def test_demo_steps_come_from_the_budget_and_the_measured_step_time():
    quick, slow = demo.StepCost(0.08, 0.5, threads=2), demo.StepCost(1.6, 10.0, threads=1)
    fast_plan = demo.plan_demo(480.0, 20.0, quick, books=4)
    slow_plan = demo.plan_demo(480.0, 20.0, slow, books=4)
    for plan in (fast_plan, slow_plan):  # no floor of steps: the budget holds either way
        assert plan.total <= 480.0
        assert plan.steps == int((plan.pretrain_seconds - (demo.EVALUATIONS - 1) * plan.cost.eval_seconds)
                                 / plan.cost.step_seconds)
    assert fast_plan.steps > 3000 > 100 < slow_plan.steps < demo.LEARNING_STEPS
    assert fast_plan.finetune == demo.FINETUNE_TASK  # the whole fine-tuning stage fits a quick machine
    # a slow one fine-tunes on fewer sentences, within its share of the time left
    assert demo.FINETUNE_MIN_PER_BOOK <= slow_plan.finetune.per_book_train < demo.FINETUNE_TASK.per_book_train
    assert slow_plan.finetune_seconds <= demo.FINETUNE_SHARE * (480.0 - 20.0 - 10.0 - demo.REPORT_SECONDS)
    # a budget the machine cannot keep still pretrains a little, and the total says how far over it goes
    short = demo.plan_demo(60.0, 50.0, slow, books=4)
    assert short.pretrain_seconds == demo.MIN_PRETRAIN_SECONDS and short.total > 60.0


def test_demo_pretraining_ends_and_decays_on_time_when_the_machine_slows_down(tmp_path):
    import torch

    from bertforge.training.schedules import schedule_for

    cost = demo.StepCost(0.5, 5.0, threads=1)
    plan = demo.plan_demo(480.0, 20.0, cost, books=4)
    config = demo.pretraining_settings("tiny", tmp_path / "data", tmp_path / "out", plan.steps, seed=0,
                                       minutes=plan.pretrain_seconds / 60)
    assert config.training.steps == 0 and config.training.minutes * 60 == plan.pretrain_seconds
    now = [0.0]
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=config.training.lr)
    scheduler = schedule_for(optimizer, config.training, plan.steps, 0, clock=lambda: now[0])
    scheduler.start()
    rates = []
    while not scheduler.spent:  # after the warm-up, the machine's steps take twice as long
        rates.append(optimizer.param_groups[0]["lr"])
        now[0] += 2 * cost.step_seconds
        optimizer.step()
        scheduler.step()
    assert len(rates) == pytest.approx(plan.pretrain_seconds / (2 * cost.step_seconds), abs=1)
    assert len(rates) < plan.steps * 0.6  # fewer steps, not a longer run
    peak = config.training.lr
    decay_start = next(i for i, rate in enumerate(rates) if i > len(rates) // 2 and rate < peak)
    assert decay_start / len(rates) == pytest.approx(1 - config.training.decay_ratio, abs=0.01)
    assert rates[-1] < 0.2 * peak
    assert all(a >= b for a, b in zip(rates[decay_start - 1:], rates[decay_start:]))  # it decays to the end


def test_demo_announces_its_whole_time_and_what_a_short_budget_costs():
    cost = demo.StepCost(0.1, 1.0, threads=2)
    plan = demo.plan_demo(480.0, 20.0, cost, books=4)
    said = demo.announce_plan(plan, "tiny", 1_500_000, started_at=0.0)
    assert f"about {plan.total / 60:.1f} min in all" in said and "ends about" in said
    assert f"about {plan.steps} steps of {demo.BATCH_SIZE} at 100 ms per step (2 threads" in said
    assert "over the" not in said and "fewer than" not in said
    slow = demo.plan_demo(120.0, 20.0, demo.StepCost(1.6, 20.0, threads=1), books=4)
    said = demo.announce_plan(slow, "tiny", 1_500_000, started_at=0.0)
    assert f"fewer than the {demo.LEARNING_STEPS} steps" in said and "--minutes " in said
    needed = int(said.split("--minutes ")[1].split()[0])
    bigger = demo.plan_demo(60 * needed, 20.0, slow.cost, books=4)
    assert bigger.steps >= demo.LEARNING_STEPS  # the budget it names is enough, and no more than enough
    assert demo.plan_demo(60 * (needed - 1), 20.0, slow.cost, books=4).steps < demo.LEARNING_STEPS


def test_demo_keeps_the_cheaper_thread_count_of_its_warm_up():
    import torch

    before = torch.get_num_threads()
    measured = []

    def measure(costs):
        def run(limit):
            threads = torch.get_num_threads()
            measured.append((threads, limit))
            return demo.StepCost(costs[threads], 1.0, threads=threads)
        return run

    try:
        busy, said = demo.choose_threads(measure({2: 6.6, 1: 0.5}), 2)  # other jobs share the cores
        # one thread first; two get the time one thread's warm-up steps took
        assert measured == [(1, 0.0), (2, pytest.approx(demo.TIMING_STEPS * 0.5))]
        assert (busy.threads, torch.get_num_threads()) == (1, 1)
        assert said == "1 thread 500 ms, 2 threads 6600 ms"
        idle, _ = demo.choose_threads(measure({2: 0.08, 1: 0.12}), 2)
        assert (idle.threads, torch.get_num_threads()) == (2, 2)
        measured.clear()
        single, _ = demo.choose_threads(measure({1: 0.2}), 1)  # one core: measured once
        assert (single.threads, measured) == (1, [(1, 0.0)])
    finally:
        torch.set_num_threads(before)
