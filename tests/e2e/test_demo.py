"""The demo's pieces: its fill-mask sentences are held-out text, and the timed warm-up that sizes pretraining."""

from fractions import Fraction
from pathlib import Path

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


def test_demo_pretrains_its_recipe_for_the_time_budget(tmp_path):
    config = demo.pretraining_settings("tiny", tmp_path / "data", tmp_path / "out", 3500, seed=0, minutes=5.0)
    training = config.training
    assert (config.objective, training.schedule, config.masking.mlm_probability) == ("mlm", "wsd", 0.15)
    assert training.minutes == 5.0 and training.steps == 0  # the budget ends the run, not a step count
    assert training.eval_every == 700 and training.log_every == 175  # the evaluations spread over the steps expected
    timed = demo.pretraining_settings("tiny", tmp_path / "data", tmp_path / "out", 15, seed=0)
    assert timed.training.steps == 15 and timed.training.minutes == 0  # the warm-up: the same recipe, by steps


def test_demo_pretraining_length_ends_the_default_run_on_steps_and_a_given_budget_on_time():
    assert demo.pretraining_length(None, 5.0, 3000) == (3000, 0.0)  # a machine that slows still does the steps
    assert demo.pretraining_length(2.0, 2.0, 800) == (0, 2.0)  # the user's budget is kept
    steps, minutes = demo.pretraining_length(None, 5.0, 3000)
    config = demo.pretraining_settings("tiny", Path("data"), Path("out"), steps, seed=0, minutes=minutes)
    assert (config.training.steps, config.training.minutes) == (3000, 0)
