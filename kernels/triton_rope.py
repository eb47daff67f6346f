"""RoPE kernels for the CUDA path (op rope; kv_write joins it in ``rotary_kv_write_``),
behind the signature of torch.ops.tide's CPU ``rotary_`` (``kernels/csrc/elementwise``) and
with its rounding: rotate-half, float math, one rounding per element (``round_to``):
v[i] = round(a c[i] - b s[i]), v[i + half] = round(b c[i + half] + a s[i + half]).

- ``rotary_``: the first ``heads`` heads of each row in place; one program per (row, head).
- ``rotary_kv_write_``: q's and k's heads rotated in place in the fused qkv rows, and the
  rotated k and the v of each token written to its paged-cache slot (layout ``[kv_heads,
  num_blocks, block_size, head_dim]``, slot = block x block_size + offset, as
  ``triton_attention.write_kv_cache``), in one launch; slot -1 (a padding row) writes
  nothing, its q and k are rotated all the same (as a separate rotate and write would).

Positions are not checked against the tables (that would wait on the GPU). The slot count
is the one argument that varies with the step: in ``do_not_specialize``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tide_fleet.kernels.launch import launch
from tide_fleet.kernels.triton_rounding import DTYPES, STRICT, round_to


@triton.jit  # type: ignore[untyped-decorator]
def _rotate_head(  # type: ignore[no-untyped-def]
    row_ptr, c, s, HALF: tl.constexpr, HALF_BLOCK: tl.constexpr,
):  # fmt: skip
    """Rotate one head in place at row_ptr (c, s: its position's cos/sin rows); returns the
    rotated halves as stored, and the mask of the half."""
    j = tl.arange(0, HALF_BLOCK)
    m = j < HALF
    dtype = row_ptr.dtype.element_ty
    a = tl.load(row_ptr + j, mask=m, other=0.0).to(tl.float32)
    b = tl.load(row_ptr + HALF + j, mask=m, other=0.0).to(tl.float32)
    c1 = tl.load(c + j, mask=m, other=0.0).to(tl.float32)
    c2 = tl.load(c + HALF + j, mask=m, other=0.0).to(tl.float32)
    s1 = tl.load(s + j, mask=m, other=0.0).to(tl.float32)
    s2 = tl.load(s + HALF + j, mask=m, other=0.0).to(tl.float32)
    lo = round_to(a * c1 - b * s1, dtype)
    hi = round_to(b * c2 + a * s2, dtype)
    tl.store(row_ptr + j, lo, mask=m)
    tl.store(row_ptr + HALF + j, hi, mask=m)
    return lo, hi, j, m


@triton.jit  # type: ignore[untyped-decorator]
def _rotary_kernel(  # type: ignore[no-untyped-def]
    x, positions, cos, sin, stride_x,
    HEAD_DIM: tl.constexpr, HALF_BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    table = tl.load(positions + row).to(tl.int64) * HEAD_DIM
    row_ptr = x + row * stride_x + head * HEAD_DIM
    _rotate_head(row_ptr, cos + table, sin + table, HEAD_DIM // 2, HALF_BLOCK)


def takes_rotary(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, heads: int, head_dim: int) -> bool:  # fmt: skip
    """Whether the RoPE kernels take x [rows, >= heads * head_dim] (unit last stride),
    positions (integer [rows]) and cos/sin (contiguous [max_pos, head_dim] of x's dtype)."""
    ok = x.dim() == 2 and x.stride(1) == 1 and x.dtype in DTYPES and head_dim % 2 == 0
    ok = ok and x.size(1) >= heads * head_dim and positions.numel() == x.size(0)
    ok = ok and not positions.is_floating_point() and positions.is_contiguous()
    return ok and all(
        t.is_contiguous() and t.dim() == 2 and t.size(1) == head_dim and t.dtype == x.dtype
        for t in (cos, sin)
    )  # fmt: skip


def rotary_(
    x: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    heads: int,
    head_dim: int,
    check: bool = True,
) -> None:
    """Rotate the first ``heads`` heads of each row of x [rows, >= heads * head_dim] in
    place at the rows' positions in cos/sin [max_pos, head_dim] (positions are not checked
    against the tables: that would wait on the GPU). ``check=False``: the caller has asked
    ``takes_rotary`` already."""
    if check and not takes_rotary(x, positions, cos, sin, heads, head_dim):
        raise ValueError(
            f"rotary_: x must be [rows, >= {heads} x {head_dim}] with unit last stride, "
            "positions integer [rows], cos/sin contiguous [max_pos, head_dim] of x's dtype; "
            f"got x {tuple(x.shape)} {x.dtype}, positions {tuple(positions.shape)}, cos "
            f"{tuple(cos.shape)} {cos.dtype}"
        )
    if x.shape[0] == 0 or heads == 0:
        return
    args = dict(x=x, positions=positions, cos=cos, sin=sin, stride_x=x.stride(0))
    half_block = triton.next_power_of_2(head_dim // 2)
    constexprs = dict(HEAD_DIM=head_dim, HALF_BLOCK=half_block, **STRICT)
    launch(_rotary_kernel, (x.shape[0], heads), "rotary_", args, constexprs)


_KV_UNSPECIALISED = ("num_slots",)


@triton.jit(do_not_specialize=_KV_UNSPECIALISED)  # type: ignore[untyped-decorator]
def _rotary_kv_write_kernel(  # type: ignore[no-untyped-def]
    qkv, positions, cos, sin, k_cache, v_cache, slots,
    stride_x, num_slots, cache_head_stride,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr, HALF_BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)  # q heads, then k heads
    HALF: tl.constexpr = HEAD_DIM // 2
    table = tl.load(positions + row).to(tl.int64) * HEAD_DIM
    row_ptr = qkv + row * stride_x
    lo, hi, j, m = _rotate_head(row_ptr + head * HEAD_DIM, cos + table, sin + table, HALF,
                                HALF_BLOCK)  # fmt: skip
    # The k heads also write their rotated k and their token's v into the slot; rows past
    # the slot mapping and slot -1 (a padding row) write nothing.
    # Scalars broadcast to lanes before the & (the interpreter mistypes vector & scalar).
    lanes = tl.zeros_like(j)
    writer = m & (lanes + head >= NUM_HEADS) & (lanes + row < num_slots)
    slot = tl.load(slots + row + lanes, mask=writer, other=-1).to(tl.int64)
    kvh = (head - NUM_HEADS).to(tl.int64)
    write = writer & (slot >= 0)
    dst = kvh * cache_head_stride + slot * HEAD_DIM + j
    tl.store(k_cache + dst, lo, mask=write)
    tl.store(k_cache + dst + HALF, hi, mask=write)
    v_ptr = row_ptr + (NUM_HEADS + NUM_KV_HEADS + kvh) * HEAD_DIM + j
    tl.store(v_cache + dst, tl.load(v_ptr, mask=write), mask=write)
    tl.store(v_cache + dst + HALF, tl.load(v_ptr + HALF, mask=write), mask=write)


def takes_rotary_kv_write(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> bool:
    """Whether the fused kernel takes the call: what ``takes_rotary`` asks of q and k's
    heads, qkv rows wide enough for q | k | v, caches of qkv's dtype, contiguous, in the
    layout above, and a contiguous slot mapping of at most one slot a row."""
    return (
        takes_rotary(qkv, positions, cos, sin, num_heads + num_kv_heads, head_dim)
        and qkv.size(1) >= (num_heads + 2 * num_kv_heads) * head_dim
        and k_cache.dtype == v_cache.dtype == qkv.dtype
        and k_cache.shape == v_cache.shape and k_cache.dim() == 4
        and k_cache.shape[0] == num_kv_heads and k_cache.shape[3] == head_dim
        and k_cache.is_contiguous() and v_cache.is_contiguous()
        and slot_mapping.dim() == 1 and slot_mapping.is_contiguous()
        and not slot_mapping.is_floating_point() and slot_mapping.numel() <= qkv.size(0)
    )  # fmt: skip


def rotary_kv_write_(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    check: bool = True,
) -> None:
    """Rotate q's and k's heads in place in the fused qkv rows [rows, (heads + 2 x kv_heads)
    x head_dim] and write each token's rotated k and its v to its slot in k_cache/v_cache.
    slot_mapping may be shorter than the rows (rows past it are padding: rotated only)."""
    fits = not check or takes_rotary_kv_write(
        qkv, positions, cos, sin, num_heads, num_kv_heads, head_dim, k_cache, v_cache,
        slot_mapping,
    )  # fmt: skip
    if not fits:
        raise ValueError(
            f"rotary_kv_write_: qkv must be [rows, >= ({num_heads} + 2 x {num_kv_heads}) x "
            f"{head_dim}] with unit last stride, positions integer [rows], cos/sin contiguous "
            "[max_pos, head_dim], k_cache/v_cache contiguous [kv_heads, num_blocks, "
            "block_size, head_dim], all of qkv's dtype, slot_mapping contiguous [<= rows]; got "
            f"qkv {tuple(qkv.shape)} {qkv.dtype}, cos {cos.dtype}, k_cache "
            f"{tuple(k_cache.shape)} {k_cache.dtype}, slot_mapping {tuple(slot_mapping.shape)}"
        )
    if qkv.shape[0] == 0:
        return
    args = dict(
        qkv=qkv, positions=positions, cos=cos, sin=sin, k_cache=k_cache, v_cache=v_cache,
        slots=slot_mapping, stride_x=qkv.stride(0), num_slots=slot_mapping.numel(),
        cache_head_stride=k_cache.shape[1] * k_cache.shape[2] * head_dim,
    )  # fmt: skip
    constexprs = dict(
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HALF_BLOCK=triton.next_power_of_2(head_dim // 2), **STRICT,
    )  # fmt: skip
    grid = (qkv.shape[0], num_heads + num_kv_heads)
    launch(_rotary_kv_write_kernel, grid, "rotary_kv_write_", args, constexprs, _KV_UNSPECIALISED)
