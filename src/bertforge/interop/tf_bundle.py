"""The TensorFlow checkpoint file format (a *tensor bundle*), read with numpy and the standard library.

A checkpoint `PREFIX` is `PREFIX.index`, an SSTable (LevelDB's table format) whose values are
`BundleEntryProto` messages (dtype, shape, shard, offset, size, masked crc32c of the bytes) plus a
`BundleHeaderProto` under the empty key, and `PREFIX.data-NNNNN-of-NNNNN` shards holding the raw tensor bytes.
`TensorBundle` reads the index once and each tensor on demand, verifying its checksum.

This module owns the format only: crc32c, the protobuf wire format of the few messages involved, SSTable
blocks, and tensor decoding. It knows nothing of what the tensors mean or how they are named
(`interop.google_tf` maps Google's BERT variables to ours).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertforge.errors import CheckpointError

INDEX_SUFFIX = ".index"

# --- crc32c (Castagnoli), as TF's tensorflow/core/lib/hash/crc32c ----------------------------------------

_POLY = 0x82F63B78  # reflected Castagnoli polynomial
_MASK_DELTA = 0xA282EAD8


def _make_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(_POLY), table >> 1).astype(np.uint32)
    return table


_TABLE = _make_table()
_TABLE_LIST = [int(v) for v in _TABLE]


def _crc_update_scalar(crc: int, data: bytes | memoryview) -> int:
    table = _TABLE_LIST
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc


def _apply_scalar(columns: list[int], state: int) -> int:
    """Apply a GF(2) linear map on 32-bit states, given as the images of the 32 unit vectors."""
    out = 0
    bit = 0
    while state:
        if state & 1:
            out ^= columns[bit]
        state >>= 1
        bit += 1
    return out


@functools.lru_cache(maxsize=64)
def _zero_tables(nbytes: int) -> np.ndarray:
    """The map 'advance a raw crc state over `nbytes` zero bytes', as four 256-entry tables (one per byte of
    the state): a CRC is linear over GF(2), so crc(A + B) = advance(crc(A), len(B)) ^ crc_raw(B)."""
    one = [_crc_update_scalar(1 << bit, b"\0") for bit in range(32)]
    result, power, n = [1 << bit for bit in range(32)], one, nbytes
    while n:  # square and multiply
        if n & 1:
            result = [_apply_scalar(power, c) for c in result]
        power = [_apply_scalar(power, c) for c in power]
        n >>= 1
    tables = np.zeros((4, 256), dtype=np.uint32)
    for lane in range(4):
        for value in range(256):
            acc = 0
            for bit in range(8):
                if value >> bit & 1:
                    acc ^= result[lane * 8 + bit]
            tables[lane, value] = acc
    return tables


def _advance(tables: np.ndarray, states: np.ndarray) -> np.ndarray:
    return (tables[0][states & 0xFF] ^ tables[1][(states >> 8) & 0xFF]
            ^ tables[2][(states >> 16) & 0xFF] ^ tables[3][states >> 24])


def crc32c(data: bytes | bytearray | memoryview | np.ndarray, crc: int = 0) -> int:
    """CRC-32C of `data` (continuing from a previous `crc`), table-driven and vectorised with numpy.

    Inputs of a kilobyte or more are cut into lanes of a fixed length whose raw CRCs are computed side by
    side, one byte column at a time, then combined pairwise (left advanced over the right's bytes, xor the
    right); the last partial lane goes byte by byte.
    """
    if isinstance(data, np.ndarray):
        buffer = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    else:
        buffer = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    state = (crc ^ 0xFFFFFFFF) & 0xFFFFFFFF
    n = buffer.size
    if n >= 1024:
        length = 64 if n < (1 << 20) else 1024
        lanes = n // length
        body = np.ascontiguousarray(buffer[: lanes * length].reshape(lanes, length).T)  # [length, lanes]
        states = np.zeros(lanes, dtype=np.uint32)
        states[0] = state
        for column in body:
            states = _TABLE[(states ^ column) & 0xFF] ^ (states >> 8)
        span = length
        while states.size > 1:
            if states.size % 2:  # a zero state on the left changes nothing and pairs the rest up
                states = np.concatenate([np.zeros(1, dtype=np.uint32), states])
            states = _advance(_zero_tables(span), states[0::2]) ^ states[1::2]
            span *= 2
        state = int(states[0])
        buffer = buffer[lanes * length:]
    return _crc_update_scalar(state, buffer.tobytes()) ^ 0xFFFFFFFF


def mask_crc(crc: int) -> int:
    """TF's (and LevelDB's) stored form of a crc: rotated right by 15 bits plus a constant."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


# --- protobuf wire format (the few fields needed) --------------------------------------------------------

def _varint(buf: bytes, pos: int, what: str) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError(f"truncated or overlong varint in {what}")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes, what: str):
    """(field number, wire type, value) of a message; length-delimited values are bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos, what)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, what)
        elif wire == 1:
            value, pos = int.from_bytes(buf[pos:pos + 8], "little"), pos + 8
        elif wire == 5:
            value, pos = int.from_bytes(buf[pos:pos + 4], "little"), pos + 4
        elif wire == 2:
            size, pos = _varint(buf, pos, what)
            value, pos = buf[pos:pos + size], pos + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} in {what}")
        if pos > len(buf):
            raise ValueError(f"truncated protobuf field {number} in {what}")
        yield number, wire, value


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


# DataType enum of tensorflow/core/framework/types.proto -> (name, numpy dtype or None when not numeric).
DTYPES: dict[int, tuple[str, str | None]] = {
    1: ("float32", "<f4"), 2: ("float64", "<f8"), 3: ("int32", "<i4"), 4: ("uint8", "u1"), 5: ("int16", "<i2"),
    6: ("int8", "i1"), 7: ("string", None), 8: ("complex64", None), 9: ("int64", "<i8"), 10: ("bool", "?"),
    14: ("bfloat16", "<u2"), 17: ("uint16", "<u2"), 18: ("complex128", None), 19: ("float16", "<f2"),
    20: ("resource", None), 21: ("variant", None), 22: ("uint32", "<u4"), 23: ("uint64", "<u8"),
}
STRING = 7
BFLOAT16 = 14


@dataclass(frozen=True)
class BundleEntry:
    """One tensor's place in a bundle (a decoded `BundleEntryProto`)."""

    name: str
    dtype: int
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: int | None
    sliced: bool = False

    @property
    def dtype_name(self) -> str:
        return DTYPES.get(self.dtype, (f"unknown DataType enum {self.dtype}", None))[0]


def _shape(buf: bytes, what: str) -> tuple[int, ...]:
    dims: list[int] = []
    for number, _, value in _fields(buf, what):
        if number == 2:  # repeated Dim {int64 size = 1; string name = 2}
            size = 0
            for sub, _, v in _fields(value, what):
                if sub == 1:
                    size = _signed64(v)
            dims.append(size)
        elif number == 3 and value:
            raise ValueError(f"unknown rank in {what}")
    return tuple(dims)


def _entry(name: str, buf: bytes, what: str) -> BundleEntry:
    values = {"dtype": 0, "shape": (), "shard_id": 0, "offset": 0, "size": 0, "crc32c": None, "sliced": False}
    for number, _, value in _fields(buf, what):
        if number == 1:
            values["dtype"] = value
        elif number == 2:
            values["shape"] = _shape(value, what)
        elif number == 3:
            values["shard_id"] = value
        elif number == 4:
            values["offset"] = _signed64(value)
        elif number == 5:
            values["size"] = _signed64(value)
        elif number == 6:
            values["crc32c"] = value
        elif number == 7:
            values["sliced"] = True
    return BundleEntry(name, **values)


# --- the SSTable of the .index file ----------------------------------------------------------------------

_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_SIZE = 48
_BLOCK_TRAILER = 5


def _block(data: bytes, offset: int, size: int, file: Path, what: str) -> bytes:
    end = offset + size + _BLOCK_TRAILER
    if offset < 0 or end > len(data):
        raise CheckpointError(f"{file}: truncated index ({what} at bytes {offset}..{end} of {len(data)}); "
                              "re-download or re-copy the checkpoint")
    contents, kind = data[offset:offset + size], data[offset + size]
    stored = int.from_bytes(data[offset + size + 1:end], "little")
    if mask_crc(crc32c(data[offset:offset + size + 1])) != stored:
        raise CheckpointError(f"{file}: checksum mismatch in the index ({what}); the file is corrupt — "
                              "re-download or re-copy the checkpoint")
    if kind != 0:
        name = {1: "snappy", 2: "zstd"}.get(kind, f"type {kind}")
        raise CheckpointError(f"{file}: {what} is {name}-compressed; TensorFlow writes bundle indexes "
                              "uncompressed and bertforge reads only those")
    return contents


def _block_entries(block: bytes, file: Path, what: str) -> list[tuple[bytes, bytes]]:
    """Key/value pairs of one block (prefix-compressed keys; the restart array at its end)."""
    if len(block) < 4:
        raise CheckpointError(f"{file}: malformed index {what} (too short)")
    restarts = int.from_bytes(block[-4:], "little")
    limit = len(block) - 4 - 4 * restarts
    if limit < 0:
        raise CheckpointError(f"{file}: malformed index {what} ({restarts} restart points do not fit)")
    entries: list[tuple[bytes, bytes]] = []
    key = b""
    pos = 0
    try:
        while pos < limit:
            shared, pos = _varint(block, pos, what)
            unshared, pos = _varint(block, pos, what)
            length, pos = _varint(block, pos, what)
            if shared > len(key) or pos + unshared + length > limit:
                raise ValueError("entry runs past the block")
            key = key[:shared] + block[pos:pos + unshared]
            pos += unshared
            entries.append((key, block[pos:pos + length]))
            pos += length
    except ValueError as exc:
        raise CheckpointError(f"{file}: malformed index {what} ({exc})") from None
    return entries


def _handle(buf: bytes, pos: int, what: str) -> tuple[int, int, int]:
    offset, pos = _varint(buf, pos, what)
    size, pos = _varint(buf, pos, what)
    return offset, size, pos


def read_index(file: Path) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of an SSTable file, in key order."""
    try:
        data = Path(file).read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{file}: cannot read the checkpoint index ({exc.strerror or exc})") from None
    if len(data) < _FOOTER_SIZE:
        raise CheckpointError(f"{file}: truncated index ({len(data)} bytes, shorter than its footer)")
    footer = data[-_FOOTER_SIZE:]
    if int.from_bytes(footer[-8:], "little") != _TABLE_MAGIC:
        raise CheckpointError(f"{file}: not a TensorFlow checkpoint index (bad magic number); a TF 1 checkpoint "
                              "is PREFIX.index + PREFIX.data-NNNNN-of-NNNNN")
    try:
        _, _, pos = _handle(footer, 0, "footer")  # metaindex (empty in TF bundles)
        index_offset, index_size, _ = _handle(footer, pos, "footer")
    except ValueError as exc:
        raise CheckpointError(f"{file}: malformed index footer ({exc})") from None
    entries: list[tuple[bytes, bytes]] = []
    for number, (_, handle) in enumerate(_block_entries(_block(data, index_offset, index_size, file, "index block"),
                                                        file, "index block")):
        try:
            offset, size, _ = _handle(handle, 0, "block handle")
        except ValueError as exc:
            raise CheckpointError(f"{file}: malformed block handle ({exc})") from None
        what = f"data block {number}"
        entries.extend(_block_entries(_block(data, offset, size, file, what), file, what))
    return entries


# --- the bundle ------------------------------------------------------------------------------------------

def data_file(prefix: str | os.PathLike, shard: int, num_shards: int) -> Path:
    return Path(f"{os.fspath(prefix)}.data-{shard:05d}-of-{num_shards:05d}")


class TensorBundle:
    """A TF tensor bundle `PREFIX.index` + `PREFIX.data-*`: entries read once, tensors on demand."""

    def __init__(self, prefix: str | os.PathLike):
        self.prefix = Path(os.fspath(prefix).removesuffix(INDEX_SUFFIX))
        self.index_file = Path(f"{self.prefix}{INDEX_SUFFIX}")
        if not self.index_file.is_file():
            raise CheckpointError(f"{self.index_file}: missing; a TF checkpoint PREFIX needs PREFIX.index and "
                                  "its PREFIX.data-NNNNN-of-NNNNN shards")
        self.num_shards = 1
        self.big_endian = False
        self.entries: dict[str, BundleEntry] = {}
        for key, value in read_index(self.index_file):
            name = key.decode("utf-8", errors="replace")
            what = f"{self.index_file} entry {name!r}"
            try:
                if not key:
                    for number, _, v in _fields(value, what):
                        if number == 1:
                            self.num_shards = v
                        elif number == 2:
                            self.big_endian = v == 1
                    continue
                self.entries[name] = _entry(name, value, what)
            except ValueError as exc:
                raise CheckpointError(f"{self.index_file}: malformed entry for tensor {name!r} ({exc})") from None
        self._shards: dict[int, bytes] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def data_file(self, shard: int) -> Path:
        return data_file(self.prefix, shard, self.num_shards)

    def _shard(self, shard: int, name: str) -> bytes:
        if shard not in self._shards:
            file = self.data_file(shard)
            if not 0 <= shard < self.num_shards:
                raise CheckpointError(f"{self.index_file}: tensor {name!r} names shard {shard}, but the bundle has "
                                      f"{self.num_shards}")
            try:
                self._shards[shard] = file.read_bytes()
            except FileNotFoundError:
                raise CheckpointError(f"{file}: missing shard (needed for tensor {name!r}); copy every "
                                      f"{self.prefix.name}.data-*-of-{self.num_shards:05d} file next to "
                                      f"{self.index_file.name}") from None
            except OSError as exc:
                raise CheckpointError(f"{file}: cannot read shard for tensor {name!r} ({exc})") from None
        return self._shards[shard]

    def raw(self, name: str) -> bytes:
        """The checksummed bytes of one tensor."""
        entry = self.entries[name]
        if entry.sliced:
            raise CheckpointError(f"{self.index_file}: tensor {name!r} is saved in slices (a partitioned "
                                  "variable); bertforge reads whole tensors only")
        shard = self._shard(entry.shard_id, name)
        file = self.data_file(entry.shard_id)
        end = entry.offset + entry.size
        if entry.offset < 0 or end > len(shard):
            raise CheckpointError(f"{file}: truncated shard: tensor {name!r} needs bytes {entry.offset}..{end}, "
                                  f"the file has {len(shard)}; re-download or re-copy the checkpoint")
        raw = shard[entry.offset:end]
        if entry.dtype != STRING and entry.crc32c is not None and mask_crc(crc32c(raw)) != entry.crc32c:
            raise CheckpointError(f"{file}: checksum mismatch for tensor {name!r} (bytes {entry.offset}..{end}); "
                                  "the file is corrupt — re-download or re-copy the checkpoint")
        return raw

    def read(self, name: str) -> np.ndarray:
        """One tensor as a writable numpy array (bfloat16 widened exactly to float32; strings as an
        object array of bytes)."""
        if name not in self.entries:
            raise CheckpointError(f"{self.index_file}: no tensor {name!r} in this checkpoint")
        entry = self.entries[name]
        if entry.dtype not in DTYPES or (DTYPES[entry.dtype][1] is None and entry.dtype != STRING):
            raise CheckpointError(f"{self.index_file}: tensor {name!r} has dtype {entry.dtype_name}, which "
                                  "bertforge does not read (float16/32/64, bfloat16, integers, bool, string)")
        raw = self.raw(name)
        count = int(np.prod(entry.shape, dtype=np.int64))
        if entry.dtype == STRING:
            return self._strings(entry, raw, count)
        dtype = np.dtype(DTYPES[entry.dtype][1])
        if self.big_endian:
            dtype = dtype.newbyteorder(">")
        if count * dtype.itemsize != len(raw):
            raise CheckpointError(f"{self.data_file(entry.shard_id)}: tensor {name!r} of shape {list(entry.shape)} "
                                  f"and dtype {entry.dtype_name} needs {count * dtype.itemsize} bytes, the index "
                                  f"records {len(raw)}; the checkpoint is corrupt")
        array = np.frombuffer(raw, dtype=dtype).reshape(entry.shape)
        if entry.dtype == BFLOAT16:
            return (array.astype(np.uint32) << 16).view(np.float32)
        return array.astype(dtype.newbyteorder("="), copy=True)

    def _strings(self, entry: BundleEntry, raw: bytes, count: int) -> np.ndarray:
        # On disk: a varint64 length per element, a 4-byte masked crc of the lengths, then the bytes. The
        # entry's crc covers the lengths as little-endian uint32 (uint64 beyond 4 GiB), not as varints, then
        # the 4 checksum bytes and the string bytes (TF's WriteStringTensor).
        what = f"string tensor {entry.name!r}"
        file = self.data_file(entry.shard_id)
        try:
            lengths, pos = [], 0
            for _ in range(count):
                length, pos = _varint(raw, pos, what)
                lengths.append(length)
            checked = b"".join(n.to_bytes(4 if n <= 0xFFFFFFFF else 8, "little") for n in lengths)
            crc = crc32c(checked)
            stored = raw[pos:pos + 4]
            if len(stored) < 4 or int.from_bytes(stored, "little") != mask_crc(crc):
                raise _Checksum
            crc = crc32c(stored, crc)
            pos += 4
            out = np.empty(count, dtype=object)
            for i, length in enumerate(lengths):
                if pos + length > len(raw):
                    raise ValueError("elements run past the recorded size")
                out[i] = raw[pos:pos + length]
                crc = crc32c(out[i], crc)
                pos += length
            if entry.crc32c is not None and mask_crc(crc) != entry.crc32c:
                raise _Checksum
        except ValueError as exc:
            raise CheckpointError(f"{file}: malformed {what} ({exc})") from None
        except _Checksum:
            raise CheckpointError(f"{file}: checksum mismatch for {what}; the file is corrupt — re-download or "
                                  "re-copy the checkpoint") from None
        return out.reshape(entry.shape)


class _Checksum(Exception):
    """A string tensor's checksum failed: raised inside `_strings` so that both of its checks end in one message."""
