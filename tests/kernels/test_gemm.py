"""tide::gemm_bf16 (kernels/csrc/cpu_gemm.cpp): the AMX GEMM on the GEMV's packed weight,
held to F.linear at row counts that leave partial 16-row blocks, odd 32-row pairs, several
x chunks; K with a short last K block; N past the last column group; and kernels/linear.py
taking it past the GEMV's rows with no second weight copy."""

from __future__ import annotations

import pytest
import torch

from tide_fleet.kernels import cpu as cpu_kernels

ops = cpu_kernels.ops()
pytestmark = pytest.mark.skipif(
    not cpu_kernels.gemm_rows_ready(), reason="no AMX tiles here: no native GEMM"
)


@pytest.mark.parametrize("rows", [1, 15, 16, 17, 33, 100, 300])
@pytest.mark.parametrize(("n", "k"), [(260, 1024), (1027, 64), (8, 288), (48, 2816)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemm_matches_linear(rows, n, k, with_bias):
    gen = torch.Generator().manual_seed(rows * n + k)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    bias = torch.randn(n, generator=gen).to(torch.bfloat16) if with_bias else None
    got = ops.gemm_bf16(x, ops.gemv_pack_bf16(w), bias, n)
    ref = torch.nn.functional.linear(x.float(), w.float(), None if bias is None else bias.float())
    assert got.shape == (rows, n) and got.dtype == torch.bfloat16
    # fp32 sums rounded once to bf16: within bf16 resolution of the exact result.
    torch.testing.assert_close(got.float(), ref, atol=2e-2 * k**0.5 / 8, rtol=1e-2)


def test_gemm_takes_strided_rows_and_none():
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(64, 96, generator=gen).to(torch.bfloat16)
    packed = ops.gemv_pack_bf16(w)
    wide = torch.randn(40, 192, generator=gen).to(torch.bfloat16)
    x = wide[:, ::2]  # not contiguous
    ref = torch.nn.functional.linear(x.float(), w.float())
    got = ops.gemm_bf16(x, packed, None, 64)
    torch.testing.assert_close(got.float(), ref, atol=3e-2, rtol=1e-2)
    assert ops.gemm_bf16(x[:0], packed, None, 64).shape == (0, 64)


def test_gemm_rejects_bad_shapes():
    packed = ops.gemv_pack_bf16(torch.zeros(8, 64, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match=r"x must be \[M, 64\]"):
        ops.gemm_bf16(torch.zeros(3, 32, dtype=torch.bfloat16), packed, None, 8)
    with pytest.raises(RuntimeError, match="N 40 does not match the packed weight"):
        ops.gemm_bf16(torch.zeros(3, 64, dtype=torch.bfloat16), packed, None, 40)
    with pytest.raises(RuntimeError, match="gemm_bf16 takes bfloat16"):
        ops.gemm_bf16(torch.zeros(3, 64), packed, None, 8)
    with pytest.raises(RuntimeError, match=r"bias must be bfloat16 \[N\]"):
        ops.gemm_bf16(torch.zeros(3, 64, dtype=torch.bfloat16), packed, torch.zeros(4), 8)


def test_linear_takes_the_gemm_past_the_gemv_with_one_weight_copy():
    from tide_fleet.kernels.linear import Linear

    gen = torch.Generator().manual_seed(9)
    w = torch.randn(96, 64, generator=gen).to(torch.bfloat16)
    layer = Linear(w)
    assert layer.gemm and not layer.packed
    assert layer.weight is layer.gemv_weight, "no oneDNN copy beside the GEMV's"
    top = layer.gemv_rows
    for shape in ((top + 1, 64), (3 * top + 5, 64), (2, top + 3, 64)):
        x = torch.randn(*shape, generator=gen).to(torch.bfloat16)
        ref = torch.nn.functional.linear(x.float(), w.float())
        got = layer(x)
        assert got.shape == (*shape[:-1], 96)
        torch.testing.assert_close(got.float(), ref, atol=3e-2, rtol=1e-2)
