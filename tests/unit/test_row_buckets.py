"""Row buckets (`model/row_buckets.py`): few row counts, little padding, and padded calls whose real rows are
those of the same call on the padded input (int8's traced case is in test_quantization.py)."""

from __future__ import annotations

import pytest
import torch

from bertforge.engine.bf16 import Bf16Linear, onednn_bf16
from bertforge.engine.row_buckets import bucket_rows, rows_from_bucket, rows_to_bucket


def test_bucket_rows_pads_at_most_a_sixteenth_and_keeps_few_sizes():
    buckets = [bucket_rows(rows) for rows in range(1, 16_385)]
    for rows, bucket in enumerate(buckets, start=1):
        assert bucket >= rows and bucket_rows(bucket) == bucket, rows
        assert bucket - rows < max(8, rows / 16 + 1), rows  # 8-row steps, then at most 1/16 padding
    assert [bucket_rows(r) for r in (1, 16, 17, 256, 257, 512, 513)] == [8, 16, 24, 256, 272, 512, 544]
    assert len(set(buckets)) <= 130  # what oneDNN compiles, per projection shape (its cache holds 1,024)


def test_rows_to_bucket_pads_with_zeros_and_rows_from_bucket_restores_the_shape():
    x = torch.randn(2, 5, 3)  # 10 rows -> 16
    flat = rows_to_bucket(x)
    assert flat.shape == (16, 3) and torch.equal(flat[:10], x.reshape(10, 3)) and not flat[10:].any()
    y = flat @ torch.randn(3, 4)
    assert torch.equal(rows_from_bucket(y, x), y[:10].reshape(2, 5, 4))
    exact = torch.randn(16, 3)
    assert rows_to_bucket(exact).data_ptr() == exact.data_ptr()  # a bucket's own size: no copy


@pytest.mark.skipif(not onednn_bf16(), reason="no oneDNN bf16 kernels on this CPU")
def test_bf16_linear_runs_at_the_row_bucket_without_changing_real_rows():
    torch.manual_seed(5)
    weight, bias = torch.randn(40, 24) * 0.1, torch.randn(40)
    linear = Bf16Linear(weight, bias, packed=True)
    with torch.inference_mode():
        for rows in (3, 17, 100, 300):
            x = torch.randn(1, rows, 24).bfloat16()
            padded = torch.nn.functional.pad(x[0], [0, 0, 0, bucket_rows(rows) - rows])
            expected = torch.ops.mkldnn._linear_pointwise(padded, linear._weight, linear.bias, "none", [], "")[:rows]
            assert torch.equal(linear(x)[0], expected), rows
            plain = torch.ops.mkldnn._linear_pointwise(x, linear._weight, linear.bias, "none", [], "")
            torch.testing.assert_close(linear(x), plain, rtol=0.02, atol=0.02)  # bf16: oneDNN's kernel per row count
