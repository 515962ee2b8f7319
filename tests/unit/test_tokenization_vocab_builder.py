"""Tests for `bertforge.tokenization.vocab_builder` on small slices of the real corpora."""

from __future__ import annotations

import pytest

from bertforge.configuration import shared_data_root
from bertforge.errors import ConfigError, DataError
from bertforge.tokenization import Tokenizer, TokenizerConfig, build_vocab, unk_rate
from bertforge.tokenization.normalizer import is_cjk

pytest.importorskip("tokenizers")

DATA = shared_data_root()


def real_lines(relative: str, count: int) -> list[str]:
    path = DATA / relative
    if not path.exists():
        pytest.skip(f"{path} not available")
    return [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()][:count]


def test_vocab_builder_english_order_and_coverage():
    lines = real_lines("pretrain_en/nltk_gutenberg/austen-emma.txt", 3000)
    train, held_out = lines[:2500], lines[2500:]
    vocab = build_vocab(["\n".join(train)], 2000, num_unused=3)
    assert len(vocab) == 2000
    assert vocab.tokens[:8] == [
        "[PAD]",
        "[unused0]",
        "[unused1]",
        "[unused2]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
    ]
    assert any(token.startswith("##") for token in vocab)
    tokenizer = Tokenizer(vocab)
    # Trained on our own words, so every training word segments without [UNK].
    assert unk_rate(tokenizer, train) == 0.0
    assert unk_rate(tokenizer, held_out) < 0.001
    assert tokenizer.tokenize("Emma Woodhouse, handsome, clever, and rich")[:2] == ["emma", "woodhouse"]


def test_vocab_builder_cased_keeps_capitals(tmp_path):
    lines = real_lines("pretrain_en/nltk_gutenberg/carroll-alice.txt", 800)
    path = tmp_path / "alice.txt"
    path.write_text("\n".join(lines), encoding="utf-8")
    vocab = build_vocab([path], 1200, do_lower_case=False)
    assert "Alice" in vocab
    assert unk_rate(Tokenizer(vocab, TokenizerConfig(do_lower_case=False)), lines) == 0.0


def test_vocab_builder_chinese_characters_are_single_tokens():
    lines = real_lines("pretrain_zh/hongloumeng.txt", 400)
    vocab = build_vocab(lines, 6000, lang="zh")
    tokens = vocab.tokens
    assert not [token for token in tokens if len(token) > 1 and any(is_cjk(ord(char)) for char in token)]
    seen = {char for line in lines for char in line if is_cjk(ord(char))}
    assert seen <= set(tokens)
    tokenizer = Tokenizer(vocab)
    assert unk_rate(tokenizer, lines) == 0.0
    assert tokenizer.tokenize("贾雨村") == ["贾", "雨", "村"]


def test_vocab_builder_rejects_bad_arguments(tmp_path):
    with pytest.raises(ConfigError, match="lang must be one of"):
        build_vocab(["a b"], 100, lang="fr")
    with pytest.raises(ConfigError, match="vocab_size must be an integer larger than the 5"):
        build_vocab(["a b"], 5)
    with pytest.raises(ConfigError, match="num_unused"):
        build_vocab(["a b"], 100, num_unused=-1)
    with pytest.raises(DataError, match="cannot read"):
        build_vocab([tmp_path / "absent.txt"], 100)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n\xff\xfe\n")
    with pytest.raises(DataError, match=r"bad.txt:2: not valid UTF-8"):
        build_vocab([bad], 100)


def test_vocab_builder_unk_rate_counts_unknown_tokens():
    vocab = build_vocab(["aa bb aa bb"], 20, min_frequency=1)
    tokenizer = Tokenizer(vocab)
    assert unk_rate(tokenizer, ["aa zz"]) == 0.5
    assert unk_rate(tokenizer, []) == 0.0


def test_vocab_builder_ids_do_not_depend_on_trainer_order():
    """The trainer numbers pieces in a per-process hash order; the same pieces must still get the same ids."""
    import random

    from bertforge.tokenization.vocab_builder import canonical_order

    vocab = build_vocab(["\n".join(real_lines("pretrain_en/nltk_gutenberg/austen-emma.txt", 1500))], 1500)
    learned = vocab.tokens[5:]
    assert canonical_order(learned) == learned
    for seed in range(3):
        shuffled = learned[:]
        random.Random(seed).shuffle(shuffled)
        assert canonical_order(shuffled) == learned


def test_vocab_builder_canonical_order_groups_pieces():
    from bertforge.tokenization.vocab_builder import canonical_order

    assert canonical_order(["##ing", "the", "t", "##s", "a", "##", "th"]) == ["a", "t", "##s", "##", "th", "the",
                                                                           "##ing"]
