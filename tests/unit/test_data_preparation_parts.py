"""Tests of `bertforge.data.preparation_parts`: a preparation split into parts writes the shards and the
index one process writes, byte for byte; the merge names missing parts; a killed part resumes alone."""

from __future__ import annotations

import json

import pytest
from tests.unit.test_data_shards import directory_bytes, tiny_tokenizer, write_corpus

from bertforge.data.preparation import prepare_corpus
from bertforge.data.preparation_parts import Part, merge_parts
from bertforge.data.shards import INDEX_NAME, PART_INDEX_FILE, ShardIndex, part_index_name
from bertforge.errors import ConfigError, DataError

SETTINGS = {"max_seq_length": 24, "shard_size": 1500, "dupe_factor": 2, "heldout_fraction": 0.1}


def without_part_indexes(directory) -> dict[str, bytes]:
    return {name: data for name, data in directory_bytes(directory).items() if not PART_INDEX_FILE.fullmatch(name)}


@pytest.fixture
def reference(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt", documents=30)
    report = prepare_corpus(corpus, tiny_tokenizer(), tmp_path / "one", **SETTINGS)
    return corpus, report


def test_preparation_parts_two_parts_write_what_one_process_writes(tmp_path, reference):
    corpus, single = reference
    first = prepare_corpus(corpus, tiny_tokenizer(), tmp_path / "two", part=Part(0, 2), **SETTINGS)
    assert first.part == "0/2" and not first.merged and not (tmp_path / "two" / INDEX_NAME).exists()
    second = prepare_corpus(corpus, tiny_tokenizer(), tmp_path / "two", part=Part(1, 2), **SETTINGS)
    assert second.merged  # the last part to finish merges
    assert first.shards_written > 0 and second.shards_written > 0
    assert first.shards_written + second.shards_written == single.shards_written
    assert first.instances + second.instances == single.instances
    one, two = directory_bytes(tmp_path / "one"), without_part_indexes(tmp_path / "two")
    assert sorted(one) == sorted(two) and one == two  # every shard file and index.json, byte for byte
    assert ShardIndex.load(tmp_path / "two").splits == ShardIndex.load(tmp_path / "one").splits


def test_preparation_parts_merge_by_hand_equals_the_automatic_merge(tmp_path, reference):
    corpus, _ = reference
    for number in (2, 0, 1):  # any order: the parts do not depend on each other
        prepare_corpus(corpus, tiny_tokenizer(), tmp_path / "three", part=Part(number, 3), **SETTINGS)
    merged = (tmp_path / "three" / INDEX_NAME).read_bytes()
    (tmp_path / "three" / INDEX_NAME).unlink()
    report = merge_parts(tmp_path / "three")
    assert (tmp_path / "three" / INDEX_NAME).read_bytes() == merged == (tmp_path / "one" / INDEX_NAME).read_bytes()
    splits = json.loads(merged)["splits"]
    assert report.shards_written == 0 and report.shards_skipped == sum(len(s["shards"]) for s in splits.values())


def test_preparation_parts_merge_names_the_missing_parts(tmp_path, reference):
    corpus, _ = reference
    prepare_corpus(corpus, tiny_tokenizer(), tmp_path / "data", part=Part(1, 3), **SETTINGS)
    with pytest.raises(DataError, match=r"2 of 3 parts have not finished \(0/3, 2/3\)"):
        merge_parts(tmp_path / "data")
    with pytest.raises(DataError, match=r"only the indexes of parts.*--merge"):
        ShardIndex.load(tmp_path / "data")
    with pytest.raises(DataError, match="nothing to merge"):
        merge_parts(tmp_path / "one")


def test_preparation_parts_refuse_parts_of_other_settings(tmp_path, reference):
    corpus, _ = reference
    prepare_corpus(corpus, tiny_tokenizer(), tmp_path / "data", part=Part(0, 2), **SETTINGS)
    with pytest.raises(DataError, match=r"other settings than part 0/2 \(seed differ"):  # its automatic merge
        prepare_corpus(corpus, tiny_tokenizer(), tmp_path / "data", part=Part(1, 2), **{**SETTINGS, "seed": 3})
    with pytest.raises(DataError, match=r"other settings than part 0/2 \(seed differ"):
        merge_parts(tmp_path / "data")
    assert not (tmp_path / "data" / INDEX_NAME).exists()


def test_preparation_parts_a_killed_part_resumes_without_touching_the_others(tmp_path, reference):
    corpus, single = reference
    data = tmp_path / "data"
    prepare_corpus(corpus, tiny_tokenizer(), data, part=Part(0, 2), **SETTINGS)
    # Part 1 killed after its first group: its index lists one group's shards, incomplete, plus a temp file.
    prepare_corpus(corpus, tiny_tokenizer(), data, part=Part(1, 2), **SETTINGS)
    index_path = data / part_index_name(1, 2)
    index = json.loads(index_path.read_text())
    kept = index["splits"]["train"]["shards"][:2]
    dropped = index["splits"]["train"]["shards"][2:]
    index["splits"]["train"]["shards"], index["complete"] = kept, False
    index_path.write_text(json.dumps(index))
    (data / INDEX_NAME).unlink()
    for record in dropped:
        (data / f"{record['name']}.tokens.npy").unlink()
    (data / f".{dropped[0]['name']}.tokens.npy.abc.tmp").write_bytes(b"half")
    part_zero = {name: data for name, data in directory_bytes(data).items() if name.startswith("train-00000")}
    resumed = prepare_corpus(corpus, tiny_tokenizer(), data, part=Part(1, 2), **SETTINGS)
    assert resumed.merged and resumed.shards_skipped == len(kept) and resumed.shards_written > 0
    assert without_part_indexes(data) == directory_bytes(tmp_path / "one")
    assert all(directory_bytes(data)[name] == part_zero[name] for name in part_zero)
    assert ShardIndex.load(data).splits["train"]["instances"] == single.instances


def test_preparation_parts_parse_and_environment(monkeypatch):
    assert Part.parse("1/4") == Part(1, 4) and str(Part(1, 4)) == "1/4"
    assert Part(1, 4).owns(5) and not Part(1, 4).owns(4)
    with pytest.raises(ConfigError, match=r"counts from 0.*0/2, 1/2"):
        Part.parse("2/2")
    with pytest.raises(ConfigError, match="write it as i/n"):
        Part.parse("first half")
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert Part.from_env() is None
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert Part.from_env() == Part(1, 3)
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    assert Part.from_env() is None
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match=r"WORLD_SIZE='two'.*torchrun.*or pass --part i/n"):
        Part.from_env()
