"""The demo's pieces: its fill-mask sentences are held-out text, and the timed warm-up and the plan that keep
the demo within its time budget on any machine."""

from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest

from bertforge import demo
from bertforge.data.corpus import read_documents
from bertforge.data.preparation import _is_heldout, prepare_corpus, split_documents
from bertforge.data.text_files import resolve_inputs
from bertforge.tokenization import Tokenizer, TokenizerConfig
from bertforge.tokenization.vocab_builder import build_vocab

ROOT = Path(__file__).resolve().parents[2]
BOOKS = ROOT / "data" / "demo" / "en"


class _WholeWords:
    """A stand-in tokenizer for which every word is one token (choose_probes asks only that)."""

    def tokenize(self, word):
        return [word]


def test_demo_fill_mask_probes_are_held_out_text_chosen_by_the_rule():
    documents = list(read_documents(resolve_inputs(BOOKS), log_warnings=False, count_duplicates=False))
    rate = Fraction(demo.HELDOUT_DOCUMENTS, len(documents))
    heldout, train = [], []
    for number, document in enumerate(documents):
        (heldout if _is_heldout(number, rate) else train).append(document.sentences)
    assert split_documents(resolve_inputs(BOOKS), demo.HELDOUT_DOCUMENTS) == (
        [d for n, d in enumerate(documents) if _is_heldout(n, rate)],
        [d for n, d in enumerate(documents) if not _is_heldout(n, rate)])
    probes = demo.choose_probes(heldout, train, _WholeWords())
    assert probes == demo.choose_probes(heldout, train, _WholeWords())  # a fixed rule: the same probes every run
    assert len(probes) == demo.HELDOUT_DOCUMENTS  # one from each held-out document of the books
    assert len({p.answer.lower() for p in probes}) == len(probes)  # no word masked twice

    def words(sentence):
        return ["", *(w.lower() for w in demo.WORD.findall(sentence)), ""]

    trained = [words(s) for document in train for s in document]
    counts = Counter(w for sentence in trained for w in sentence[1:-1])
    common = {w for w, _ in counts.most_common(demo.PROBE_COMMON)}
    train_sentences = {s for document in train for s in document}
    heldout_sentences = {s for document in heldout for s in document}
    for probe in probes:
        assert probe.text.count("[MASK]") == 1
        sentence = probe.text.replace("[MASK]", probe.answer)
        assert sentence in heldout_sentences and sentence not in train_sentences, sentence
        word = probe.answer.lower()
        assert word.isalpha() and len(word) >= demo.PROBE_LETTERS and word not in common
        # the neighbours' share of occurrences with this word in the training text, counted here afresh
        seen = words(probe.text.replace("[MASK]", "MASKEDWORD"))
        i = seen.index("maskedword")
        context = [s[j] for s in trained for j in range(1, len(s) - 1) if (s[j - 1], s[j + 1]) == (seen[i - 1],
                                                                                                      seen[i + 1])]
        assert probe.count == context.count(word) >= demo.PROBE_MIN_COUNT
        assert probe.score == pytest.approx(probe.count / len(context))


def test_demo_counts_distinct_fill_mask_answers_of_a_tiny_model(tmp_path, capsys):
    import torch

    from bertforge.families.pretraining import BertForMaskedLM
    from bertforge.inference.pipelines import load_pipeline
    from bertforge.model.config import BertConfig
    from bertforge.tokenization.vocab import Vocab

    words = "the cat sat on mat dog ran to house door room bed she he was in".split()
    tokenizer = Tokenizer(Vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, ".", ","]),
                          TokenizerConfig(model_max_length=32))
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, intermediate_size=64, max_position_embeddings=32,
                                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    model.save_pretrained(tmp_path / "model", tokenizer=tokenizer)
    probes = [demo.Probe(text, answer, 1.0, 3) for text, answer in (
        ("the cat sat on the [MASK] .", "Mat"), ("she ran to the [MASK] .", "door"),
        ("he was in [MASK] .", "bed"), ("the dog sat on [MASK] mat .", "the"))]

    results = demo.fill_masks(tmp_path / "model", probes)
    direct = load_pipeline(tmp_path / "model", "fill-mask", device="cpu", engine="torch")(
        [p.text for p in probes], top_k=demo.TOP_K)
    top5 = [[p["token"] for p in out["masks"][0]["predictions"]] for out in direct]
    assert [r["top5"] for r in results] == top5 and [r["answer"] for r in results] == [p.answer for p in probes]
    variety = demo.answer_variety(results)
    assert variety == {"probes": 4, "distinct_top1": len({t[0] for t in top5}),
                       "book_word_in_top5": sum(p.answer.lower() in t for p, t in zip(probes, top5))}
    assert demo.describe_variety(variety) in capsys.readouterr().out  # printed with the answers

    same = [{"top5": [",", "the", "."], "answer": a} for a in ("bed", "The", "room")]
    assert demo.answer_variety(same) == {"probes": 3, "distinct_top1": 1, "book_word_in_top5": 1}
    varied = [{"top5": ["bed", ","], "answer": "Bed"}, {"top5": ["door", "room"], "answer": "room"},
              {"top5": ["bed"], "answer": "house"}]
    assert demo.answer_variety(varied) == {"probes": 3, "distinct_top1": 2, "book_word_in_top5": 2}
    assert demo.describe_variety(demo.answer_variety(varied)) == (
        "distinct top-1 answers: 2 of 3; the book's word among the top 5: 2 of 3")


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
    assert config.model_overrides == {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
                                      "initializer_range": 0.05}
    assert training.betas == [0.9, 0.98]
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


def test_demo_pretrains_a_modernbert_with_its_recipe_when_asked(tmp_path):
    bert = demo.pretraining_settings("tiny", tmp_path / "data", tmp_path / "out", 3500, seed=0, minutes=5.0)
    modern = demo.pretraining_settings("tiny", tmp_path / "data", tmp_path / "out", 3500, seed=0, minutes=5.0,
                                       arch="modernbert")
    assert (bert.arch, modern.arch) == ("bert", "modernbert")
    assert modern.model_overrides == {"num_hidden_layers": 3, "intermediate_size": 176}
    assert modern.masking.mlm_probability == 0.3  # ModernBERT's rate; BERT keeps the demo's 0.25
    assert bert.masking.mlm_probability == 0.25
    assert modern.training == bert.training and modern.objective == bert.objective  # the same time, lr, schedule


def test_demo_times_a_modernbert_warm_up_on_the_prepared_data(tmp_path, monkeypatch):
    files = []
    lines = (BOOKS / "jekyll_and_hyde.txt").read_text(encoding="utf-8").splitlines()[200:800]
    for part in range(6):
        files.append(tmp_path / f"part{part}.txt")
        files[-1].write_text("\n".join(lines[part * 100:(part + 1) * 100]), encoding="utf-8")
    tokenizer = Tokenizer(build_vocab(files, 300), TokenizerConfig())
    tokenizer.save_pretrained(tmp_path / "data")
    prepare_corpus(files, tokenizer, tmp_path / "data", max_seq_length=32, heldout_documents=1, seed=1)
    monkeypatch.setattr(demo, "TIMING_STEPS", 4)
    monkeypatch.setattr(demo, "TIMING_LOG_EVERY", 2)
    monkeypatch.setattr(demo, "EVAL_BATCHES", 1)
    ran = []
    real = demo.run_pretraining
    monkeypatch.setattr(demo, "run_pretraining", lambda config: ran.append(config) or real(config))

    cost = demo.measure_step_cost("tiny", tmp_path / "data", tmp_path / "timing", seed=0, arch="modernbert")
    assert cost.step_seconds > 0
    assert [(c.arch, c.training.steps) for c in ran] == [("modernbert", 4)]


def test_demo_command_passes_the_arch_through_and_refuses_an_unknown_one(tmp_path, monkeypatch):
    from bertforge.cli import main

    calls = []
    real = demo.run_demo
    monkeypatch.setattr(demo, "run_demo", lambda **kwargs: calls.append(kwargs))
    assert main(["demo", "--arch", "modernbert", "--out", str(tmp_path / "d"), "--minutes", "3"]) == 0
    assert main(["demo", "--out", str(tmp_path / "d")]) == 0
    assert [c["arch"] for c in calls] == ["modernbert", "bert"]  # the default demo is BERT's, as before
    with pytest.raises(demo.ConfigError, match="--arch 'roberta'"):
        real(out=tmp_path / "never", arch="roberta")
    assert not (tmp_path / "never").exists()  # refused before any work


def test_make_demo_passes_arch_to_the_demo_command():
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("make is not installed")

    def dry_run(*variables):
        done = subprocess.run(["make", "--no-print-directory", "-n", "demo", "STAMP=", *variables], cwd=ROOT, capture_output=True,
                              text=True, check=True)
        return done.stdout.strip().splitlines()[-1]

    assert dry_run().endswith("demo --arch bert --out runs/demo")
    assert dry_run("ARCH=modernbert").endswith("demo --arch modernbert --out runs/demo-modernbert")
