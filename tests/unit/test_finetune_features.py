"""Fine-tuning features: window arithmetic, NER label alignment, long-input windows for QA, tagging,
classification and multiple choice (the same context windows for every choice), and the batch source the
training loop iterates."""

from __future__ import annotations

import pytest
import torch

from bertforge.constants import IGNORE_INDEX
from bertforge.data.classification import ClassificationExample
from bertforge.data.finetuning import DataReport, FeatureBatches, collate_features
from bertforge.data.multiple_choice import ChoiceExample
from bertforge.data.question_answering import QAExample
from bertforge.data.tagging import TaggingExample
from bertforge.errors import ConfigError, DataError
from bertforge.families import classification, multiple_choice, question_answering, tagging
from bertforge.families.base import InputSettings
from bertforge.families.tagging import token_words
from bertforge.tokenization import Tokenizer, TokenizerConfig, Vocab
from bertforge.tokenization.windows import max_context_windows, window_spans

WORDS = "the a cat sat on mat play john lives in paris where does live is was good bad ? . , new york".split()
TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##ing", "##s", "##ed", *"0123456789",
          *"北京张三住在"]


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(Vocab(TOKENS), TokenizerConfig())


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


# --- windows ----------------------------------------------------------------------------------------------

def test_window_spans_google_rule():
    assert window_spans(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
    assert window_spans(10, 4, 10) == [(0, 4), (4, 4), (8, 2)]  # a stride above the window never skips
    assert window_spans(3, 4, 2) == [(0, 3)]
    assert window_spans(0, 4, 2) == [(0, 0)]
    assert window_spans(10, 4) == window_spans(10, 4, 2)  # default doc_stride: half the room
    with pytest.raises(ConfigError, match="no room"):
        window_spans(5, 0, 2)
    with pytest.raises(ConfigError, match="doc_stride"):
        window_spans(5, 4, 0)


def test_max_context_windows_prefers_centred_windows():
    spans = window_spans(10, 4, 2)  # (0,4) (2,4) (4,4) (6,4)
    best = max_context_windows(spans, 10)
    assert best[0] == 0 and best[9] == 3
    assert best[3] == 1  # the last token of window 0, but one left and two right of it in window 1
    for token, window in enumerate(best):
        start, size = spans[window]
        assert start <= token < start + size


# --- tagging alignment ------------------------------------------------------------------------------------

def test_tagging_label_on_first_sub_token(tokenizer):
    example = TaggingExample(["john", "playing", "in", "new", "york"], ["B-PER", "O", "O", "B-LOC", "I-LOC"], " ", "f:1")
    label2id = {"O": 0, "B-PER": 1, "B-LOC": 2, "I-LOC": 3}
    (feature,) = tagging.build_features([example], tokenizer, InputSettings(max_seq_length=16), label2id=label2id)
    tokens = tokenizer.convert_ids_to_tokens(feature.input_ids)
    assert tokens == ["[CLS]", "john", "play", "##ing", "in", "new", "york", "[SEP]"]
    assert feature.token_labels == [IGNORE_INDEX, 1, 0, IGNORE_INDEX, 0, 2, 3, IGNORE_INDEX]
    assert feature.word_index == [None, 0, 1, None, 2, 3, 4, None]


def test_tagging_label_policy_all_turns_begin_into_inside(tokenizer):
    example = TaggingExample(["plays"], ["B-PER"], " ", "f:1")
    label2id = {"O": 0, "B-PER": 1, "I-PER": 2}
    (feature,) = tagging.build_features([example], tokenizer, InputSettings(max_seq_length=16, label_policy="all"),
                                        label2id=label2id)
    assert tokenizer.convert_ids_to_tokens(feature.input_ids[1:-1]) == ["play", "##s"]
    assert feature.token_labels[1:-1] == [1, 2]
    assert feature.word_index[1:-1] == [0, None]  # still predicted from the first piece
    with pytest.raises(ConfigError, match="label_policy"):
        tagging.build_features([example], tokenizer, InputSettings(max_seq_length=16, label_policy="last"),
                               label2id=label2id)


def test_tagging_characters_keep_one_token_each(tokenizer):
    example = TaggingExample(list("张三住北京1998"), ["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "O", "O", "O", "O"],
                             "", "f:1")
    token_ids, owners = token_words(example, tokenizer)
    assert owners == list(range(9))  # "1998" stays four labelled characters
    assert example.text == "张三住北京1998"


def test_tagging_long_sentence_windows_predict_each_word_once(tokenizer):
    words = ["the", "cat", "sat", "on", "a", "mat"] * 5
    example = TaggingExample(words, ["O"] * len(words), " ", "f:1")
    report = DataReport()
    features = tagging.build_features([example], tokenizer, InputSettings(max_seq_length=10, doc_stride=4),
                                      label2id={"O": 0}, report=report)
    assert len(features) > 1 and report["windowed_inputs"] == 1
    assert [f.window for f in features] == list(range(len(features)))
    predicted = [w for f in features for w in f.word_index if w is not None]
    assert sorted(predicted) == list(range(len(words)))
    # Each word is predicted from the window where it has most context, never from a window's edge
    # when a more central window holds it.
    for feature in features[1:-1]:
        assert feature.word_index[1] is None and feature.word_index[-2] is None
    for feature in features:
        assert len(feature.input_ids) <= 10
        labelled = [i for i, label in enumerate(feature.token_labels) if label != IGNORE_INDEX]
        assert len(labelled) == len(feature.input_ids) - 2  # every window is trained on all its words


def test_tagging_word_without_tokens_is_counted(tokenizer):
    example = TaggingExample(["cat", "\u200b", "sat"], ["O", "O", "O"], " ", "f:1")
    report = DataReport()
    (feature,) = tagging.build_features([example], tokenizer, InputSettings(max_seq_length=16), label2id={"O": 0},
                                        report=report)
    assert report["words_without_tokens"] == 1
    assert [w for w in feature.word_index if w is not None] == [0, 2]


# --- QA windows -------------------------------------------------------------------------------------------

def test_qa_answer_in_third_window(tokenizer):
    filler = "the cat sat on a mat . " * 6  # 42 tokens
    context = filler + "john lives in paris . " + filler
    answer_start = context.index("paris")
    example = QAExample("q1", "where does john live ?", context, ["paris"], answer_start, "paris")
    report = DataReport()
    features = question_answering.build_features(
        [example], tokenizer, InputSettings(max_seq_length=32, doc_stride=16, max_query_length=8), training=True,
        report=report)
    # Question of 5 tokens: room 32 - 5 - 3 = 24 context tokens per window, windows start at 0, 16, 32, ...
    assert report["windowed_inputs"] == 1 and len(features) >= 4
    holding = [f for f in features if f.start_position != 0]
    assert [f.window for f in holding] == [2]
    third = holding[0]
    assert tokenizer.convert_ids_to_tokens([third.input_ids[third.start_position]]) == ["paris"]
    begin, end = third.offsets[third.start_position][0], third.offsets[third.end_position][1]
    assert context[begin:end] == "paris"
    for feature in features:
        assert feature.token_type_ids[:7] == [0] * 7 and feature.offsets[:7] == [None] * 7
        assert feature.input_ids[0] == tokenizer.cls_token_id and feature.input_ids[-1] == tokenizer.sep_token_id
        if feature is not third:
            assert (feature.start_position, feature.end_position) == (0, 0)


def test_qa_truncated_question_and_impossible_are_counted(tokenizer):
    example = QAExample("q", "where does " * 10, "john lives in paris .", [], None, None, is_impossible=True)
    report = DataReport()
    wide = InputSettings(max_seq_length=64, max_query_length=4)
    (feature,) = question_answering.build_features([example], tokenizer, wide, training=True, report=report)
    assert report["truncated_questions"] == 1
    assert feature.input_ids[1:5] == ids(tokenizer, "where does where does")
    assert (feature.start_position, feature.end_position) == (0, 0)
    unlocated = QAExample("u", "where ?", "john lives in paris .", ["rome"], None, None)
    assert question_answering.build_features([unlocated], tokenizer, wide, training=True) == []
    assert len(question_answering.build_features([unlocated], tokenizer, wide, training=False)) == 1


def test_qa_long_question_leaves_room_for_the_context(tokenizer):
    # The question is cut to half the window as well, so even the smallest window has room for the context.
    example = QAExample("q", "where does john live ?", "john lives in paris .", ["paris"], 14, "paris")
    report = DataReport()
    features = question_answering.build_features([example], tokenizer, InputSettings(max_seq_length=8),
                                                 training=True, report=report)
    assert report["truncated_questions"] == 1 and report["windowed_inputs"] == 1
    for feature in features:
        assert feature.input_ids[:4] == [tokenizer.cls_token_id, *ids(tokenizer, "where does"),
                                         tokenizer.sep_token_id]  # (8 - 3) // 2 = 2 question tokens
        assert len(feature.input_ids) <= 8 and any(offset is not None for offset in feature.offsets)
    located = [f for f in features if f.start_position != 0]
    assert located
    for feature in located:
        begin, end = feature.offsets[feature.start_position][0], feature.offsets[feature.end_position][1]
        assert example.context[begin:end] == "paris"
    with pytest.raises(ConfigError, match="max_seq_length"):
        InputSettings(max_seq_length=7)  # a window too small for any input is a config error


# --- classification windows -------------------------------------------------------------------------------

def test_classification_long_input_is_windowed_not_truncated(tokenizer):
    text = " ".join(["the cat sat on a mat"] * 5)  # 30 tokens
    example = ClassificationExample(text, None, "1", "f:2")
    report = DataReport()
    features = classification.build_features([example], tokenizer, InputSettings(max_seq_length=12),
                                             label2id={"0": 0, "1": 1}, report=report)
    assert report["windowed_inputs"] == 1 and report.samples["windowed_inputs"] == ["f:2"]
    covered = [t for f in features for t in f.input_ids[1:-1]]
    assert set(covered) == set(ids(tokenizer, text)) and all(len(f.input_ids) <= 12 for f in features)
    assert all(f.label == 1 and f.example_index == 0 for f in features)
    assert features[-1].input_ids[-2] == ids(tokenizer, text)[-1]  # the last window reaches the end
    stepped = classification.build_features([example], tokenizer, InputSettings(max_seq_length=12, doc_stride=10),
                                            label2id={"0": 0, "1": 1})
    assert len(stepped) == 3  # 10 tokens per window, 10 apart: 30 tokens in three windows, no overlap
    assert [t for f in stepped for t in f.input_ids[1:-1]] == ids(tokenizer, text)


def test_classification_pair_windows_over_the_longer_segment(tokenizer):
    premise = " ".join(["the cat sat on a mat"] * 4)
    example = ClassificationExample(premise, "cat sat", "0", "f:2")
    features = classification.build_features([example], tokenizer, InputSettings(max_seq_length=16),
                                             label2id={"0": 0})
    assert len(features) > 1
    hypothesis = ids(tokenizer, "cat sat")
    for feature in features:
        assert feature.input_ids[-3:-1] == hypothesis  # the short segment is kept whole in every window
        assert feature.token_type_ids.count(1) == len(hypothesis) + 1
    # Two 7-token segments over a 13-token budget: the shorter is cut to half the room and the pair then
    # fits one window, which is a truncation, not a windowed input.
    sentence = "the cat sat on a mat ."
    report = DataReport()
    (feature,) = classification.build_features([ClassificationExample(sentence, sentence, "0", "f:3")], tokenizer,
                                               InputSettings(max_seq_length=16), label2id={"0": 0}, report=report)
    assert report["truncated_shorter_segment"] == 1 and report["windowed_inputs"] == 0
    assert feature.input_ids == [2, *ids(tokenizer, sentence), 3, *ids(tokenizer, sentence)[:6], 3]


def test_classification_short_input_single_feature_and_regression(tokenizer):
    (feature,) = classification.build_features([ClassificationExample("good", "bad", 3.5, "f:1")], tokenizer,
                                               InputSettings(max_seq_length=16), regression=True)
    assert feature.input_ids == [2, *ids(tokenizer, "good"), 3, *ids(tokenizer, "bad"), 3]
    assert feature.token_type_ids == [0, 0, 0, 1, 1] and feature.label == 3.5


# --- multiple choice --------------------------------------------------------------------------------------

def test_choice_features_window_a_long_context_the_same_for_every_choice(tokenizer):
    context = "the cat sat on a mat . " * 4  # 28 tokens
    example = ChoiceExample(context, "then", ["it sat .", "it was good ."], 1, "f:2")
    report = DataReport()
    features = multiple_choice.build_features([example], tokenizer, InputSettings(max_seq_length=16), report=report)
    # Budget 16 - 3 = 13; the longest ending "then it was good ." has 5 tokens: 8 context tokens per window.
    assert len(features) > 1 and report["windowed_inputs"] == 1 and report["truncated_inputs"] == 0
    endings = [ids(tokenizer, "then it sat ."), ids(tokenizer, "then it was good .")]
    pieces = []
    for window, feature in enumerate(features):
        assert feature.window == window and feature.example_index == 0 and feature.label == 1
        assert len(feature.input_ids) == 2 and all(len(row) <= 16 for row in feature.input_ids)
        rows = [row[1:-(len(ending) + 2)] for row, ending in zip(feature.input_ids, endings)]
        assert rows[0] == rows[1]  # the same context window for every choice
        for row, types, ending in zip(feature.input_ids, feature.token_type_ids, endings):
            assert row[-(len(ending) + 1):-1] == ending  # every ending is kept whole
            assert types.count(1) == len(ending) + 1
        pieces.append(rows[0])
    assert set(t for piece in pieces for t in piece) == set(ids(tokenizer, context))
    assert pieces[0] == ids(tokenizer, context)[:8] and pieces[-1] == ids(tokenizer, context)[-8:]
    batch = collate_features(features, list(range(len(features))), tokenizer.pad_token_id)
    assert batch.input_ids.shape == (len(features), 2, 16) and batch.labels.tolist() == [1] * len(features)


def test_choice_features_cut_long_endings_and_need_one_choice_count(tokenizer):
    long_ending = " ".join(["it was good"] * 4)  # 12 tokens, more than half of the 13-token budget
    example = ChoiceExample("the cat sat .", "", [long_ending, "it sat ."], 0, "f:3")
    report = DataReport()
    features = multiple_choice.build_features([example], tokenizer, InputSettings(max_seq_length=16), report=report)
    assert report["truncated_inputs"] == 1 and report.samples["truncated_inputs"] == ["f:3"]
    assert len(features) == 1 and report["windowed_inputs"] == 0  # the short context fits one window
    assert all(len(row) <= 16 for f in features for row in f.input_ids)
    assert features[0].input_ids[0][-7:-1] == ids(tokenizer, long_ending)[:6]  # cut to 13 // 2 tokens
    (short,) = multiple_choice.build_features([ChoiceExample("the cat sat .", "", ["it sat .", "it was ."], 0,
                                                             "f:4")], tokenizer, InputSettings(max_seq_length=16))
    assert short.input_ids[0] == [2, *ids(tokenizer, "the cat sat ."), 3, *ids(tokenizer, "it sat ."), 3]
    three = ChoiceExample("the cat sat .", "", ["a", "b", "c"], 0, "f:5")
    with pytest.raises(DataError, match="3 choices where earlier questions have 2"):
        multiple_choice.build_features([example, three], tokenizer, InputSettings(max_seq_length=16))


# --- batching ---------------------------------------------------------------------------------------------

def test_collate_pads_inputs_and_token_labels(tokenizer):
    example = TaggingExample(["cat"], ["O"], " ", "f:1")
    longer = TaggingExample(["the", "cat", "sat"], ["O", "O", "O"], " ", "f:2")
    features = tagging.build_features([example, longer], tokenizer, InputSettings(max_seq_length=16),
                                      label2id={"O": 0})
    batch = collate_features(features, [0, 1], tokenizer.pad_token_id)
    assert batch.input_ids.shape == (2, 5) and batch.attention_mask[0].tolist() == [1, 1, 1, 0, 0]
    assert batch.labels[0].tolist() == [IGNORE_INDEX, 0, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]
    assert batch.num_tokens == 8 and len(batch) == 2
    assert set(batch.model_inputs()) == {"input_ids", "token_type_ids", "attention_mask"}
    moved = batch.to("cpu")
    assert moved.labels.dtype == torch.long and moved.feature_index.tolist() == [0, 1]


def test_feature_batches_shuffle_per_epoch_and_resume(tokenizer):
    examples = [ClassificationExample("cat " * (i % 5 + 1), None, "0", f"f:{i}") for i in range(10)]
    features = classification.build_features(examples, tokenizer, InputSettings(max_seq_length=16), label2id={"0": 0})
    source = FeatureBatches(features, 3, tokenizer.pad_token_id, shuffle=True, seed=7)
    assert len(source) == 4
    first = [b.feature_index.tolist() for b in source]
    second = [b.feature_index.tolist() for b in source]
    assert sorted(sum(first, [])) == list(range(10)) and first != second
    again = FeatureBatches(features, 3, tokenizer.pad_token_id, shuffle=True, seed=7)
    iterator = iter(again)
    assert next(iterator).feature_index.tolist() == first[0]
    state = again.state_dict()
    assert state == {"epoch": 0, "consumed": 3, "seed": 7}
    resumed = FeatureBatches(features, 3, tokenizer.pad_token_id, shuffle=True, seed=7)
    resumed.load_state_dict(state)
    assert [b.feature_index.tolist() for b in resumed] == first[1:]
    assert [b.feature_index.tolist() for b in resumed] == second
    with pytest.raises(ConfigError, match="no features"):
        FeatureBatches([], 3, 0)


def test_feature_batches_split_between_ranks(tokenizer):
    examples = [ClassificationExample("cat", None, "0", f"f:{i}") for i in range(9)]
    features = classification.build_features(examples, tokenizer, InputSettings(max_seq_length=16), label2id={"0": 0})
    ranks = [FeatureBatches(features, 2, 0, shuffle=True, seed=3, rank=r, world_size=2) for r in (0, 1)]
    assert [len(r) for r in ranks] == [2, 2]  # 5 batches: both ranks take 2, the same number
    seen = [i for r in ranks for b in r for i in b.feature_index.tolist()]
    assert len(seen) == len(set(seen)) == 8


def test_data_report_logs_windowing_as_information_and_cuts_as_warnings(caplog):
    import logging

    from bertforge.data.finetuning import DataReport

    report = DataReport()
    report.note("windowed_inputs", "dev.json:3", amount=158)
    report.note("truncated_questions", "dev.json:9")
    with caplog.at_level(logging.INFO):
        report.log_warnings("drcd dev")
    levels = {record.getMessage().split(": ")[1]: record.levelno for record in caplog.records}
    assert levels == {"windowed_inputs": logging.INFO, "truncated_questions": logging.WARNING}
    assert any("windowed_inputs: 158" in record.getMessage() for record in caplog.records)
