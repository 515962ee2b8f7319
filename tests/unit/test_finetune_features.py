"""Fine-tuning features: window arithmetic, NER label alignment, long-input windows for QA, tagging and
classification, multiple-choice truncation, and the batch source the training loop iterates."""

from __future__ import annotations

import pytest
import torch

from bertforge.constants import IGNORE_INDEX
from bertforge.data.choice import ChoiceExample, build_choice_features
from bertforge.data.classification import ClassificationExample, build_classification_features
from bertforge.data.conll import TaggingExample, build_tagging_features, token_words
from bertforge.data.finetuning import (
    DataReport,
    FeatureBatches,
    collate_features,
    max_context_positions,
    window_starts,
)
from bertforge.data.squad import QAExample, build_qa_features
from bertforge.errors import ConfigError
from bertforge.tokenization import Tokenizer, TokenizerConfig, Vocab

WORDS = "the a cat sat on mat play john lives in paris where does live is was good bad ? . , new york".split()
TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##ing", "##s", "##ed", *"0123456789",
          *"北京张三住在"]


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(Vocab(TOKENS), TokenizerConfig())


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


# --- windows ----------------------------------------------------------------------------------------------

def test_window_starts_google_rule():
    assert window_starts(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
    assert window_starts(10, 4, 10) == [(0, 4), (4, 4), (8, 2)]  # a stride above the window never skips
    assert window_starts(3, 4, 2) == [(0, 3)]
    assert window_starts(0, 4, 2) == [(0, 0)]
    with pytest.raises(ConfigError, match="no room"):
        window_starts(5, 0, 2)


def test_max_context_positions_prefers_centred_windows():
    spans = window_starts(10, 4, 2)  # (0,4) (2,4) (4,4) (6,4)
    best = max_context_positions(spans, 10)
    assert best[0] == 0 and best[9] == 3
    assert best[3] == 1  # the last token of window 0, but one left and two right of it in window 1
    for token, window in enumerate(best):
        start, size = spans[window]
        assert start <= token < start + size


# --- tagging alignment ------------------------------------------------------------------------------------

def test_tagging_label_on_first_sub_token(tokenizer):
    example = TaggingExample(["john", "playing", "in", "new", "york"], ["B-PER", "O", "O", "B-LOC", "I-LOC"], " ", "f:1")
    label2id = {"O": 0, "B-PER": 1, "B-LOC": 2, "I-LOC": 3}
    (feature,) = build_tagging_features([example], tokenizer, 16, label2id=label2id)
    tokens = tokenizer.convert_ids_to_tokens(feature.input_ids)
    assert tokens == ["[CLS]", "john", "play", "##ing", "in", "new", "york", "[SEP]"]
    assert feature.token_labels == [IGNORE_INDEX, 1, 0, IGNORE_INDEX, 0, 2, 3, IGNORE_INDEX]
    assert feature.word_index == [None, 0, 1, None, 2, 3, 4, None]


def test_tagging_label_policy_all_turns_begin_into_inside(tokenizer):
    example = TaggingExample(["plays"], ["B-PER"], " ", "f:1")
    label2id = {"O": 0, "B-PER": 1, "I-PER": 2}
    (feature,) = build_tagging_features([example], tokenizer, 16, label2id=label2id, label_policy="all")
    assert tokenizer.convert_ids_to_tokens(feature.input_ids[1:-1]) == ["play", "##s"]
    assert feature.token_labels[1:-1] == [1, 2]
    assert feature.word_index[1:-1] == [0, None]  # still predicted from the first piece


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
    features = build_tagging_features([example], tokenizer, 10, label2id={"O": 0}, stride=4, report=report)
    assert len(features) > 1 and report["windowed_inputs"] == 1
    predicted = [w for f in features for w in f.word_index if w is not None]
    assert sorted(predicted) == list(range(len(words)))
    # Each word is predicted from the window where it has most context, never from a window's edge
    # when a more central window holds it.
    for feature in features[1:-1]:
        assert feature.word_index[1] is None and feature.word_index[-2] is None
    for feature in features:
        labelled = [i for i, label in enumerate(feature.token_labels) if label != IGNORE_INDEX]
        assert len(labelled) == len(feature.input_ids) - 2  # every window is trained on all its words


def test_tagging_word_without_tokens_is_counted(tokenizer):
    example = TaggingExample(["cat", "\u200b", "sat"], ["O", "O", "O"], " ", "f:1")
    report = DataReport()
    (feature,) = build_tagging_features([example], tokenizer, 16, label2id={"O": 0}, report=report)
    assert report["words_without_tokens"] == 1
    assert [w for w in feature.word_index if w is not None] == [0, 2]


# --- QA windows -------------------------------------------------------------------------------------------

def test_qa_answer_in_third_window(tokenizer):
    filler = "the cat sat on a mat . " * 6  # 42 tokens
    context = filler + "john lives in paris . " + filler
    answer_start = context.index("paris")
    example = QAExample("q1", "where does john live ?", context, ["paris"], answer_start, "paris")
    report = DataReport()
    features = build_qa_features([example], tokenizer, 32, doc_stride=16, max_query_length=8, training=True,
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
    (feature,) = build_qa_features([example], tokenizer, 64, max_query_length=4, training=True, report=report)
    assert report["truncated_questions"] == 1
    assert (feature.start_position, feature.end_position) == (0, 0)
    unlocated = QAExample("u", "where ?", "john lives in paris .", ["rome"], None, None)
    assert build_qa_features([unlocated], tokenizer, 64, training=True) == []
    assert len(build_qa_features([unlocated], tokenizer, 64, training=False)) == 1


def test_qa_no_room_is_a_config_error(tokenizer):
    example = QAExample("q", "where does john live ?", "paris", ["paris"], 0, "paris")
    with pytest.raises(ConfigError, match="leaves no room"):
        build_qa_features([example], tokenizer, 8)


# --- classification windows -------------------------------------------------------------------------------

def test_classification_long_input_is_windowed_not_truncated(tokenizer):
    text = " ".join(["the cat sat on a mat"] * 5)  # 30 tokens
    example = ClassificationExample(text, None, "1", "f:2")
    report = DataReport()
    features = build_classification_features([example], tokenizer, 12, label2id={"0": 0, "1": 1}, report=report)
    assert report["windowed_inputs"] == 1 and report.samples["windowed_inputs"] == ["f:2"]
    covered = [t for f in features for t in f.input_ids[1:-1]]
    assert set(covered) == set(ids(tokenizer, text)) and all(len(f.input_ids) <= 12 for f in features)
    assert all(f.label == 1 and f.example_index == 0 for f in features)
    assert features[-1].input_ids[-2] == ids(tokenizer, text)[-1]  # the last window reaches the end


def test_classification_pair_windows_over_the_longer_segment(tokenizer):
    premise = " ".join(["the cat sat on a mat"] * 4)
    example = ClassificationExample(premise, "cat sat", "0", "f:2")
    features = build_classification_features([example], tokenizer, 16, label2id={"0": 0})
    hypothesis = ids(tokenizer, "cat sat")
    for feature in features:
        assert feature.input_ids[-3:-1] == hypothesis  # the short segment is kept whole in every window
        assert feature.token_type_ids.count(1) == len(hypothesis) + 1


def test_classification_short_input_single_feature_and_regression(tokenizer):
    (feature,) = build_classification_features([ClassificationExample("good", "bad", 3.5, "f:1")], tokenizer, 16,
                                               regression=True)
    assert feature.input_ids == [2, *ids(tokenizer, "good"), 3, *ids(tokenizer, "bad"), 3]
    assert feature.token_type_ids == [0, 0, 0, 1, 1] and feature.label == 3.5


# --- multiple choice --------------------------------------------------------------------------------------

def test_choice_features_one_row_per_choice_and_truncation(tokenizer):
    example = ChoiceExample("the cat sat on a mat . " * 4, "then", ["it sat .", "it was good ."], 1, "f:2")
    report = DataReport()
    (feature,) = build_choice_features([example], tokenizer, 16, report=report)
    assert len(feature.input_ids) == 2 and all(len(row) <= 16 for row in feature.input_ids)
    assert report["truncated_inputs"] == 1 and feature.label == 1
    batch = collate_features([feature], [0], tokenizer.pad_token_id)
    assert batch.input_ids.shape == (1, 2, 16) and batch.labels.tolist() == [1]


# --- batching ---------------------------------------------------------------------------------------------

def test_collate_pads_inputs_and_token_labels(tokenizer):
    example = TaggingExample(["cat"], ["O"], " ", "f:1")
    longer = TaggingExample(["the", "cat", "sat"], ["O", "O", "O"], " ", "f:2")
    features = build_tagging_features([example, longer], tokenizer, 16, label2id={"O": 0})
    batch = collate_features(features, [0, 1], tokenizer.pad_token_id)
    assert batch.input_ids.shape == (2, 5) and batch.attention_mask[0].tolist() == [1, 1, 1, 0, 0]
    assert batch.labels[0].tolist() == [IGNORE_INDEX, 0, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]
    assert batch.num_tokens == 8 and len(batch) == 2
    assert set(batch.model_inputs()) == {"input_ids", "token_type_ids", "attention_mask"}
    moved = batch.to("cpu")
    assert moved.labels.dtype == torch.long and moved.feature_index.tolist() == [0, 1]


def test_feature_batches_shuffle_per_epoch_and_resume(tokenizer):
    examples = [ClassificationExample("cat " * (i % 5 + 1), None, "0", f"f:{i}") for i in range(10)]
    features = build_classification_features(examples, tokenizer, 16, label2id={"0": 0})
    source = FeatureBatches(features, 3, tokenizer.pad_token_id, shuffle=True, seed=7)
    assert len(source) == 4
    first = [b.feature_index.tolist() for b in source]
    second = [b.feature_index.tolist() for b in source]
    assert sorted(sum(first, [])) == list(range(10)) and first != second
    again = FeatureBatches(features, 3, tokenizer.pad_token_id, shuffle=True, seed=7)
    iterator = iter(again)
    assert next(iterator).feature_index.tolist() == first[0]
    state = again.state_dict()
    assert state == {"epoch": 0, "position": 1, "seed": 7}
    resumed = FeatureBatches(features, 3, tokenizer.pad_token_id, shuffle=True, seed=7)
    resumed.load_state_dict(state)
    assert [b.feature_index.tolist() for b in resumed] == first[1:]
    assert [b.feature_index.tolist() for b in resumed] == second
    with pytest.raises(ConfigError, match="no features"):
        FeatureBatches([], 3, 0)


def test_feature_batches_split_between_ranks(tokenizer):
    examples = [ClassificationExample("cat", None, "0", f"f:{i}") for i in range(9)]
    features = build_classification_features(examples, tokenizer, 16, label2id={"0": 0})
    ranks = [FeatureBatches(features, 2, 0, shuffle=True, seed=3, rank=r, world_size=2) for r in (0, 1)]
    assert [len(r) for r in ranks] == [2, 2]  # 5 batches: both ranks take 2, the same number
    seen = [i for r in ranks for b in r for i in b.feature_index.tolist()]
    assert len(seen) == len(set(seen)) == 8
