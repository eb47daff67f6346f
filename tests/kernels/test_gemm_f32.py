"""tide::gemm_f32 (kernels/csrc/cpu_gemm_f32.cpp): float32 projections on AVX2 + FMA over
its own packed weight, against a float64 reference at row counts that hit every tile
height, with column counts that leave a partial panel, K past one block and not a multiple
of it, a bias, and rows read with a stride; and Linear taking it where it is preferred."""

from __future__ import annotations

import pytest
import torch

from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.kernels.linear import Linear

ops = cpu_kernels.ops()
pytestmark = pytest.mark.skipif(
    ops is None or not ops.gemm_f32_supported(), reason="no native kernels with AVX2 + FMA here"
)


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = x.double() @ w.double().T
    return (y if b is None else y + b.double()).float()


@pytest.mark.parametrize(("n", "k"), [(48, 64), (37, 70), (1536, 1024), (80, 600), (5, 1)])
@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 13, 96, 97, 250])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_a_float64_reference(n, k, rows, with_bias):
    gen = torch.Generator().manual_seed(n * 1000 + k + rows)
    w = torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if with_bias else None
    x = torch.randn(rows, k, generator=gen)
    got = ops.gemm_f32(x, ops.gemm_f32_pack(w), b, n)
    assert got.shape == (rows, n) and got.dtype == torch.float32
    torch.testing.assert_close(got, reference(x, w, b), atol=2e-5 * k**0.5, rtol=1e-5)


def test_rows_with_a_stride_and_columns_with_one_are_read_in_place_or_copied():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(40, 300, generator=gen)
    packed = ops.gemm_f32_pack(w)
    wide = torch.randn(9, 700, generator=gen)
    rows = wide[:, 100:400]  # row stride 700
    torch.testing.assert_close(ops.gemm_f32(rows, packed, None, 40), reference(rows, w, None))
    cols = torch.randn(300, 9, generator=gen).T  # column stride 9
    torch.testing.assert_close(ops.gemm_f32(cols, packed, None, 40), reference(cols, w, None))


def test_bad_operands_are_refused_with_what_was_expected():
    w = torch.randn(32, 64)
    packed = ops.gemm_f32_pack(w)
    with pytest.raises(RuntimeError, match="gemm_f32: x must be float32"):
        ops.gemm_f32(torch.randn(4, 64, dtype=torch.bfloat16), packed, None, 32)
    with pytest.raises(RuntimeError, match="gemm_f32_pack's float32 weight for N=32 K=48"):
        ops.gemm_f32(torch.randn(4, 48), packed, None, 32)
    with pytest.raises(RuntimeError, match=r"gemm_f32: bias must be float32 \[32\]"):
        ops.gemm_f32(torch.randn(4, 64), packed, torch.randn(31), 32)
    with pytest.raises(RuntimeError, match=r"gemm_f32_pack: w must be float32 \[N, K\]"):
        ops.gemm_f32_pack(torch.randn(32, 64, dtype=torch.bfloat16))


def test_linear_takes_it_in_float32_where_preferred_with_no_other_copy():
    gen = torch.Generator().manual_seed(5)
    w, b = torch.randn(96, 128, generator=gen), torch.randn(96, generator=gen)
    layer = Linear(w, b)
    if not cpu_kernels.gemm_f32_preferred():
        assert not layer.f32, "AVX-512 here: float32 stays on oneDNN's wider kernels"
        return
    assert layer.f32 and not layer.packed
    assert layer.weight.dim() == 1, "the AVX2 GEMM's packed weight is the only copy"
    for rows in (1, 7, 64, 300):
        x = torch.randn(rows, 128, generator=gen)
        torch.testing.assert_close(layer(x), reference(x, w, b), atol=1e-4, rtol=1e-5)
    x3 = torch.randn(2, 5, 128, generator=gen)
    assert layer(x3).shape == (2, 5, 96)
