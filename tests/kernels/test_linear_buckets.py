"""The packed CPU matmul's row buckets (kernels/linear.py): every row count maps to a bucket
at least as large and at most one step larger, the warm-up list holds exactly the buckets
real calls land in, and padded calls give F.linear's answer on the real rows, for bf16 and
float32 weights with and without a bias."""

from __future__ import annotations

import pytest
import torch

from kernels import linear
from kernels.linear import Linear, packed_row_buckets, packed_rows


def test_every_row_count_lands_in_a_listed_bucket_close_above_it():
    max_rows = 1024
    buckets = packed_row_buckets(max_rows)
    assert buckets == sorted(set(buckets)), "buckets are distinct and ascending"
    seen = set()
    for rows in range(1, max_rows + 1):
        padded = packed_rows(rows)
        step = linear.SMALL_STEP if rows <= linear.SMALL_ROWS else linear.LARGE_STEP
        assert rows <= padded < rows + step, (rows, padded)
        seen.add(padded)
    assert seen == set(buckets), "warm-up builds exactly the buckets calls use"
    assert len(buckets) == 64 // 8 + (1024 - 64) // 64  # 8 small, 15 large


@pytest.mark.parametrize("max_rows", [1, 5, 64, 65, 100, 1000])
def test_buckets_cover_small_limits(max_rows):
    buckets = packed_row_buckets(max_rows)
    assert {packed_rows(r) for r in range(1, max_rows + 1)} == set(buckets)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_bias", [False, True])
def test_padded_calls_match_f_linear_on_the_real_rows(dtype, with_bias):
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(80, 64, generator=gen).to(dtype)
    bias = torch.randn(80, generator=gen).to(dtype) if with_bias else None
    layer = Linear(w, bias)
    layer.warm_up(200)
    for rows in (3, 9, 64, 65, 130, 200):
        x = torch.randn(rows, 64, generator=gen).to(dtype)
        got = layer(x)
        assert got.shape == (rows, 80)
        ref = torch.nn.functional.linear(
            x.float(), w.float(), None if bias is None else bias.float()
        )
        tol = dict(atol=5e-2, rtol=1e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.float(), ref, **tol)
