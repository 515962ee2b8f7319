"""Tests for `bertforge.tokenization.pairs`: the one pair-windowing policy, on its own and through the three
families that build features from it (classification, multiple choice, question answering).

The family checks compare every Feature field, and the data report, with a literal restatement of the
feature building each family had before the policy had one home, on seeded random long/short pairs.
"""

from __future__ import annotations

import bisect
import dataclasses
import random

import pytest

from bertforge.data.classification import ClassificationExample
from bertforge.data.finetuning import DataReport, Feature
from bertforge.data.multiple_choice import ChoiceExample
from bertforge.data.question_answering import QAExample
from bertforge.errors import ConfigError
from bertforge.families import classification, multiple_choice, question_answering
from bertforge.families.base import InputSettings
from bertforge.tokenization import Tokenizer, TokenizerConfig, Vocab, pair_windows
from bertforge.tokenization.postprocessor import PostProcessor
from bertforge.tokenization.windows import max_context_windows, window_spans

POST = PostProcessor(cls_id=101, sep_id=102)
WORDS = "the a cat sat on mat play john lives in paris where does live is was good bad ? . , new york".split()
TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##ing", "##s", *"0123456789", *"北京张三住在"]
TEXT_WORDS = [*WORDS, "playing", "cats", "北京", "张三住在", "zzz", "1998"]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(Vocab(TOKENS), TokenizerConfig())


def segments(pair) -> list[tuple[list[int], list[int]]]:
    """(first-segment ids, second-segment ids) of each window, read back through `sequence_ids`."""
    return [([i for i, s in zip(w.ids, w.sequence_ids) if s == 0], [i for i, s in zip(w.ids, w.sequence_ids) if s == 1])
            for w in pair.windows]


# --- the policy on its own ------------------------------------------------------------------------------

def test_pair_windows_single_text_steps_by_doc_stride():
    text = [1, 2, 3, 4, 5]
    pair = pair_windows(text, None, POST, 4, doc_stride=1)  # room 2
    assert [w.ids[1:-1] for w in pair.windows] == [[1, 2], [2, 3], [3, 4], [4, 5]]
    assert pair.windows[2].ids == [101, 3, 4, 102] and pair.windows[2].type_ids == [0, 0, 0, 0]
    assert [(w.index, w.start, w.size, w.long_at) for w in pair.windows[:2]] == [(0, 0, 2, 1), (1, 1, 2, 1)]
    # A stride as large as the window tiles the text without overlap (Google's rule never skips).
    assert [w.ids[1:-1] for w in pair_windows(text, None, POST, 4, doc_stride=2).windows] == [[1, 2], [3, 4], [5]]
    assert pair_windows(text, None, POST, 7).spans == [(0, 5)] and not pair.short_cut


def test_pair_windows_layout_offsets_and_sides_point_into_the_text(tokenizer):
    question = "the cat ?"
    context = "john lives in paris . john lives in new york ."
    q = tokenizer.encode(question, add_special_tokens=False)
    c = tokenizer.encode(context, add_special_tokens=False)
    pair = pair_windows(q.ids, c.ids, tokenizer.post_processor, 10, long="second", doc_stride=2,
                        second_offsets=c.offsets)  # room 10 - 3 - 3 = 4
    assert pair.spans == window_spans(len(c.ids), 4, 2) and not pair.long_is_first
    for window in pair.windows:
        assert window.ids[:5] == [tokenizer.cls_token_id, *q.ids, tokenizer.sep_token_id]
        assert window.type_ids == [0] * 5 + [1] * (window.size + 1) and window.long_at == 5
        assert window.sequence_ids == [None, 0, 0, 0, None, *[1] * window.size, None]
        assert window.offsets[:5] == [None] * 5 and window.offsets[-1] is None
        for position in range(window.long_at, window.long_at + window.size):
            start, end = window.offsets[position]
            assert tokenizer.convert_ids_to_tokens(window.ids[position]) == context[start:end]
    # Consecutive windows share room - doc_stride tokens and together cover the context.
    pieces = [second for _, second in segments(pair)]
    assert all(before[-2:] == after[:2] for before, after in zip(pieces, pieces[1:]))
    assert pieces[0] + [t for piece in pieces[1:] for t in piece[2:]] == c.ids


def test_pair_windows_longer_side_is_windowed_and_shorter_cut_only_when_needed():
    long, short = list(range(1, 21)), [50, 51, 52]
    # Budget 16 - 3 = 13: the short side fits whole, 10 long tokens per window, on whichever side.
    for first, second, long_is_first in ((long, short, True), (short, long, False)):
        pair = pair_windows(first, second, POST, 16)
        assert pair.long_is_first is long_is_first and not pair.short_cut
        assert all((b if long_is_first else a) == short for a, b in segments(pair))
        assert pair.spans == window_spans(20, 10)
    assert pair_windows([1, 2], [3, 4], POST, 16).long_is_first  # ties: the first is the long one
    # Two 7-token segments over a 13-token budget: the shorter is cut to half the budget, then it fits.
    seven = list(range(1, 8))
    cut = pair_windows(seven, [9] * 7, POST, 16)
    assert cut.short_cut and segments(cut) == [(seven, [9] * 6)]
    # A pair that fits keeps both segments whole, however long the short one is.
    assert segments(pair_windows([1], [9] * 12, POST, 16)) == [([1], [9] * 12)]


def test_pair_windows_short_limit_always_cuts_and_stride_limit_caps_the_default():
    question, context = [7] * 6, list(range(1, 301))
    pair = pair_windows(question, context, POST, 64, long="second", short_limit=4, stride_limit=5)
    assert pair.short_cut and all(first == [7] * 4 for first, _ in segments(pair))  # cut although it fits
    assert pair.spans == window_spans(300, 64 - 3 - 4, 5)
    assert pair_windows(question, context, POST, 64, long="second", short_limit=64, stride_limit=128).spans == \
        window_spans(300, 55, 27)  # half the room is below the cap
    assert segments(pair_windows(question, [1], POST, 9, long="second", short_limit=64))[0][0] == [7] * 3


def test_pair_windows_short_length_gives_every_ending_the_same_windows():
    context, endings = list(range(1, 31)), [[50], [60, 61, 62, 63, 64]]
    choices = [pair_windows(context, e, POST, 16, long="first", short_length=5) for e in endings]
    assert choices[0].spans == choices[1].spans == window_spans(30, 8)
    assert [b for _, b in segments(choices[0])] == [[50]] * len(choices[0].windows)
    long_ending = [8] * 12
    cut = [pair_windows([1, 2], e, POST, 16, long="first", short_length=12) for e in ([9], long_ending)]
    assert [c.short_cut for c in cut] == [False, True] and segments(cut[1]) == [([1, 2], [8] * 6)]


def test_pair_windows_fitting_pair_with_no_room_left_is_one_window_and_errors_name_the_fix():
    # An empty first segment and a second that fills the budget: one window, not an error.
    assert segments(pair_windows([], [5] * 13, POST, 16, long="first")) == [([], [5] * 13)]
    with pytest.raises(ConfigError, match="max_seq_length=3 leaves no room"):
        pair_windows([1, 2, 3], [4], POST, 3, long="second", short_limit=5)
    with pytest.raises(ConfigError, match="long="):
        pair_windows([1], None, POST, 8, long="second")


# --- the families: identical features to their earlier, separate copies -----------------------------------

def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(TEXT_WORDS) for _ in range(words))


def random_settings(rng: random.Random) -> InputSettings:
    return InputSettings(max_seq_length=rng.choice([8, 9, 12, 16, 24, 32]),
                         doc_stride=rng.choice([None, None, 1, 3, 8, 40]), max_query_length=rng.choice([1, 4, 64]))


def reference_classification(examples, tokenizer, settings, label2id, report):
    post, features = tokenizer.post_processor, []
    for index, example in enumerate(examples):
        a = tokenizer.encode(example.text_a, add_special_tokens=False).ids
        b = None if example.text_b is None else tokenizer.encode(example.text_b, add_special_tokens=False).ids
        budget = settings.max_seq_length - post.added(b is not None)
        label = label2id[example.label]
        if len(a) + len(b or []) <= budget:
            features.append(Feature(index, *post.assemble(a, b), label=label))
            continue
        long_is_a = b is None or len(a) >= len(b)
        long, short = (a, b) if long_is_a else (b, a)
        if short is not None and len(short) > budget // 2:
            short = short[: budget // 2]
            report.note("truncated_shorter_segment", example.source)
        spans = window_spans(len(long), budget - len(short or []), settings.doc_stride)
        if len(spans) > 1:
            report.note("windowed_inputs", example.source)
        for window, (start, size) in enumerate(spans):
            piece = long[start:start + size]
            ids, types = post.assemble(piece, short) if long_is_a else post.assemble(short, piece)
            features.append(Feature(index, ids, types, label=label, window=window))
    return features


def reference_choice(examples, tokenizer, settings, report):
    post, features = tokenizer.post_processor, []
    budget = settings.max_seq_length - post.added(True)
    for index, example in enumerate(examples):
        context = tokenizer.encode(example.context, add_special_tokens=False).ids
        endings = [tokenizer.encode(f"{example.start} {e}".strip(), add_special_tokens=False).ids
                   for e in example.endings]
        if len(context) + max(map(len, endings)) > budget and max(map(len, endings)) > budget // 2:
            endings = [e[: budget // 2] for e in endings]
            report.note("truncated_inputs", example.source)
        spans = window_spans(len(context), budget - max(map(len, endings)), settings.doc_stride)
        if len(spans) > 1:
            report.note("windowed_inputs", example.source)
        for window, (start, size) in enumerate(spans):
            rows = [post.assemble(context[start:start + size], ending) for ending in endings]
            features.append(Feature(index, [r[0] for r in rows], [r[1] for r in rows], label=example.label,
                                    window=window))
    return features


def reference_answer_span(example, offsets, training):
    """(token_start, token_end) of the answer, None when there is none, or "skip" / "unmappable"."""
    if not training or example.is_impossible:
        return None
    if example.answer_start is None:
        return "skip"
    char_start, char_end = example.answer_start, example.answer_start + len(example.answer_text)
    token_start = bisect.bisect_right([end for _, end in offsets], char_start)
    token_end = bisect.bisect_left([start for start, _ in offsets], char_end) - 1
    if token_start >= len(offsets) or token_end < token_start:
        return "unmappable"
    return token_start, token_end


def reference_qa(examples, tokenizer, settings, training, report):
    post, features = tokenizer.post_processor, []
    query_budget = min(settings.max_query_length, (settings.max_seq_length - post.added(True)) // 2)
    for index, example in enumerate(examples):
        question = tokenizer.encode(example.question, add_special_tokens=False).ids
        if len(question) > query_budget:
            question = question[:query_budget]
            report.note("truncated_questions", example.source)
        encoding = tokenizer.encode(example.context, add_special_tokens=False)
        ids, offsets = encoding.ids, encoding.offsets
        answer = reference_answer_span(example, offsets, training)
        if answer in ("skip", "unmappable"):
            if answer == "unmappable":
                report.note("answers_unmappable", example.source)
            continue
        room = settings.max_seq_length - len(question) - post.added(True)
        spans = window_spans(len(ids), room, settings.doc_stride or min(128, max(1, room // 2)))
        if len(spans) > 1:
            report.note("windowed_inputs", example.source)
        best, head = max_context_windows(spans, len(ids)), len(question) + 2
        for window, (start, end) in enumerate((start, start + size) for start, size in spans):
            feature = Feature(index, *post.assemble(question, ids[start:end]),
                              offsets=[None] * head + list(offsets[start:end]) + [None],
                              max_context=[False] * head + [best[i] == window for i in range(start, end)] + [False],
                              window=window)
            if training:
                inside = answer is not None and start <= answer[0] and answer[1] < end
                feature.start_position = head + answer[0] - start if inside else 0
                feature.end_position = head + answer[1] - start if inside else 0
            features.append(feature)
    return features


def fields_of(features: list[Feature]) -> list[dict]:
    return [dataclasses.asdict(feature) for feature in features]


def test_pair_windows_classification_features_unchanged_on_random_pairs(tokenizer):
    rng = random.Random(7)
    label2id = {"0": 0, "1": 1}
    for case in range(150):
        settings = random_settings(rng)
        examples = [ClassificationExample(text(rng, rng.choice([0, 1, 4, 9, 25])) or "cat",
                                          rng.choice([None, text(rng, rng.choice([0, 1, 4, 9, 25]))]),
                                          rng.choice(["0", "1"]), f"c:{case}:{i}") for i in range(3)]
        report, expected_report = DataReport(), DataReport()
        features = classification.build_features(examples, tokenizer, settings, label2id=label2id, report=report)
        expected = reference_classification(examples, tokenizer, settings, label2id, expected_report)
        expected_report.note("features", amount=len(expected))
        assert fields_of(features) == fields_of(expected), (case, settings)
        assert report.to_dict() == expected_report.to_dict()


def test_pair_windows_choice_features_unchanged_on_random_contexts(tokenizer):
    rng = random.Random(11)
    for case in range(150):
        settings = random_settings(rng)
        count = rng.choice([2, 3, 4])
        examples = [ChoiceExample(text(rng, rng.choice([1, 4, 9, 25])), rng.choice(["", "then", "the cat"]),
                                  [text(rng, rng.choice([0, 1, 3, 8, 15])) or "it" for _ in range(count)], 0,
                                  f"m:{case}:{i}") for i in range(2)]
        report, expected_report = DataReport(), DataReport()
        features = multiple_choice.build_features(examples, tokenizer, settings, report=report)
        expected = reference_choice(examples, tokenizer, settings, expected_report)
        expected_report.note("features", amount=len(expected))
        assert fields_of(features) == fields_of(expected), (case, settings)
        assert report.to_dict() == expected_report.to_dict()


def random_question(rng: random.Random, qid: str) -> QAExample:
    context, question = text(rng, rng.choice([0, 3, 10, 40])), text(rng, rng.choice([1, 3, 6, 12]))
    words = context.split()
    kind = rng.random()
    if words and kind < 0.7:
        at = rng.randrange(len(words))
        start = len(" ".join(words[:at])) + (1 if at else 0)
        return QAExample(qid, question, context, [words[at]], start, words[at])
    if kind < 0.85:
        return QAExample(qid, question, context, [], None, None, is_impossible=True)
    return QAExample(qid, question, context, ["rome"], None, None)


def test_pair_windows_qa_features_unchanged_on_random_questions(tokenizer):
    rng = random.Random(13)
    for case in range(152):
        settings = random_settings(rng)
        examples = [random_question(rng, f"q{i}") for i in range(3)]
        if case >= 150:  # Google's default stride (128) is below half the room: the cap is what steps.
            settings = InputSettings(max_seq_length=384, max_query_length=64)
            examples = [dataclasses.replace(e, context=text(rng, 900)) for e in examples]
        for training in (False, True):
            report, expected_report = DataReport(), DataReport()
            features = question_answering.build_features(examples, tokenizer, settings, training=training,
                                                         report=report)
            expected = reference_qa(examples, tokenizer, settings, training, expected_report)
            expected_report.note("features", amount=len(expected))
            assert fields_of(features) == fields_of(expected), (case, settings, training)
            assert report.to_dict() == expected_report.to_dict()
