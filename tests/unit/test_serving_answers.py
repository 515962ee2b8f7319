"""The bytes of the server's answers (`serving.answers`): float arrays as the shortest decimal of their float32
value, read back exactly, in blocks that give the interpreter's lock back, within the bytes counted for them."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("orjson")
pytest.importorskip("fastapi")

from bertforge.serving import answers  # noqa: E402
from bertforge.serving.answers import BLOCK, NUMBER_BYTES, SPARSE_TERM_BYTES, Floats, SparseTerms, encode  # noqa: E402


def float32_bits(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).astype(np.float32).view(np.uint32)


@pytest.mark.parametrize("shape", [(0,), (5,), (3, 4), (2, BLOCK + 5), (2 * BLOCK + 3,), (2, 3, BLOCK // 2 + 1),
                                   (2, 0), (1, 2 * BLOCK + 1)])
def test_answers_floats_read_back_as_the_same_float32_values_in_any_shape(shape):
    array = (np.random.default_rng(0).standard_normal(shape) * 0.3).astype(np.float32)
    text = encode({"vectors": Floats(array)})
    back = json.loads(text)["vectors"]
    assert np.asarray(back).shape == shape
    assert np.array_equal(float32_bits(back), array.view(np.uint32))
    assert len(text) <= array.size * NUMBER_BYTES + 64 + 2 * np.prod(shape[:-1] or (1,))


def test_answers_floats_of_python_lists_are_written_short():
    # what a pipeline decodes: float32 values as Python floats, whose float64 decimal is 17 digits
    values = np.float32([0.1, -1.5e-5, 3e38, 1e-45, 0.0]).tolist()
    assert encode(Floats([values, values])) == b"[[0.1,-0.000015,3e+38,1e-45,0.0],[0.1,-0.000015,3e+38,1e-45,0.0]]"


def test_answers_every_finite_float32_takes_at_most_the_bytes_counted_for_it():
    bits = np.random.default_rng(1).integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32)
    values = values[np.isfinite(values)]
    text = encode(Floats(values))
    assert max(map(len, text[1:-1].split(b","))) + 1 <= NUMBER_BYTES
    assert np.array_equal(float32_bits(json.loads(text)), values.view(np.uint32))


def test_answers_rounded_floats_are_written_as_their_decimals():
    weights = np.float32([[0.123449, 0.98767, 1.0, 0.00004]])
    text = encode(Floats(weights, decimals=4))
    assert text == b"[[0.1234,0.9877,1.0,0.0]]"
    # the attention route's rule before: Python's round of each weight
    maps = np.random.default_rng(2).dirichlet(np.ones(50), size=(4, 50)).astype(np.float32)
    assert json.loads(encode(Floats(maps, decimals=4))) == [[[round(w, 4) for w in row] for row in head]
                                                            for head in maps.tolist()]


def test_answers_sparse_terms_are_teis_index_value_objects_within_their_bytes():
    indices, values = [3, 250000, 29999], np.float32([0.5, 1.25e-7, -2961229700000.0]).tolist()
    text = encode([SparseTerms(indices, values), SparseTerms([], [])])
    terms, empty = json.loads(text)
    assert [term["index"] for term in terms] == indices and empty == []
    assert np.array_equal(float32_bits([term["value"] for term in terms]), float32_bits(values))
    assert len(text) <= 3 * SPARSE_TERM_BYTES + 8


def test_answers_a_function_is_called_where_the_answer_is_encoded():
    calls = []
    assert encode(lambda: calls.append(1) or {"a": [1, "b", None]}) == b'{"a":[1,"b",null]}' and calls == [1]
    with pytest.raises(TypeError, match="not JSON serializable"):
        encode(object())


def test_answers_large_arrays_are_written_a_block_at_a_time(monkeypatch):
    sizes = []
    dumps = answers.orjson.dumps

    def counting(value, *args, **kwargs):
        sizes.append(getattr(value, "size", 0))
        return dumps(value, *args, **kwargs)

    monkeypatch.setattr(answers.orjson, "dumps", counting)
    encode(Floats(np.zeros((300, 1000), dtype=np.float32)))
    assert max(sizes) <= BLOCK and sum(sizes) == 300 * 1000
