"""The demo's pieces: its fill-mask sentences are held-out text, and the timed warm-up that sizes pretraining."""

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
# The word each English fill-mask sentence had, in order.
ANSWERS = ("bed", "room", "hand", "Elizabeth", "Geneva")


def test_demo_fill_mask_sentences_are_held_out_text():
    documents = list(read_documents(resolve_inputs(BOOKS), log_warnings=False, count_duplicates=False))
    rate = Fraction(demo.HELDOUT_DOCUMENTS, len(documents))
    heldout, train = set(), set()
    for number, document in enumerate(documents):
        (heldout if _is_heldout(number, rate) else train).update(document.sentences)
    probes = demo.LANGUAGES["en"].probes
    assert len(probes) == len(ANSWERS)
    for probe, answer in zip(probes, ANSWERS):
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
    assert demo.StepCost(step_seconds=0.5, eval_seconds=3.0).minutes(120, 5) == pytest.approx(1.25)
