"""Segmented LoRA shrink and expand: the ``triton`` implementation of op ``lora``
(kernels/lora.py has the layout of ``a``, ``b`` and the sub-module column ranges).

The step's LoRA rows arrive grouped by adapter slot: ``order`` lists them segment after
segment, and ``seg_start``/``seg_len``/``seg_slot`` say where each segment begins in it,
how many rows it has and which slot serves them (the segmented layout of punica's SGMV).
A program handles one segment's tile of rows, so every row of a tile reads the same
adapter's weights.

- shrink: ``t[p, i*R:(i+1)*R] = x[order[p]] @ a[slot, i*R:(i+1)*R].T`` for every sub-module
  i, one program per (segment, row tile, rank tile of a sub-module); ``t`` is float32.
- expand: ``y[order[p], lo_i:hi_i] += t[p, i*R:(i+1)*R] @ b[slot, lo_i:hi_i].T``, one
  program per (segment, row tile, column tile of a sub-module), every sub-module in one
  launch (``MAX_SUBS`` at a time); y is read, the delta added in float32, and written back
  in y's dtype. Each element of y has one writer, so the result does not depend on the
  order programs run in (no atomics, no split-K).

16-bit weights go into tensor-core dots (t cast down for the expand), float32 into IEEE
float32 dots. ``tl.dot`` needs every dimension >= 16: row tiles are at least 16, ranks are
padded to a power of two >= 16 with masked loads. Nothing that varies between steps is a
specialised argument (the longest segment picks one of two row tiles), so serving
compiles nothing new.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from tide_fleet.kernels.launch import launch
from tide_fleet.kernels.triton_attention import INTERPRETED

MAX_SUBS = 3  # sub-modules one expand launch covers (a fused q|k|v projection)
BLOCK_K = 64  # input features per step of the shrink's loop


@triton.jit  # type: ignore[untyped-decorator]
def _shrink_kernel(  # type: ignore[no-untyped-def]
    t, x, a, order, seg_start, seg_len, seg_slot,
    in_features, rank, tiles_per_sub,
    stride_xm, stride_xk, stride_as, stride_ar, stride_ak, stride_tm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    seg = tl.program_id(0)
    tile_m = tl.program_id(1)
    sub = tl.program_id(2) // tiles_per_sub
    tile_n = tl.program_id(2) % tiles_per_sub
    length = tl.load(seg_len + seg)
    if tile_m * BLOCK_M >= length:
        return  # the grid is sized for the longest segment
    start = tl.load(seg_start + seg)
    slot = tl.load(seg_slot + seg)
    m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = m < length
    rows = tl.load(order + start + m, mask=m_mask, other=0)
    n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)  # within the sub-module's rank block
    n_mask = n < rank
    k = tl.arange(0, BLOCK_K)
    x_ptrs = x + rows[:, None] * stride_xm + k[None, :] * stride_xk
    a_ptrs = a + slot * stride_as + (sub * rank + n)[:, None] * stride_ar + k[None, :] * stride_ak
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        k_mask = (k0 + k < in_features)[None, :]
        xt = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask, other=0.0)
        at = tl.load(a_ptrs, mask=n_mask[:, None] & k_mask, other=0.0)
        if UPCAST:
            xt, at = xt.to(tl.float32), at.to(tl.float32)
        acc += tl.dot(xt, tl.trans(at), input_precision=PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        a_ptrs += BLOCK_K * stride_ak
    t_ptrs = t + (start + m)[:, None] * stride_tm + (sub * rank + n)[None, :]
    tl.store(t_ptrs, acc, mask=m_mask[:, None] & n_mask[None, :])


@triton.jit  # type: ignore[untyped-decorator]
def _expand_kernel(  # type: ignore[no-untyped-def]
    y, t, b, order, seg_start, seg_len, seg_slot,
    rank, tiles_per_sub, lo0, hi0, lo1, hi1, lo2, hi2,
    stride_ym, stride_yn, stride_tm, stride_bs, stride_bn, stride_br,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    seg = tl.program_id(0)
    tile_m = tl.program_id(1)
    sub = tl.program_id(2) // tiles_per_sub  # t's rank block, counted from the launch's first
    tile_n = tl.program_id(2) % tiles_per_sub
    length = tl.load(seg_len + seg)
    lo = tl.where(sub == 0, lo0, tl.where(sub == 1, lo1, lo2))
    hi = tl.where(sub == 0, hi0, tl.where(sub == 1, hi1, hi2))
    col = lo + tile_n * BLOCK_N
    if (tile_m * BLOCK_M >= length) | (col >= hi):
        return  # the grid is sized for the longest segment and the widest sub-module
    start = tl.load(seg_start + seg)
    slot = tl.load(seg_slot + seg)
    m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = m < length
    rows = tl.load(order + start + m, mask=m_mask, other=0)
    n = col + tl.arange(0, BLOCK_N)
    n_mask = n < hi
    r = tl.arange(0, BLOCK_R)
    r_mask = r < rank
    tt = tl.load(
        t + (start + m)[:, None] * stride_tm + (sub * rank + r)[None, :],
        mask=m_mask[:, None] & r_mask[None, :], other=0.0,
    )  # fmt: skip
    bt = tl.load(
        b + slot * stride_bs + n[:, None] * stride_bn + r[None, :] * stride_br,
        mask=n_mask[:, None] & r_mask[None, :], other=0.0,
    )  # fmt: skip
    if UPCAST:
        bt = bt.to(tl.float32)
    else:
        tt = tt.to(bt.dtype)
    delta = tl.dot(tt, tl.trans(bt), input_precision=PRECISION)
    mask = m_mask[:, None] & n_mask[None, :]
    y_ptrs = y + rows[:, None] * stride_ym + n[None, :] * stride_yn
    current = tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptrs, (current + delta).to(y.dtype.element_ty), mask=mask)


def add_lora(
    y: torch.Tensor,
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    subs: Sequence[tuple[int, int]],
    order: torch.Tensor,
    seg_start: torch.Tensor,
    seg_len: torch.Tensor,
    seg_slot: torch.Tensor,
    max_seg_len: int,
) -> None:
    """Add the segmented rows' LoRA deltas to y in place: one shrink launch, then one expand
    launch per ``MAX_SUBS`` sub-modules. Shapes as kernels/lora.py checks them."""
    rank = b.shape[2]
    block_m = 16 if max_seg_len <= 16 else 64
    num_segments = seg_start.shape[0]
    m_tiles = triton.cdiv(max_seg_len, block_m)
    t = _shrink(x, a, len(subs), rank, order, seg_start, seg_len, seg_slot, block_m, m_tiles)
    block_r = max(16, triton.next_power_of_2(rank))
    block_n = 64 if block_r <= 64 else 32
    for first in range(0, len(subs), MAX_SUBS):
        group = list(subs[first : first + MAX_SUBS])
        tiles = triton.cdiv(max(hi - lo for lo, hi in group), block_n)
        if tiles == 0:
            continue
        bounds = [v for lo_hi in group for v in lo_hi]
        bounds += [0, 0] * (MAX_SUBS - len(group))  # empty: no program gets a sub past the group
        part = t[:, first * rank :]  # the group's first rank block is block 0 of the launch
        args = dict(
            y=y, t=part, b=b, order=order, seg_start=seg_start, seg_len=seg_len,
            seg_slot=seg_slot, rank=rank, tiles_per_sub=tiles,
            lo0=bounds[0], hi0=bounds[1], lo1=bounds[2], hi1=bounds[3], lo2=bounds[4],
            hi2=bounds[5], stride_ym=y.stride(0), stride_yn=y.stride(1),
            stride_tm=part.stride(0), stride_bs=b.stride(0), stride_bn=b.stride(1),
            stride_br=b.stride(2),
        )  # fmt: skip
        constexprs = dict(
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_R=block_r, **_dot_options(b.dtype)
        )
        grid = (num_segments, m_tiles, len(group) * tiles)
        launch(_expand_kernel, grid, "lora_expand", args, constexprs)


def _shrink(
    x: torch.Tensor,
    a: torch.Tensor,
    num_subs: int,
    rank: int,
    order: torch.Tensor,
    seg_start: torch.Tensor,
    seg_len: torch.Tensor,
    seg_slot: torch.Tensor,
    block_m: int,
    m_tiles: int,
) -> torch.Tensor:
    """t: ``[num_lora_rows, num_subs * rank]`` float32, row p for the row ``order[p]``."""
    t = torch.empty((order.shape[0], num_subs * rank), dtype=torch.float32, device=x.device)
    block_n = min(64, max(16, triton.next_power_of_2(rank)))
    tiles = triton.cdiv(rank, block_n)
    args = dict(
        t=t, x=x, a=a, order=order, seg_start=seg_start, seg_len=seg_len, seg_slot=seg_slot,
        in_features=a.shape[2], rank=rank, tiles_per_sub=tiles,
        stride_xm=x.stride(0), stride_xk=x.stride(1), stride_as=a.stride(0),
        stride_ar=a.stride(1), stride_ak=a.stride(2), stride_tm=t.stride(0),
    )  # fmt: skip
    constexprs = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=BLOCK_K, **_dot_options(a.dtype))
    grid = (seg_start.shape[0], m_tiles, num_subs * tiles)
    launch(_shrink_kernel, grid, "lora_shrink", args, constexprs)
    return t


def _dot_options(dtype: torch.dtype) -> dict[str, object]:
    # The interpreter's bf16 tl.dot is wrong (see triton_attention.upcast_dots): fp32 there.
    upcast = INTERPRETED and dtype in (torch.bfloat16, torch.float16)
    return {"UPCAST": upcast, "PRECISION": "ieee" if dtype == torch.float32 else "tf32"}
