"""Tests for bertforge.metrics.tagging: entity reading, scheme conversion, checks and seqeval parity."""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertforge.configuration import shared_data_root
from bertforge.errors import InputError
from bertforge.metrics.tagging import (
    Entity,
    bio_to_iobes,
    check_bio,
    check_tags,
    count_invalid_spans,
    entity_scores,
    get_entities,
    invalid_spans,
    iobes_to_bio,
)

CONLL_VALID = shared_data_root() / "conll2003/valid.txt"
TYPES = ("PER", "LOC", "MISC")
BIO_TAGS = ["O"] + [f"{p}-{t}" for t in TYPES for p in "BI"]
IOBES_TAGS = ["O"] + [f"{p}-{t}" for t in TYPES for p in "BIES"]
PARITY_TOLERANCE = 1e-12


def test_get_entities_lenient_follows_conlleval():
    assert get_entities(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]
    # An I- after O starts an entity; a type change splits one; B- after B- starts a new one.
    assert get_entities(["O", "I-PER", "I-PER"]) == [("PER", 1, 2)]
    assert get_entities(["B-PER", "I-LOC", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 2)]
    assert get_entities(["B-PER", "B-PER", "I-PER"]) == [("PER", 0, 0), ("PER", 1, 2)]
    assert get_entities(["B-ORG-X", "I-ORG-X"]) == [Entity("ORG-X", 0, 1)]
    assert get_entities([]) == []


def test_get_entities_strict_drops_ill_formed_spans():
    assert get_entities(["O", "I-PER", "I-PER"], strict=True) == []
    assert get_entities(["B-PER", "I-LOC", "B-LOC", "I-LOC"], strict=True) == [("PER", 0, 0), ("LOC", 2, 3)]
    assert get_entities(["B-PER", "I-PER", "O"], "IOBES", strict=True) == []
    assert get_entities(["B-PER", "E-PER", "S-LOC", "E-LOC"], "IOBES", strict=True) == [
        ("PER", 0, 1), ("LOC", 2, 2)]


def test_get_entities_iobes_lenient():
    assert get_entities(["S-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "E-LOC"], "IOBES") == [
        ("PER", 0, 0), ("PER", 1, 1), ("LOC", 2, 4), ("LOC", 5, 5)]


def test_get_entities_rejects_tags_outside_the_scheme():
    for bad in ("E-PER", "PER", "B-", "b-PER", "B_PER"):
        with pytest.raises(InputError, match="position 1"):
            get_entities(["O", bad])
    with pytest.raises(InputError, match="scheme"):
        get_entities(["O"], scheme="BILOU")


def test_bio_iobes_conversions():
    bio = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC", "I-LOC"]
    iobes = ["B-PER", "E-PER", "O", "S-LOC", "B-LOC", "I-LOC", "E-LOC"]
    assert bio_to_iobes(bio) == iobes
    assert iobes_to_bio(iobes) == bio
    # Ill-formed BIO converts as the entity it is scored as.
    assert bio_to_iobes(["O", "I-PER"]) == ["O", "S-PER"]


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(st.sampled_from(BIO_TAGS), max_size=20))
def test_bio_iobes_round_trip_preserves_entities(tags):
    iobes = bio_to_iobes(tags)
    assert get_entities(iobes, "IOBES", strict=True) == get_entities(tags)
    assert get_entities(iobes_to_bio(iobes), strict=True) == get_entities(tags)


def test_check_bio_reports_stray_inside_tags():
    assert check_bio(["B-PER", "I-PER", "O", "B-LOC"]) == []
    problems = check_bio(["I-PER", "O", "I-LOC", "B-LOC", "I-PER", "X-PER"])
    assert [p.index for p in problems] == [0, 2, 4, 5]
    assert "starts the sentence" in problems[0].message
    assert "follows 'O'" in problems[1].message
    assert "another type" in problems[2].message
    assert problems[3].tag == "X-PER"


def test_check_tags_iobes():
    assert check_tags(["B-PER", "I-PER", "E-PER", "S-LOC", "O"], "IOBES") == []
    problems = check_tags(["B-PER", "O", "E-LOC", "S-LOC"], "IOBES")
    assert [p.index for p in problems] == [0, 2]


def test_invalid_spans_bio_are_entities_started_by_inside():
    assert invalid_spans(["B-PER", "I-PER", "O", "B-LOC"]) == []
    # I- at the start, after O, and after another type each start an ill-formed span (conlleval's reading).
    assert invalid_spans(["I-PER", "O", "I-LOC", "I-LOC", "B-PER", "I-MISC"]) == [
        ("PER", 0, 0), ("LOC", 2, 3), ("MISC", 5, 5)]
    assert invalid_spans([]) == []


def test_invalid_spans_iobes_also_unclosed_and_end_only():
    assert invalid_spans(["S-PER", "B-LOC", "I-LOC", "E-LOC", "O"], "IOBES") == []
    assert invalid_spans(["B-PER", "I-PER", "O", "E-LOC", "B-MISC", "S-MISC"], "IOBES") == [
        ("PER", 0, 1), ("LOC", 3, 3), ("MISC", 4, 4)]
    with pytest.raises(InputError, match="not a IOBES tag"):
        invalid_spans(["PER"], "IOBES")


def test_count_invalid_spans_pools_sentences():
    assert count_invalid_spans([["B-PER", "O", "I-LOC"], ["O"], ["I-PER", "I-PER", "B-LOC"]]) == (2, 4)
    assert count_invalid_spans([]) == (0, 0)


@given(st.lists(st.lists(st.sampled_from(BIO_TAGS), max_size=8), max_size=4))
@settings(max_examples=60, deadline=None)
def test_count_invalid_spans_zero_exactly_when_well_formed(sentences):
    invalid, total = count_invalid_spans(sentences)
    assert total == sum(len(get_entities(tags)) for tags in sentences)
    assert (invalid == 0) == all(not check_bio(tags) for tags in sentences)


def test_entity_scores_hand_computed():
    true = [["O", "O", "B-MISC", "I-MISC", "B-MISC", "O", "O"], ["B-PER", "I-PER", "O"]]
    pred = [["O", "O", "B-MISC", "I-MISC", "B-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    # Gold: MISC(2-3), MISC(4-4), PER(0-1); predicted: MISC(2-3), MISC(4-5), PER(0-1); 2 correct.
    scores = entity_scores(true, pred)
    assert scores["precision"] == pytest.approx(2 / 3)
    assert scores["recall"] == pytest.approx(2 / 3)
    assert scores["f1"] == pytest.approx(2 / 3)
    assert (scores["support"], scores["predicted"]) == (3, 3)
    assert scores["per_type"]["MISC"] == {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2}
    assert scores["per_type"]["PER"]["f1"] == 1.0


def test_entity_scores_edge_cases():
    empty = entity_scores([["O", "O"]], [["O", "O"]])
    assert (empty["f1"], empty["per_type"]) == (0.0, {})
    # Types only predicted appear with support 0; entities never span sentences.
    scores = entity_scores([["O"], ["O"]], [["B-LOC"], ["I-LOC"]])
    assert scores["per_type"]["LOC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    assert scores["predicted"] == 2
    with pytest.raises(InputError, match="sentence 1 has 2 gold tags but 1"):
        entity_scores([["O"], ["O", "O"]], [["O"], ["O"]])
    with pytest.raises(InputError, match="sentences"):
        entity_scores([["O"]], [])


def _seqeval_scores(true, pred, strict: bool, scheme: str) -> dict:
    metrics = pytest.importorskip("seqeval.metrics")
    schemes = pytest.importorskip("seqeval.scheme")
    kwargs = {"mode": "strict", "scheme": {"BIO": schemes.IOB2, "IOBES": schemes.IOBES}[scheme]} if strict else {}
    with warnings.catch_warnings():
        # Zero-division warnings: seqeval scores those 0.0, as we do.
        warnings.simplefilter("ignore")
        report = metrics.classification_report(true, pred, output_dict=True, zero_division=0, **kwargs)
        micro = {
            "precision": metrics.precision_score(true, pred, zero_division=0, **kwargs),
            "recall": metrics.recall_score(true, pred, zero_division=0, **kwargs),
            "f1": metrics.f1_score(true, pred, zero_division=0, **kwargs),
        }
    per_type = {k: v for k, v in report.items() if not k.endswith(" avg")}
    return {"micro": micro, "per_type": per_type}


def _assert_matches_seqeval(true, pred, strict: bool = False, scheme: str = "BIO") -> None:
    reference = _seqeval_scores(true, pred, strict, scheme)
    ours = entity_scores(true, pred, scheme=scheme, strict=strict)
    for key in ("precision", "recall", "f1"):
        assert ours[key] == pytest.approx(float(reference["micro"][key]), abs=PARITY_TOLERANCE), key
    assert sorted(ours["per_type"]) == sorted(reference["per_type"])
    for type_, theirs in reference["per_type"].items():
        mine = ours["per_type"][type_]
        assert mine["support"] == theirs["support"], type_
        for key, their_key in (("precision", "precision"), ("recall", "recall"), ("f1", "f1-score")):
            assert mine[key] == pytest.approx(float(theirs[their_key]), abs=PARITY_TOLERANCE), (type_, key)


def _paired_sentences(tags: list[str]):
    sentence = st.integers(min_value=1, max_value=12).flatmap(
        lambda n: st.tuples(st.lists(st.sampled_from(tags), min_size=n, max_size=n),
                            st.lists(st.sampled_from(tags), min_size=n, max_size=n)))
    return st.lists(sentence, min_size=1, max_size=6)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(_paired_sentences(BIO_TAGS), st.booleans())
def test_entity_scores_match_seqeval_on_random_bio(pairs, strict):
    pytest.importorskip("seqeval")
    _assert_matches_seqeval([list(t) for t, _ in pairs], [list(p) for _, p in pairs], strict=strict)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(_paired_sentences(IOBES_TAGS), st.booleans())
def test_entity_scores_match_seqeval_on_random_iobes(pairs, strict):
    pytest.importorskip("seqeval")
    _assert_matches_seqeval([list(t) for t, _ in pairs], [list(p) for _, p in pairs], strict=strict,
                            scheme="IOBES")


def _read_conll_tags(path: Path) -> list[list[str]]:
    sentences: list[list[str]] = []
    current: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            if current:
                sentences.append(current)
            current = []
            continue
        current.append(fields[-1])
    if current:
        sentences.append(current)
    return sentences


def test_entity_scores_match_seqeval_on_conll_valid():
    pytest.importorskip("seqeval")
    if not CONLL_VALID.exists():
        pytest.skip(f"{CONLL_VALID} is not available")
    true = _read_conll_tags(CONLL_VALID)
    assert len(true) == 3250
    labels = sorted({tag for sentence in true for tag in sentence})
    assert check_bio([tag for sentence in true for tag in sentence]) == []
    rng = random.Random(0)
    # Perturbations a tagger makes: random tags, swapped types, and B- turned into I- (stray inside tags).
    pred = []
    for sentence in true:
        noisy = []
        for tag in sentence:
            roll = rng.random()
            if roll < 0.05:
                tag = rng.choice(labels)
            elif roll < 0.08 and tag != "O":
                tag = tag[:2] + rng.choice(["PER", "LOC", "ORG", "MISC"])
            elif roll < 0.11 and tag.startswith("B-"):
                tag = "I-" + tag[2:]
            noisy.append(tag)
        pred.append(noisy)
    for strict in (False, True):
        _assert_matches_seqeval(true, pred, strict=strict)
    perfect = entity_scores(true, true)
    assert perfect["f1"] == 1.0
    assert perfect["support"] == 1842 + 1837 + 1341 + 922
    iobes_true = [bio_to_iobes(s) for s in true]
    iobes_pred = [bio_to_iobes(s) for s in pred]
    _assert_matches_seqeval(iobes_true, iobes_pred, scheme="IOBES")
    # Converting to IOBES keeps every entity, so the scores do not move.
    assert entity_scores(iobes_true, iobes_pred, scheme="IOBES")["f1"] == pytest.approx(
        entity_scores(true, pred)["f1"])
