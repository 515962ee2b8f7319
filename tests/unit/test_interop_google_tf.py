"""Google-format TensorFlow 1 BERT checkpoints read without TensorFlow (`bertforge.interop.google_tf`).

The fixtures in tests/fixtures/google_tf/ were written by real TensorFlow (scripts/write_google_tf_fixtures.py,
see the README there); `expected.npz` holds every variable the script stored, for bitwise comparison.
Corrupt and unusual bundles are made here by damaging copies, or by `write_bundle`, a minimal writer of the
same format, for what TensorFlow would not write (an unknown dtype, a compressed index).
"""

from __future__ import annotations

import ast
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge import checkpoint_format
from bertforge.errors import CheckpointError
from bertforge.families import registry
from bertforge.families.classification import BertForSequenceClassification
from bertforge.families.pretraining import BertForPretraining
from bertforge.families.question_answering import BertForQuestionAnswering
from bertforge.interop import google_tf
from bertforge.interop import huggingface as hf
from bertforge.model.bert import BertModel
from bertforge.tokenization.tokenizer import Tokenizer, google_do_lower_case

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "google_tf"
RELEASE = FIXTURES / "uncased_L-2_H-32_A-4"
RUN = FIXTURES / "pretraining_output"
DTYPES = FIXTURES / "dtypes" / "dtypes.ckpt"
WORD = "bert/embeddings/word_embeddings"


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "expected.npz") as data:
        return {k: data[k] for k in data.files}


def stored(expected, step: int = 20) -> dict[str, np.ndarray]:
    """The model variables the fixture script saved at `step` (the release holds step 20's)."""
    prefix = f"step{step}/"
    return {k[len(prefix):]: v for k, v in expected.items() if k.startswith(prefix)}


def bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def copy_dir(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


# --- a minimal tensor-bundle writer (the format TensorFlow writes; used only for what TF would not write) ---

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, bytes):
        return _varint(number << 3 | 2) + _varint(len(value)) + value
    return _varint(number << 3) + _varint(value)


def _block(entries: list[tuple[bytes, bytes]], compression: int = 0) -> bytes:
    body = b"".join(_varint(0) + _varint(len(k)) + _varint(len(v)) + k + v for k, v in entries)
    body += (0).to_bytes(4, "little") + (1).to_bytes(4, "little")  # one restart point at 0
    kind = bytes([compression])
    return body + kind + google_tf.mask_crc(google_tf.crc32c(body + kind)).to_bytes(4, "little")


def write_bundle(prefix: Path, tensors: dict[str, tuple[int, tuple[int, ...], bytes]], compression: int = 0) -> None:
    """Write `PREFIX.index` + one data shard: name -> (DataType enum, shape, raw bytes)."""
    data = bytearray()
    entries = []
    header = _field(1, 1) + _field(3, _field(1, 1))  # num_shards 1, little-endian, version {producer 1}
    entries.append((b"", header))
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        shape_proto = b"".join(_field(2, _field(1, d)) for d in shape)
        crc = google_tf.mask_crc(google_tf.crc32c(raw))
        proto = (_field(1, dtype) + _field(2, shape_proto) + _field(4, len(data)) + _field(5, len(raw))
                 + _varint(6 << 3 | 5) + crc.to_bytes(4, "little"))
        entries.append((name.encode(), proto))
        data += raw
    Path(f"{prefix}.data-00000-of-00001").write_bytes(bytes(data))
    block = _block(entries, compression)
    meta = _block([])
    index = _block([(entries[-1][0], _varint(0) + _varint(len(block) - 5))])
    handles = (_varint(len(block)) + _varint(len(meta) - 5) + _varint(len(block) + len(meta))
               + _varint(len(index) - 5))
    footer = handles.ljust(40, b"\0") + (0xDB4775248B80FB57).to_bytes(8, "little")
    Path(f"{prefix}.index").write_bytes(block + meta + index + footer)


def release_tensors() -> dict[str, tuple[int, tuple[int, ...], bytes]]:
    bundle = google_tf.TensorBundle(RELEASE / "bert_model.ckpt")
    return {name: (entry.dtype, entry.shape, bundle.raw(name)) for name, entry in bundle.entries.items()}


def google_directory(tmp_path: Path, name: str, extra: dict[str, np.ndarray]) -> Path:
    """A release-layout directory holding the fixture's weights plus `extra` float32 tensors."""
    folder = tmp_path / name
    folder.mkdir()
    for file in ("bert_config.json", "vocab.txt"):
        shutil.copy(RELEASE / file, folder / file)
    tensors = release_tensors()
    tensors.update({k: (1, v.shape, v.astype("<f4").tobytes()) for k, v in extra.items()})
    write_bundle(folder / "bert_model.ckpt", tensors)
    return folder


# --- the format ------------------------------------------------------------------------------------------

def test_google_tf_crc32c_matches_known_values_and_the_bytewise_reference():
    assert google_tf.crc32c(b"123456789") == 0xE3069283  # the standard CRC-32C check value
    assert google_tf.crc32c(b"") == 0
    assert google_tf.crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 test vector
    rng = np.random.default_rng(0)
    for size in (1, 1000, 1024, 1025, 4096 + 7, 70_001, (1 << 20) + 3):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        reference = google_tf._crc_update_scalar(0xFFFFFFFF, data) ^ 0xFFFFFFFF
        assert google_tf.crc32c(data) == reference, size
        assert google_tf.crc32c(data[size // 3:], google_tf.crc32c(data[: size // 3])) == reference, size
    assert google_tf.mask_crc(0) == 0xA282EAD8


def test_google_tf_every_tensor_equals_what_tensorflow_stored(expected):
    for prefix, step in ((RELEASE / "bert_model.ckpt", 20), (RUN / "model.ckpt-10", 10), (RUN / "model.ckpt-20", 20)):
        bundle = google_tf.TensorBundle(prefix)
        assert bundle.num_shards == 1 and not bundle.big_endian
        model = {n for n in bundle.entries if not google_tf.is_optimizer_state(n)}
        assert model == set(stored(expected, step)), prefix
        for name in model:
            assert bitwise_equal(bundle.read(name), stored(expected, step)[name]), (prefix, name)
    assert google_tf.TensorBundle(RUN / "model.ckpt-10").read("global_step") == 10


def test_google_tf_dtypes_decode_bitwise_and_strings_and_unsupported_types_are_named(expected):
    bundle = google_tf.TensorBundle(DTYPES)
    for key, value in expected.items():
        if key.startswith("dtypes/"):
            assert bitwise_equal(bundle.read(key), value), key  # bfloat16 widened exactly to float32
    assert bundle.entries["dtypes/bfloat16"].dtype_name == "bfloat16"
    assert list(bundle.read("dtypes/string")) == [b"bert", b"", b"x" * 200]  # TF's own string checksum
    with pytest.raises(CheckpointError) as error:
        bundle.read("dtypes/complex64")
    assert "dtypes.ckpt.index" in str(error.value) and "'dtypes/complex64'" in str(error.value)
    assert "complex64" in str(error.value)


def test_google_tf_reader_imports_no_tensorflow():
    source = Path(google_tf.__file__).read_text(encoding="utf-8")
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module.split(".")[0])
    assert modules <= {"__future__", "functools", "logging", "os", "re", "dataclasses", "pathlib", "numpy",
                       "bertforge"}, modules


# --- names -----------------------------------------------------------------------------------------------

HEAD_NAMES = ("output_weights", "output_bias", "cls/squad/output_weights", "cls/squad/output_bias")


def our_names(tiny_config) -> set[str]:
    """Every parameter name of the pretraining model, the classifier and the QA model (encoder under bert.)."""
    names = set(BertForPretraining(tiny_config).state_dict())
    for cls in (BertForSequenceClassification, BertForQuestionAnswering):
        names |= {k for k in cls(tiny_config).state_dict() if not k.startswith("bert.")}
    return names


def test_google_tf_key_table_is_bijective_and_complete(tiny_config, expected):
    google_names = set(stored(expected)) | set(HEAD_NAMES)
    ours = {}
    for name in google_names:
        found = google_tf.from_google_key(name)
        assert found is not None, name
        assert google_tf.to_google_key(found[0]) == name
        ours[name] = found[0]
    assert len(set(ours.values())) == len(ours), "two Google names map to one parameter"
    # Complete: every parameter of our models (the tied MLM decoder has none of its own) has a Google name.
    assert set(ours.values()) == our_names(tiny_config)
    for name in our_names(tiny_config):
        assert google_tf.from_google_key(google_tf.to_google_key(name))[0] == name
    # And each has a Hugging Face name, the form checkpoint_format reads.
    assert all(hf.from_hf_key(hf.to_hf_key(n)) == n for n in ours.values())
    assert google_tf.from_google_key("bert/encoder/layer_11/output/LayerNorm/gamma") == (
        "bert.encoder.layers.11.feed_forward.norm.weight", False)
    assert google_tf.from_google_key("bert/encoder/layer_0/attention/self/query/kernel/adam_m") is None
    with pytest.raises(KeyError):
        google_tf.to_google_key("bert.embeddings.nope.weight")


def test_google_tf_kernels_are_transposed_and_output_weights_are_not(expected):
    values = stored(expected)
    tensors = google_tf.read_google_weights(RELEASE / "bert_model.ckpt").tensors
    up = tensors["bert.encoder.layers.1.feed_forward.up.weight"]
    assert up.shape == (37, 32) and bitwise_equal(up, values["bert/encoder/layer_1/intermediate/dense/kernel"].T.copy())
    assert bitwise_equal(tensors["bert.encoder.layers.0.attention.query.weight"],
                         values["bert/encoder/layer_0/attention/self/query/kernel"].T.copy())
    assert bitwise_equal(tensors["mlm.transform.weight"], values["cls/predictions/transform/dense/kernel"].T.copy())
    assert tensors["nsp.weight"].shape == (2, 32)
    assert bitwise_equal(tensors["nsp.weight"], values["cls/seq_relationship/output_weights"])
    assert bitwise_equal(tensors["mlm.bias"], values["cls/predictions/output_bias"])
    assert bitwise_equal(tensors["bert.embeddings.norm.weight"], values["bert/embeddings/LayerNorm/gamma"])


def test_google_tf_optimizer_slots_are_skipped_and_counted():
    run = google_tf.read_google_weights(RUN / "model.ckpt-20")
    model_variables = 46
    assert len(run.tensors) == model_variables and not run.unknown
    assert len(run.optimizer) == 2 * model_variables + 1
    assert {n.rsplit("/", 1)[-1] for n in run.optimizer} == {"adam_m", "adam_v", "global_step"}
    assert not any(google_tf.is_optimizer_state(n) for n in google_tf.read_google_weights(
        RELEASE / "bert_model.ckpt").tensors)
    _, report = checkpoint_format.load_model(RUN, BertForPretraining)
    assert sorted(report.skipped) == sorted(run.optimizer)
    _, report = checkpoint_format.load_model(RELEASE, BertForPretraining)
    assert report.skipped == []
    for name in ("bad_steps", "good_steps", "loss_scale", "current_loss_scale", "beta1_power", "x/Adam_1"):
        assert google_tf.is_optimizer_state(name)


# --- directories and models ------------------------------------------------------------------------------

@pytest.mark.parametrize("folder", [RELEASE, RUN], ids=["release", "pretraining_output"])
@pytest.mark.parametrize("cls", [BertModel, BertForPretraining, BertForSequenceClassification])
def test_google_tf_models_load_both_directories(folder, cls, expected):
    values = stored(expected)
    model = cls.from_pretrained(folder)
    state = {k: v for k, v in model.state_dict().items()}
    prefix = cls.encoder_prefix
    word = state[f"{prefix}embeddings.word.weight"]
    assert torch.equal(word, torch.from_numpy(values[WORD]))
    if f"{prefix}encoder.layers.1.feed_forward.down.weight" in state:
        assert torch.equal(state[f"{prefix}encoder.layers.1.feed_forward.down.weight"],
                           torch.from_numpy(values["bert/encoder/layer_1/output/dense/kernel"].T.copy()))
    _, report = checkpoint_format.load_model(folder, cls)
    if cls is BertForSequenceClassification:
        assert report.fresh_in(("classifier.",)) == ["classifier.bias", "classifier.weight"]
    else:
        assert report.fresh == []
    if cls is BertForPretraining:
        assert torch.equal(model.mlm.bias, torch.from_numpy(values["cls/predictions/output_bias"]))
        assert torch.equal(model.nsp.weight, torch.from_numpy(values["cls/seq_relationship/output_weights"]))
    config, architecture = checkpoint_format.read_config(folder)
    assert (config.vocab_size, config.hidden_size, config.intermediate_size) == (99, 32, 37)
    assert architecture == "BertForPretraining"


def test_google_tf_outputs_equal_transformers(expected):
    transformers = pytest.importorskip("transformers")
    config, _ = checkpoint_format.read_config(RELEASE)
    theirs = transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12)).eval()
    # Their model built from the same stored tensors, named by hand-independent route: Google -> ours -> theirs.
    tensors = {hf.to_hf_key(k): torch.from_numpy(v)
               for k, v in google_tf.read_google_weights(RELEASE / "bert_model.ckpt").tensors.items()}
    result = theirs.load_state_dict(tensors, strict=False)
    assert not result.unexpected_keys
    assert all(hf.is_redundant_hf_key(k) for k in result.missing_keys), result.missing_keys
    theirs.tie_weights()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 99, (3, 17), generator=generator)
    types = (torch.arange(17) >= 9).long().expand(3, -1)
    mask = torch.ones(3, 17, dtype=torch.long)
    mask[1, 12:] = 0
    mask[2, 5:] = 0
    with torch.no_grad():
        reference = theirs(input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True)
        for fast_path in (False, True):
            encoder = BertModel.from_pretrained(RELEASE, fast_path=fast_path)
            ours = BertForPretraining.from_pretrained(RUN, fast_path=fast_path)  # step 20 = the release's weights
            hidden = encoder(ids, types, mask).last_hidden_state
            out = ours(ids, types, mask)
            real = mask.bool()
            torch.testing.assert_close(hidden[real], reference.hidden_states[-1][real], rtol=0, atol=1e-5)
            torch.testing.assert_close(out.mlm_logits[real], reference.prediction_logits[real], rtol=0, atol=1e-5)
            torch.testing.assert_close(out.nsp_logits, reference.seq_relationship_logits, rtol=0, atol=1e-5)


def test_google_tf_checkpoint_file_picks_the_latest_and_step_picks_another(tmp_path, expected):
    assert google_tf.available_steps(RUN) == [10, 20]
    assert checkpoint_format.weights_file(RUN).name == "model.ckpt-20.index"
    model = BertModel.from_pretrained(RUN, step=10)
    assert torch.equal(model.embeddings.word.weight, torch.from_numpy(stored(expected, 10)[WORD]))
    assert torch.equal(BertModel.from_pretrained(RUN).embeddings.word.weight,
                       torch.from_numpy(stored(expected, 20)[WORD]))
    with pytest.raises(CheckpointError, match=r"step 30.*\[10, 20\]"):
        BertModel.from_pretrained(RUN, step=30)
    # The checkpoint file as a TPU run writes it: absolute gs:// paths of another machine.
    run = copy_dir(RUN, tmp_path / "run")
    (run / "checkpoint").write_text('model_checkpoint_path: "gs://bucket/run/model.ckpt-10"\n'
                                    'all_model_checkpoint_paths: "gs://bucket/run/model.ckpt-10"\n')
    assert checkpoint_format.weights_file(run).name == "model.ckpt-10.index"
    (run / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-99"\n')
    with pytest.raises(CheckpointError, match=r"model\.ckpt-99"):
        checkpoint_format.weights_file(run)
    (run / "checkpoint").unlink()  # no checkpoint file: the highest step
    assert checkpoint_format.weights_file(run).name == "model.ckpt-20.index"
    (run / "bert_config.json").unlink()
    with pytest.raises(CheckpointError, match="bert_config.json.*--bert_config_file"):
        BertModel.from_pretrained(run)


def test_google_tf_release_directory_reads_as_one_model_directory():
    directory = checkpoint_format.read_directory(RELEASE)
    assert directory.architecture == "BertForPretraining"
    assert directory.tokenizer is not None and directory.tokenizer.vocab_size == 99
    assert directory.tokenizer.model_max_length == 64  # from bert_config.json
    assert directory.finetuning is None
    assert directory.tokenizer.vocab[directory.tokenizer.config.mask_token] == 4
    model, report = registry.load_model(RUN)  # the class from the heads the checkpoint holds
    assert isinstance(model, BertForPretraining) and report.source.endswith("model.ckpt-20.index")


def test_google_tf_fine_tuned_heads_load_untransposed(tmp_path):
    rng = np.random.default_rng(1)
    classifier = rng.normal(size=(3, 32)).astype(np.float32)
    folder = google_directory(tmp_path, "mnli_output", {"output_weights": classifier,
                                                        "output_bias": np.arange(3, dtype=np.float32)})
    config, architecture = checkpoint_format.read_config(folder)
    assert architecture == "BertForSequenceClassification" and config.num_labels == 3
    model = BertForSequenceClassification.from_pretrained(folder)
    assert torch.equal(model.classifier.weight, torch.from_numpy(classifier))
    assert torch.equal(model.classifier.bias, torch.arange(3, dtype=torch.float32))
    squad = rng.normal(size=(2, 32)).astype(np.float32)
    folder = google_directory(tmp_path, "squad_output", {"cls/squad/output_weights": squad,
                                                         "cls/squad/output_bias": np.ones(2, np.float32)})
    assert checkpoint_format.read_config(folder)[1] == "BertForQuestionAnswering"
    model, report = checkpoint_format.load_model(folder, BertForQuestionAnswering)
    assert torch.equal(model.qa_outputs.weight, torch.from_numpy(squad)) and report.fresh == []


# --- damage: one clear CheckpointError naming the file and the tensor ------------------------------------

def damaged_release(tmp_path: Path) -> tuple[Path, Path, google_tf.BundleEntry]:
    folder = copy_dir(RELEASE, tmp_path / "uncased_L-2_H-32_A-4")
    data = folder / "bert_model.ckpt.data-00000-of-00001"
    return folder, data, google_tf.TensorBundle(folder / "bert_model.ckpt").entries[WORD]


def test_google_tf_truncated_shard_names_file_and_tensor(tmp_path):
    folder, data, _ = damaged_release(tmp_path)
    entries = google_tf.TensorBundle(folder / "bert_model.ckpt").entries
    last = max(entries.values(), key=lambda e: e.offset)
    data.write_bytes(data.read_bytes()[: last.offset + 3])
    with pytest.raises(CheckpointError) as error:
        BertModel.from_pretrained(folder)
    message = str(error.value)
    assert str(data) in message and repr(last.name) in message and "truncated" in message


def test_google_tf_flipped_byte_fails_the_checksum(tmp_path):
    folder, data, entry = damaged_release(tmp_path)
    raw = bytearray(data.read_bytes())
    raw[entry.offset + 101] ^= 0x10
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError) as error:
        BertForPretraining.from_pretrained(folder)
    assert str(data) in str(error.value) and repr(WORD) in str(error.value) and "checksum" in str(error.value)


def test_google_tf_missing_shard_names_file_and_tensor(tmp_path):
    folder, data, _ = damaged_release(tmp_path)
    data.unlink()
    with pytest.raises(CheckpointError) as error:
        BertModel.from_pretrained(folder)
    assert str(data) in str(error.value) and "missing shard" in str(error.value) and "tensor 'bert/" in str(error.value)


def test_google_tf_unknown_dtype_names_file_and_tensor(tmp_path):
    tensors = release_tensors()
    dtype, shape, raw = tensors[WORD]
    tensors[WORD] = (99, shape, raw)
    folder = tmp_path / "odd"
    copy_dir(RELEASE, folder)
    write_bundle(folder / "bert_model.ckpt", tensors)
    with pytest.raises(CheckpointError) as error:
        BertModel.from_pretrained(folder)
    message = str(error.value)
    assert str(folder / "bert_model.ckpt.index") in message and repr(WORD) in message
    assert "unknown DataType enum 99" in message


def test_google_tf_shape_and_size_disagreeing_is_named(tmp_path):
    tensors = release_tensors()
    dtype, shape, raw = tensors[WORD]
    tensors[WORD] = (dtype, (shape[0] - 1, shape[1]), raw)
    write_bundle(tmp_path / "x.ckpt", tensors)
    with pytest.raises(CheckpointError, match=r"'bert/embeddings/word_embeddings' of shape \[98, 32\]"):
        google_tf.TensorBundle(tmp_path / "x.ckpt").read(WORD)


def test_google_tf_damaged_or_compressed_index_is_refused(tmp_path):
    folder, _, _ = damaged_release(tmp_path)
    index = folder / "bert_model.ckpt.index"
    raw = bytearray(index.read_bytes())
    raw[40] ^= 0x01
    index.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"bert_model\.ckpt\.index: checksum mismatch in the index"):
        BertModel.from_pretrained(folder)
    index.write_bytes(bytes(raw[:-1]))
    with pytest.raises(CheckpointError, match="bad magic number"):
        BertModel.from_pretrained(folder)
    write_bundle(tmp_path / "snappy.ckpt", release_tensors(), compression=1)
    with pytest.raises(CheckpointError, match="snappy-compressed"):
        google_tf.TensorBundle(tmp_path / "snappy.ckpt")


# --- casing ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "lower"), [
    ("uncased_L-12_H-768_A-12", True), ("cased_L-24_H-1024_A-16", False), ("multi_cased_L-12_H-768_A-12", False),
    ("multilingual_L-12_H-768_A-12", True), ("chinese_L-12_H-768_A-12", True), ("multi_uncased_L-12", True),
    ("wwm_cased_L-24_H-1024_A-16", False), ("wwm_uncased_L-24_H-1024_A-16", True), ("my_bert", None),
])
def test_google_tf_casing_rule_by_model_name(name, lower):
    assert google_do_lower_case(name) is lower


def test_google_tf_casing_follows_the_directory_name_and_can_be_overridden(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="bertforge.tokenization.tokenizer")
    assert Tokenizer.from_pretrained(RELEASE).config.do_lower_case is True
    assert "do_lower_case=True" in caplog.text and "uncased_L-2_H-32_A-4" in caplog.text
    assert Tokenizer.from_pretrained(RELEASE).tokenize("The") == ["the"]
    cased = tmp_path / "cased_L-2_H-32_A-4"
    cased.mkdir()
    for file in ("bert_config.json", "vocab.txt"):
        shutil.copy(RELEASE / file, cased / file)
    assert Tokenizer.from_pretrained(cased).config.do_lower_case is False
    assert Tokenizer.from_pretrained(cased).tokenize("The") == ["[UNK]"]
    assert checkpoint_format.load_tokenizer(cased).config.do_lower_case is False
    unnamed = tmp_path / "my_bert"
    shutil.copytree(cased, unnamed)
    assert Tokenizer.from_pretrained(unnamed).config.do_lower_case is True  # the default
    assert Tokenizer.from_pretrained(RELEASE, do_lower_case=False).config.do_lower_case is False
    assert Tokenizer.from_pretrained(cased, do_lower_case=True).config.do_lower_case is True
    assert checkpoint_format.read_directory(RELEASE, do_lower_case=False).tokenizer.config.do_lower_case is False
    # Our own directories keep their recorded casing unless overridden.
    ours = tmp_path / "ours"
    Tokenizer.from_pretrained(cased).save_pretrained(ours)
    assert Tokenizer.from_pretrained(ours).config.do_lower_case is False
    assert Tokenizer.from_pretrained(ours, do_lower_case=True).config.do_lower_case is True
