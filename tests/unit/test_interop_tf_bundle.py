"""The TensorFlow checkpoint file format read without TensorFlow (`bertforge.interop.tf_bundle`), alone.

The fixtures in tests/fixtures/google_tf/ were written by real TensorFlow (scripts/write_google_tf_fixtures.py,
see the README there); `expected.npz` holds every variable the script stored, for bitwise comparison.
Corrupt and unusual bundles are made here by damaging copies, or by `write_bundle`, a minimal writer of the
same format, for what TensorFlow would not write (an unknown dtype, a compressed index). Nothing here knows
what the tensors mean: Google's names and layout are tested in test_interop_google_tf.py.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import numpy as np
import pytest

from bertforge.errors import CheckpointError
from bertforge.interop import tf_bundle

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "google_tf"
RELEASE = FIXTURES / "uncased_L-2_H-32_A-4"
RUN = FIXTURES / "pretraining_output"
DTYPES = FIXTURES / "dtypes" / "dtypes.ckpt"
WORD = "bert/embeddings/word_embeddings"
TABLE_MAGIC = 0xDB4775248B80FB57


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


# --- a minimal tensor-bundle writer (the format TensorFlow writes; used only for what TF would not write) ---

def encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def encode_field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, bytes):
        return encode_varint(number << 3 | 2) + encode_varint(len(value)) + value
    return encode_varint(number << 3) + encode_varint(value)


def encode_block(entries: list[tuple[bytes, bytes]], compression: int = 0) -> bytes:
    body = b"".join(encode_varint(0) + encode_varint(len(k)) + encode_varint(len(v)) + k + v for k, v in entries)
    body += (0).to_bytes(4, "little") + (1).to_bytes(4, "little")  # one restart point at 0
    kind = bytes([compression])
    return body + kind + tf_bundle.mask_crc(tf_bundle.crc32c(body + kind)).to_bytes(4, "little")


def write_bundle(prefix: Path, tensors: dict[str, tuple[int, tuple[int, ...], bytes]], compression: int = 0) -> None:
    """Write `PREFIX.index` + one data shard: name -> (DataType enum, shape, raw bytes)."""
    data = bytearray()
    entries = []
    header = encode_field(1, 1) + encode_field(3, encode_field(1, 1))  # num_shards 1, little-endian, version 1
    entries.append((b"", header))
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        shape_proto = b"".join(encode_field(2, encode_field(1, d)) for d in shape)
        crc = tf_bundle.mask_crc(tf_bundle.crc32c(raw))
        proto = (encode_field(1, dtype) + encode_field(2, shape_proto) + encode_field(4, len(data))
                 + encode_field(5, len(raw)) + encode_varint(6 << 3 | 5) + crc.to_bytes(4, "little"))
        entries.append((name.encode(), proto))
        data += raw
    Path(f"{prefix}.data-00000-of-00001").write_bytes(bytes(data))
    block = encode_block(entries, compression)
    meta = encode_block([])
    index = encode_block([(entries[-1][0], encode_varint(0) + encode_varint(len(block) - 5))])
    handles = (encode_varint(len(block)) + encode_varint(len(meta) - 5) + encode_varint(len(block) + len(meta))
               + encode_varint(len(index) - 5))
    footer = handles.ljust(40, b"\0") + TABLE_MAGIC.to_bytes(8, "little")
    Path(f"{prefix}.index").write_bytes(block + meta + index + footer)


def release_tensors() -> dict[str, tuple[int, tuple[int, ...], bytes]]:
    """Every tensor of the fixture release as (DataType enum, shape, raw bytes), to rewrite with changes."""
    bundle = tf_bundle.TensorBundle(RELEASE / "bert_model.ckpt")
    return {name: (entry.dtype, entry.shape, bundle.raw(name)) for name, entry in bundle.entries.items()}


def copied_release(tmp_path: Path) -> tuple[Path, Path, tf_bundle.BundleEntry]:
    """A copy of the release bundle to damage: its prefix, its data shard and the word embeddings' entry."""
    folder = tmp_path / "release"
    shutil.copytree(RELEASE, folder)
    prefix = folder / "bert_model.ckpt"
    return prefix, folder / "bert_model.ckpt.data-00000-of-00001", tf_bundle.TensorBundle(prefix).entries[WORD]


# --- checksums and the protobuf wire format --------------------------------------------------------------

def test_tf_bundle_crc32c_matches_known_vectors_and_the_bytewise_reference():
    assert tf_bundle.crc32c(b"123456789") == 0xE3069283  # the standard CRC-32C check value
    assert tf_bundle.crc32c(b"") == 0
    # RFC 3720 (iSCSI), appendix B.4.
    assert tf_bundle.crc32c(bytes(32)) == 0x8A9136AA
    assert tf_bundle.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert tf_bundle.crc32c(bytes(range(32))) == 0x46DD794E
    assert tf_bundle.crc32c(bytes(range(31, -1, -1))) == 0x113FDB5C
    rng = np.random.default_rng(0)
    for size in (1, 1000, 1024, 1025, 4096 + 7, 70_001, (1 << 20) + 3):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        reference = tf_bundle._crc_update_scalar(0xFFFFFFFF, data) ^ 0xFFFFFFFF
        assert tf_bundle.crc32c(data) == reference, size
        assert tf_bundle.crc32c(data[size // 3:], tf_bundle.crc32c(data[: size // 3])) == reference, size
    assert tf_bundle.crc32c(np.frombuffer(b"123456789", dtype=np.uint8)) == 0xE3069283


def test_tf_bundle_mask_crc_rotates_and_adds_the_delta():
    assert tf_bundle.mask_crc(0) == 0xA282EAD8
    crc = 0x12345678
    rotated = ((crc >> 15) | (crc << 17)) & 0xFFFFFFFF
    assert tf_bundle.mask_crc(crc) == (rotated + 0xA282EAD8) & 0xFFFFFFFF


@pytest.mark.parametrize("value", [0, 1, 127, 128, 150, 300, 2**32 - 1, 2**63 - 1, 2**64 - 1])
def test_tf_bundle_varint_decodes_what_protobuf_encodes(value):
    encoded = encode_varint(value)
    assert tf_bundle._varint(b"\x07" + encoded + b"\x01", 1, "test") == (value, 1 + len(encoded))


def test_tf_bundle_varint_refuses_truncated_and_overlong_input():
    assert tf_bundle._varint(b"\x96\x01", 0, "test") == (150, 2)  # the protobuf documentation's example
    with pytest.raises(ValueError, match="truncated or overlong varint in the header"):
        tf_bundle._varint(b"\x96", 0, "the header")
    with pytest.raises(ValueError, match="overlong"):
        tf_bundle._varint(b"\xff" * 11, 0, "test")


def test_tf_bundle_fields_decode_each_wire_type_and_refuse_truncation():
    message = (encode_field(1, 150) + encode_field(2, b"abc") + encode_varint(3 << 3 | 1) + (7).to_bytes(8, "little")
               + encode_varint(4 << 3 | 5) + (9).to_bytes(4, "little"))
    assert list(tf_bundle._fields(message, "test")) == [(1, 0, 150), (2, 2, b"abc"), (3, 1, 7), (4, 5, 9)]
    with pytest.raises(ValueError, match="truncated protobuf field 2"):
        list(tf_bundle._fields(encode_varint(2 << 3 | 2) + encode_varint(5) + b"ab", "test"))
    with pytest.raises(ValueError, match="wire type 3"):
        list(tf_bundle._fields(encode_varint(1 << 3 | 3), "test"))
    assert tf_bundle._signed64(2**64 - 1) == -1 and tf_bundle._signed64(5) == 5


# --- reading what TensorFlow wrote -----------------------------------------------------------------------

def test_tf_bundle_every_tensor_equals_what_tensorflow_stored(expected):
    release = tf_bundle.TensorBundle(RELEASE / "bert_model.ckpt")
    assert release.num_shards == 1 and not release.big_endian
    assert set(release.entries) == set(stored(expected, 20))
    for prefix, step in ((RELEASE / "bert_model.ckpt", 20), (RUN / "model.ckpt-10", 10), (RUN / "model.ckpt-20", 20)):
        bundle = tf_bundle.TensorBundle(prefix)
        for name, value in stored(expected, step).items():
            assert name in bundle, (prefix, name)
            assert bitwise_equal(bundle.read(name), value), (prefix, name)
    run = tf_bundle.TensorBundle(f"{RUN / 'model.ckpt-10'}{tf_bundle.INDEX_SUFFIX}")  # the .index name works too
    assert run.read("global_step") == 10
    assert run.data_file(0).name == "model.ckpt-10.data-00000-of-00001"


def test_tf_bundle_dtypes_decode_bitwise_and_strings_and_unsupported_types_are_named(expected):
    bundle = tf_bundle.TensorBundle(DTYPES)
    for key, value in expected.items():
        if key.startswith("dtypes/"):
            assert bitwise_equal(bundle.read(key), value), key  # bfloat16 widened exactly to float32
    assert bundle.entries["dtypes/bfloat16"].dtype_name == "bfloat16"
    assert list(bundle.read("dtypes/string")) == [b"bert", b"", b"x" * 200]  # TF's own string checksum
    with pytest.raises(CheckpointError) as error:
        bundle.read("dtypes/complex64")
    assert "dtypes.ckpt.index" in str(error.value) and "'dtypes/complex64'" in str(error.value)
    assert "complex64" in str(error.value)
    with pytest.raises(CheckpointError, match="no tensor 'nope'"):
        bundle.read("nope")


def test_tf_bundle_imports_only_numpy_and_the_standard_library():
    source = Path(tf_bundle.__file__).read_text(encoding="utf-8")
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
    # No TensorFlow, and nothing of bertforge but its errors: the format knows nothing of BERT.
    assert modules <= {"__future__", "functools", "os", "dataclasses", "pathlib", "numpy", "bertforge.errors"}, modules


# --- damage: one clear CheckpointError naming the file and the tensor ------------------------------------

def test_tf_bundle_truncated_shard_names_file_and_tensor(tmp_path):
    prefix, data, _ = copied_release(tmp_path)
    bundle = tf_bundle.TensorBundle(prefix)
    last = max(bundle.entries.values(), key=lambda e: e.offset)
    data.write_bytes(data.read_bytes()[: last.offset + 3])
    with pytest.raises(CheckpointError) as error:
        bundle.read(last.name)
    message = str(error.value)
    assert str(data) in message and repr(last.name) in message and "truncated" in message


def test_tf_bundle_flipped_byte_fails_the_checksum(tmp_path):
    prefix, data, entry = copied_release(tmp_path)
    raw = bytearray(data.read_bytes())
    raw[entry.offset + 101] ^= 0x10
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError) as error:
        tf_bundle.TensorBundle(prefix).read(WORD)
    assert str(data) in str(error.value) and repr(WORD) in str(error.value) and "checksum" in str(error.value)


def test_tf_bundle_missing_shard_names_file_and_tensor(tmp_path):
    prefix, data, _ = copied_release(tmp_path)
    data.unlink()
    with pytest.raises(CheckpointError) as error:
        tf_bundle.TensorBundle(prefix).read(WORD)
    assert str(data) in str(error.value) and "missing shard" in str(error.value) and repr(WORD) in str(error.value)


def test_tf_bundle_missing_index_is_named(tmp_path):
    with pytest.raises(CheckpointError, match=r"nothing\.ckpt\.index: missing"):
        tf_bundle.TensorBundle(tmp_path / "nothing.ckpt")


def test_tf_bundle_unknown_dtype_names_file_and_tensor(tmp_path):
    tensors = release_tensors()
    _, shape, raw = tensors[WORD]
    tensors[WORD] = (99, shape, raw)
    write_bundle(tmp_path / "odd.ckpt", tensors)
    with pytest.raises(CheckpointError) as error:
        tf_bundle.TensorBundle(tmp_path / "odd.ckpt").read(WORD)
    message = str(error.value)
    assert str(tmp_path / "odd.ckpt.index") in message and repr(WORD) in message
    assert "unknown DataType enum 99" in message


def test_tf_bundle_shape_and_size_disagreeing_is_named(tmp_path):
    tensors = release_tensors()
    dtype, shape, raw = tensors[WORD]
    tensors[WORD] = (dtype, (shape[0] - 1, shape[1]), raw)
    write_bundle(tmp_path / "x.ckpt", tensors)
    with pytest.raises(CheckpointError, match=r"'bert/embeddings/word_embeddings' of shape \[98, 32\]"):
        tf_bundle.TensorBundle(tmp_path / "x.ckpt").read(WORD)


def test_tf_bundle_damaged_or_compressed_index_is_refused(tmp_path):
    prefix, _, _ = copied_release(tmp_path)
    index = Path(f"{prefix}{tf_bundle.INDEX_SUFFIX}")
    raw = bytearray(index.read_bytes())
    raw[40] ^= 0x01
    index.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"bert_model\.ckpt\.index: checksum mismatch in the index"):
        tf_bundle.TensorBundle(prefix)
    index.write_bytes(bytes(raw[:-1]))
    with pytest.raises(CheckpointError, match="bad magic number"):
        tf_bundle.TensorBundle(prefix)
    index.write_bytes(bytes(raw[:10]))
    with pytest.raises(CheckpointError, match="shorter than its footer"):
        tf_bundle.TensorBundle(prefix)
    write_bundle(tmp_path / "snappy.ckpt", release_tensors(), compression=1)
    with pytest.raises(CheckpointError, match="snappy-compressed"):
        tf_bundle.TensorBundle(tmp_path / "snappy.ckpt")
