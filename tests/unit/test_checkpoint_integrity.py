"""Damaged model directories and checkpoints: each damage gives ONE clear error (a `BertforgeError` of one line
naming the file and the fix) or a named warning, never a silent load with wrong content or a traceback.

The directory is a fine-tuned two-label classifier as bertforge saves it (config.json with id2label,
model.safetensors with its checksum in checksums.json, vocab.txt of 300 tokens = vocab_size, the tokenizer
files, finetuning.json), read the way `predict`, `evaluate` and `serve` read one: `read_directory`, the
tokenizer, then `registry.load_model`. "Foreign" cases remove checksums.json first, as a directory from
Hugging Face or an older bertforge has none, to reach the checks behind the checksum.
"""

from __future__ import annotations

import json
import logging
import pickle
import re
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from bertforge.checkpoint_format import read_directory, save_model
from bertforge.constants import CHECKSUMS_NAME, TRAINING_STATE_NAME
from bertforge.errors import BertforgeError, CheckpointError, ConfigError, DataError
from bertforge.families import registry
from bertforge.families.classification import BertForSequenceClassification
from bertforge.storage import SKIP_CHECKSUM_ENV, record_checksums
from bertforge.tokenization import Tokenizer, TokenizerConfig, Vocab
from bertforge.training.checkpoint import load_training_state, save_checkpoint

W = "model.safetensors"
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB_SIZE = 300
QUERY = "bert.encoder.layer.0.attention.self.query.weight"


def tokens() -> list[str]:
    return SPECIALS + [f"word{i}" for i in range(VOCAB_SIZE - len(SPECIALS))]


def classifier(config) -> BertForSequenceClassification:
    torch.manual_seed(0)
    return BertForSequenceClassification(config.replace(vocab_size=VOCAB_SIZE).with_labels(["negative", "positive"]))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    from conftest import make_tiny_config

    path = tmp_path_factory.mktemp("integrity") / "model"
    tokenizer = Tokenizer(Vocab(tokens()), TokenizerConfig(do_lower_case=True))
    save_model(classifier(make_tiny_config()), path, tokenizer=tokenizer,
               extra_files={"finetuning.json": json.dumps({"task": "sst2"})})
    return path


@pytest.fixture
def model_dir(pristine, tmp_path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "model"))


def load_everything(path: Path):
    """What `predict` / `serve` do with a directory: read it (config, tokenizer, record), load the model."""
    directory = read_directory(path)
    directory.require_tokenizer()
    return registry.load_model(directory)[0]


# --- damages ---------------------------------------------------------------------------------------------

def foreign(path: Path) -> Path:
    (path / CHECKSUMS_NAME).unlink()
    return path


def header_end(path: Path) -> int:
    """Where a safetensors file's data begins: 8 bytes of header length, then the JSON header."""
    return 8 + struct.unpack("<Q", (path / W).read_bytes()[:8])[0]


def edit_tensors(change: Callable[[dict], None], *, checksum: str = "keep") -> Callable[[Path], None]:
    """Rewrite the weights through safetensors; then keep the old checksum (another tool replaced the file),
    drop checksums.json (a foreign directory) or record the new one (what a save of these weights writes)."""

    def damage(path: Path) -> None:
        tensors = load_file(str(path / W))
        change(tensors)
        save_file(tensors, str(path / W), metadata={"format": "pt"})
        if checksum == "drop":
            foreign(path)
        elif checksum == "record":
            record_checksums(path, [W])

    return damage


def set_value(value: float) -> Callable[[dict], None]:
    return lambda tensors: tensors[QUERY].__setitem__((0, 0), value)


def truncate(at: Callable[[Path], int], *, checksum: bool = True) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = (path / W).read_bytes()
        (path / W).write_bytes(data[: at(path)])
        if not checksum:
            foreign(path)

    return damage


def random_data(*, checksum: bool = True) -> Callable[[Path], None]:
    """Random bytes behind a valid header: the file still parses, every tensor holds noise."""

    def damage(path: Path) -> None:
        data = bytearray((path / W).read_bytes())
        start = header_end(path)
        data[start:] = np.random.default_rng(0).integers(0, 256, len(data) - start, dtype=np.uint8).tobytes()
        (path / W).write_bytes(bytes(data))
        if not checksum:
            foreign(path)

    return damage


def flip_one_bit(path: Path) -> None:
    data = bytearray((path / W).read_bytes())
    data[header_end(path) + 100] ^= 0x01
    (path / W).write_bytes(bytes(data))


def write(name: str, content: bytes | str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        (path / name).write_bytes(content if isinstance(content, bytes) else content.encode())

    return damage


def remove(name: str) -> Callable[[Path], None]:
    return lambda path: (path / name).unlink()


def cut(name: str, keep: float) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = (path / name).read_bytes()
        (path / name).write_bytes(data[: int(len(data) * keep)])

    return damage


def edit_json(name: str, change: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = json.loads((path / name).read_text())
        change(data)
        (path / name).write_text(json.dumps(data))

    return damage


def vocab_lines(lines: list[str], *, checksum: bool = False) -> Callable[[Path], None]:
    """Replace vocab.txt; without `checksum`, as in a foreign directory (none covers it), to reach the checks
    behind the checksum."""
    return damaged_foreign(write("vocab.txt", "".join(line + "\n" for line in lines)), checksum=checksum)


def damaged_foreign(damage: Callable[[Path], None], *, checksum: bool = False) -> Callable[[Path], None]:
    """`damage`, then drop checksums.json unless `checksum` (a directory from elsewhere carries none)."""

    def both(path: Path) -> None:
        damage(path)
        if not checksum:
            foreign(path)

    return both


def swapped(lines: list[str], a: int, b: int) -> list[str]:
    lines = list(lines)
    lines[a], lines[b] = lines[b], lines[a]
    return lines


def int32_classifier(tensors: dict) -> None:
    tensors["classifier.weight"] = (tensors["classifier.weight"] * 100).to(torch.int32)


def as_pytorch_bin(content: Callable[[Path], bytes]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = content(path)
        foreign(path)
        (path / W).unlink()
        (path / "pytorch_model.bin").write_bytes(data)

    return damage


def torch_bytes(path: Path) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(load_file(str(path / W)), buffer)
    return buffer.getvalue()


class RunsCode:
    def __reduce__(self):
        return (print, ("a pickle that runs code on load",))


def sharded(missing: bool = False, garbled_index: bool = False) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        tensors = load_file(str(path / W))
        names = sorted(tensors)
        halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
        for shard, keys in halves.items():
            save_file({k: tensors[k] for k in keys}, str(path / shard))
        foreign(path)
        (path / W).unlink()
        index = json.dumps({"weight_map": {k: shard for shard, keys in halves.items() for k in keys}})
        (path / f"{W}.index.json").write_text(index[: len(index) // 2] if garbled_index else index)
        if missing:
            (path / "model-00002-of-00002.safetensors").unlink()

    return damage


@dataclass(frozen=True)
class Case:
    damage: Callable[[Path], None]
    error: type[Exception] | None  # None: loads, with the warning `pattern`
    pattern: str  # matched against the message; names the file and the fix


CORRUPT = "weights are unreadable or corrupt.*re-save or re-download"
CHANGED = rf"{W}: its sha256 differs from the one saved in checksums\.json.*re-save or re-download.*delete checksums\.json"
SHORT = rf"{W}: \d+ bytes, but \d+ were saved \(truncated or damaged\); re-save or re-download"
NOT_FINITE = rf"{W}: tensor \S+ holds \d+ NaN or infinite values.*re-save or re-download"
CONFIG_JSON = r"config\.json: cannot read this config\.json as JSON"

CASES = {
    # weights: values that are not numbers
    "nan_in_weights_foreign": Case(edit_tensors(set_value(float("nan")), checksum="drop"), CheckpointError,
                                   NOT_FINITE.replace(r"\S+", re.escape(QUERY)).replace(r"\d+", "1", 1)),
    "inf_in_weights_foreign": Case(edit_tensors(set_value(float("inf")), checksum="drop"), CheckpointError, NOT_FINITE),
    "nan_saved_by_a_diverged_run": Case(edit_tensors(set_value(float("nan")), checksum="record"), CheckpointError,
                                        NOT_FINITE),
    # weights: bytes damaged behind a valid header
    "random_bytes_behind_header": Case(random_data(), CheckpointError, CHANGED),
    "random_bytes_behind_header_foreign": Case(random_data(checksum=False), CheckpointError, NOT_FINITE),
    "one_bit_flipped": Case(flip_one_bit, CheckpointError, CHANGED),
    "replaced_by_another_tool": Case(edit_tensors(lambda t: t[QUERY].mul_(2)), CheckpointError, CHANGED),
    # weights: truncated, with the checksum's size, and without it (safetensors' own checks)
    "weights_emptied": Case(truncate(lambda p: 0), CheckpointError, SHORT),
    "weights_cut_in_length_prefix": Case(truncate(lambda p: 5), CheckpointError, SHORT),
    "weights_cut_in_header": Case(truncate(lambda p: header_end(p) // 2), CheckpointError, SHORT),
    "weights_cut_after_header": Case(truncate(header_end), CheckpointError, SHORT),
    "weights_cut_in_data": Case(truncate(lambda p: (header_end(p) + (p / W).stat().st_size) // 2), CheckpointError,
                                SHORT),
    "weights_last_byte_missing": Case(truncate(lambda p: (p / W).stat().st_size - 1), CheckpointError, SHORT),
    "weights_emptied_foreign": Case(truncate(lambda p: 0, checksum=False), CheckpointError, CORRUPT),
    "weights_cut_in_header_foreign": Case(truncate(lambda p: header_end(p) // 2, checksum=False), CheckpointError,
                                          CORRUPT),
    "weights_cut_in_data_foreign": Case(truncate(lambda p: (header_end(p) + (p / W).stat().st_size) // 2,
                                                 checksum=False), CheckpointError, CORRUPT),
    "weights_missing": Case(remove(W), CheckpointError, r"no weights found; expected model\.safetensors"),
    # the checksum manifest itself
    "checksums_garbled": Case(write(CHECKSUMS_NAME, b"\x00\xff{not json"), CheckpointError,
                              r"checksums\.json: cannot read this checksum manifest.*delete checksums\.json"),
    "checksums_emptied": Case(write(CHECKSUMS_NAME, b""), CheckpointError,
                              r"checksums\.json: cannot read this checksum manifest.*re-save or re-download"),
    # other weights formats
    "pytorch_bin_garbage": Case(as_pytorch_bin(lambda p: b"garbage, not a pickle"), CheckpointError,
                                rf"pytorch_model\.bin: {CORRUPT}"),
    "pytorch_bin_truncated": Case(as_pytorch_bin(lambda p: torch_bytes(p)[:-200]), CheckpointError,
                                  rf"pytorch_model\.bin: {CORRUPT}"),
    "pytorch_bin_runs_code": Case(as_pytorch_bin(lambda p: pickle.dumps(RunsCode(), protocol=2)), CheckpointError,
                                  rf"pytorch_model\.bin: {CORRUPT}"),
    "shard_missing": Case(sharded(missing=True), CheckpointError, rf"model-00002-of-00002\.safetensors: {CORRUPT}"),
    "shard_index_garbled": Case(sharded(garbled_index=True), CheckpointError,
                                r"model\.safetensors\.index\.json: cannot read this shard index as JSON"),
    # config.json
    "config_missing": Case(remove("config.json"), CheckpointError, r"config\.json: missing; a model directory needs"),
    "config_emptied": Case(write("config.json", b""), CheckpointError, CONFIG_JSON),
    "config_truncated": Case(cut("config.json", 0.5), CheckpointError, CONFIG_JSON),
    "config_random_bytes": Case(write("config.json", bytes(range(256))), CheckpointError, CONFIG_JSON),
    "config_not_an_object": Case(write("config.json", "[1, 2]"), CheckpointError, r"config\.json: expected a JSON object"),
    "config_key_missing": Case(edit_json("config.json", lambda c: c.pop("hidden_size")), CheckpointError,
                               r"mis-shaped tensors.*config\.json does not match the weights"),
    "config_value_invalid": Case(edit_json("config.json", lambda c: c.update(num_attention_heads="four")),
                                 ConfigError, r"config\.json.*num_attention_heads"),
    # the vocabulary against the model
    "vocab_half": Case(vocab_lines(tokens()[: VOCAB_SIZE // 2]), CheckpointError,
                       r"vocab\.txt: 150 tokens, but config\.json's vocab_size is 300 \(150 rows without a token\): "
                       r"the vocabulary is truncated.*copy in the vocab\.txt the model was trained with"),
    "vocab_larger_than_the_model": Case(vocab_lines(tokens() + ["extra1", "extra2"]), CheckpointError,
                                        r"vocab\.txt: 302 tokens.*ids 300\.\.301 would index past the embedding table"),
    "vocab_emptied": Case(damaged_foreign(write("vocab.txt", b"")), DataError,
                          r"vocab\.txt: the vocabulary file is empty"),
    "vocab_duplicate_lines": Case(vocab_lines(tokens()[:200] + tokens()[100:200]), DataError,
                                  r"vocab\.txt:201: duplicate token 'word95' \(first on line 101\)"),
    "vocab_cut_inside_a_character": Case(damaged_foreign(write("vocab.txt", "\n".join(tokens()[:-1]).encode()
                                                               + "\n字".encode()[:-1])), DataError,
                                         r"vocab\.txt:300: the vocabulary file is not valid UTF-8"),
    "vocab_without_unk": Case(vocab_lines([t for t in tokens() if t != "[UNK]"]), DataError,
                              r"vocab\.txt: the vocabulary has no unknown token '\[UNK\]'"),
    # without vocab.txt the vocabulary is read from tokenizer.json (tests/unit/test_tokenizer_json_directory.py)
    "vocab_missing": Case(lambda p: [remove("vocab.txt")(p), remove("tokenizer.json")(p)], CheckpointError,
                          r"no vocab\.txt \(nor tokenizer\.json\); .*copy the vocab\.txt"),
    "tokenizer_config_garbage": Case(damaged_foreign(write("tokenizer_config.json", b"{\"do_lower_case\": tr")),
                                     DataError, r"tokenizer_config\.json:1: invalid JSON"),
    "tokenizer_config_missing": Case(damaged_foreign(remove("tokenizer_config.json")), CheckpointError,
                                     r"tokenizer_config\.json: missing; a tokenizer directory needs"),
    "tokenizer_config_value_invalid": Case(damaged_foreign(edit_json("tokenizer_config.json",
                                                                     lambda c: c.update(max_input_chars_per_word=-1))),
                                           ConfigError, r"tokenizer_config\.json: .*max_input_chars_per_word"),
    # the tokenizer files: covered by the checksums, and vocab.txt + tokenizer_config.json against tokenizer.json
    "vocab_reordered": Case(vocab_lines(swapped(tokens(), 10, 11), checksum=True), CheckpointError,
                            r"vocab\.txt: its sha256 differs from the one saved in checksums\.json"),
    "vocab_reordered_foreign": Case(vocab_lines(swapped(tokens(), 10, 11)), CheckpointError,
                                    r"tokenizer\.json: does not agree with \S+vocab\.txt \('word6' is id 10 in "
                                    r"vocab\.txt but 11 there\).*re-save the model with bertforge"),
    "tokenizer_config_lowercase_flipped": Case(edit_json("tokenizer_config.json", lambda c: c.update(do_lower_case=False)),
                                               CheckpointError, r"tokenizer_config\.json: \d+ bytes, but \d+ were saved"),
    "tokenizer_config_lowercase_flipped_foreign": Case(
        damaged_foreign(edit_json("tokenizer_config.json", lambda c: c.update(do_lower_case=False))), CheckpointError,
        r"tokenizer\.json: normalizer lowercase is True but tokenizer_config\.json has do_lower_case False"),
    "tokenizer_json_garbage": Case(write("tokenizer.json", b"{not json"), CheckpointError,
                                   r"tokenizer\.json: \d+ bytes, but \d+ were saved"),
    "tokenizer_json_garbage_foreign": Case(damaged_foreign(write("tokenizer.json", b"{not json")), CheckpointError,
                                           r"tokenizer\.json: unreadable \(JSONDecodeError.*or delete it"),
    "tokenizer_json_ids_shuffled_foreign": Case(
        damaged_foreign(edit_json("tokenizer.json", lambda t: t["model"]["vocab"].update(word5=11, word6=10))),
        CheckpointError, r"tokenizer\.json: does not agree with \S+vocab\.txt \('word5' is id 10"),
    "tokenizer_json_lowercase_flipped_foreign": Case(
        damaged_foreign(edit_json("tokenizer.json", lambda t: t["normalizer"].update(lowercase=False))),
        CheckpointError, r"tokenizer\.json: normalizer lowercase is False but tokenizer_config\.json has "
                         r"do_lower_case True.*restore both from the same save"),
    # weights whose dtype lost the values: refused, not cast
    "float_weights_stored_as_int32": Case(edit_tensors(int32_classifier, checksum="record"), CheckpointError,
                                          r"model\.safetensors: floating-point parameters stored with an integer "
                                          r"dtype: classifier\.weight \(torch\.int32\).*save the model again"),
    "float_weights_stored_as_int32_foreign": Case(edit_tensors(int32_classifier, checksum="drop"), CheckpointError,
                                                  r"classifier\.weight \(torch\.int32\)"),
    # labels
    "id2label_missing": Case(edit_json("config.json", lambda c: [c.pop("id2label"), c.pop("label2id", None)]), None,
                             r"config\.json: a classifier without label names \(no id2label\): its 2 outputs are "
                             r"called LABEL_0, LABEL_1.*add \"id2label\""),
    "id2label_size_differs_from_head": Case(
        edit_json("config.json", lambda c: [c.update(id2label={"0": "a", "1": "b", "2": "c"}),
                                            c.pop("label2id", None), c.update(num_labels=3)]), CheckpointError,
        r"another number of outputs than config\.json's 3 labels \(its id2label\).*make id2label list its labels"),
    "id2label_keys_not_label_ids": Case(
        edit_json("config.json", lambda c: [c.update(id2label={"x": "negative", "y": "positive"}), c.pop("label2id")]),
        ConfigError, r"config\.json: BertConfig\.id2label=.* is invalid: give the label ids 0\.\.N-1 as keys"),
    "finetuning_record_garbled": Case(cut("finetuning.json", 0.5), CheckpointError,
                                      r"finetuning\.json: cannot read this finetuning\.json as JSON"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_checkpoint_integrity_each_damage_gives_one_clear_error_or_a_named_warning(model_dir, name, caplog):
    case = CASES[name]
    case.damage(model_dir)
    if case.error is None:
        with caplog.at_level(logging.WARNING):
            load_everything(model_dir)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(re.search(case.pattern, m) and str(model_dir) in m for m in warnings), warnings
        return
    with pytest.raises(BertforgeError) as info:
        load_everything(model_dir)
    message = str(info.value)
    assert isinstance(info.value, case.error), f"{type(info.value).__name__}: {message}"
    assert "\n" not in message and str(model_dir) in message, message
    assert re.search(case.pattern, message), message


def test_checkpoint_integrity_has_the_issue_s_cases():
    # Issue #22 counted 35 corrupted-file cases (NaN, random bytes, truncated files, half vocabulary, missing
    # labels); every kind is here, most at several points.
    assert len(CASES) >= 35


def test_checkpoint_integrity_pristine_directory_loads_verified(model_dir):
    manifest = json.loads((model_dir / CHECKSUMS_NAME).read_text())
    assert manifest["written_by"] == "bertforge" and manifest["algorithm"] == "sha256"
    assert set(manifest["files"]) == {W, "vocab.txt", "tokenizer_config.json", "tokenizer.json"}
    assert manifest["files"][W]["bytes"] == (model_dir / W).stat().st_size
    model = load_everything(model_dir)
    assert model.config.label_names == ["negative", "positive"]


def test_checkpoint_integrity_skip_checksum_env_loads_a_replaced_file(model_dir, monkeypatch):
    edit_tensors(lambda t: t[QUERY].mul_(2))(model_dir)
    with pytest.raises(CheckpointError, match="sha256 differs"):
        load_everything(model_dir)
    monkeypatch.setenv(SKIP_CHECKSUM_ENV, "1")
    model = load_everything(model_dir)
    assert torch.equal(model.state_dict()[QUERY.replace("bert.encoder.layer.0.attention.self.query",
                                                        "bert.encoder.layers.0.attention.query")],
                       load_file(str(model_dir / W))[QUERY])


def test_checkpoint_integrity_directory_without_checksums_loads(model_dir):
    foreign(model_dir)  # Hugging Face's own directories and older bertforge saves have no checksums.json
    assert load_everything(model_dir).config.label_names == ["negative", "positive"]


def test_checkpoint_integrity_foreign_checksums_file_is_ignored(model_dir):
    (model_dir / CHECKSUMS_NAME).write_text(json.dumps({"model.safetensors": "md5:0123"}))
    assert load_everything(model_dir).config.label_names == ["negative", "positive"]


def test_checkpoint_integrity_vocab_padding_rows_are_accepted(model_dir, caplog):
    # NVIDIA's checkpoints pad vocab_size to a multiple of 8 beyond vocab.txt (30528 for 30522 tokens).
    vocab_lines(tokens()[:-6])(model_dir)
    (model_dir / "tokenizer.json").unlink()  # theirs would list the same 294 tokens
    with caplog.at_level(logging.INFO):
        load_everything(model_dir)
    assert any("the last 6 embedding rows are padding" in r.getMessage() for r in caplog.records)


def test_checkpoint_integrity_added_tokens_explain_a_short_vocab_with_a_warning(model_dir, caplog):
    vocab_lines(tokens()[:-200])(model_dir)
    (model_dir / "tokenizer.json").unlink()  # theirs would list the same 100 tokens (added ones apart)
    (model_dir / "added_tokens.json").write_text(json.dumps({f"<new{i}>": 100 + i for i in range(200)}))
    with caplog.at_level(logging.WARNING):
        load_everything(model_dir)
    assert any("the other 200 are added tokens (added_tokens.json)" in r.getMessage() for r in caplog.records)


# --- training checkpoints --------------------------------------------------------------------------------

@pytest.fixture
def checkpoint(tmp_path, tiny_config) -> Path:
    return save_checkpoint(tmp_path, 3, classifier(tiny_config), {"optimizer": {"x": torch.ones(3)}})


STATE_CASES = {
    "state_garbage": (write(TRAINING_STATE_NAME, b"not a torch file"),
                      rf"{TRAINING_STATE_NAME}: \d+ bytes, but \d+ were saved.*re-save or re-download"),
    "state_bytes_changed": (lambda p: flip_state_byte(p),
                            rf"{TRAINING_STATE_NAME}: its sha256 differs.*delete checksums\.json"),
    "state_truncated_foreign": (lambda p: [cut(TRAINING_STATE_NAME, 0.5)(p), foreign(p)],
                                rf"{TRAINING_STATE_NAME}: unreadable or corrupt.*resume from an older checkpoint"),
    "state_missing": (remove(TRAINING_STATE_NAME), rf"{TRAINING_STATE_NAME}: missing; .* not a training checkpoint"),
}


def flip_state_byte(path: Path) -> None:
    data = bytearray((path / TRAINING_STATE_NAME).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (path / TRAINING_STATE_NAME).write_bytes(bytes(data))


@pytest.mark.parametrize("name", sorted(STATE_CASES))
def test_checkpoint_integrity_damaged_training_state_gives_one_clear_error(checkpoint, name):
    damage, pattern = STATE_CASES[name]
    assert load_training_state(checkpoint)["step"] == 3
    damage(checkpoint)
    with pytest.raises(CheckpointError) as info:
        load_training_state(checkpoint)
    message = str(info.value)
    assert "\n" not in message and str(checkpoint) in message and re.search(pattern, message), message


def test_checkpoint_integrity_checkpoint_records_weights_and_state(checkpoint):
    files = json.loads((checkpoint / CHECKSUMS_NAME).read_text())["files"]
    assert set(files) == {W, TRAINING_STATE_NAME}
