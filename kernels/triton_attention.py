"""Triton kernels for the CUDA path, behind the torch reference's signatures.

Cache layout as in ``kernels.attention``: ``[kv_heads, num_blocks, block_size, head_dim]``.

- ``write_kv_cache``: scatter the step's K and V into their slots.
- decode attention: in ``kernels/triton_decode.py`` (split-K over each sequence's own
  context), on this module's online-softmax step ``online_softmax_step``.
- prefill/extend attention, one launch per chunk: a chunk of query tokens attends to its
  cached prefix and causally to itself, reading K/V through the block table (chunked
  prefill and prefix-cache hits need no dense copy). The engine's steps use the varlen
  form in ``kernels/triton_prefill.py`` (every chunk of a step in one launch, K/V read
  once per query group); this one serves metadata without a packed ``prefill_batch``.

``tl.dot`` operands are at least 16 in each dimension (what a GPU compile accepts), so
the kernels need block_size >= 16 and head_dim >= 16; query-head groups are padded to 16.
On CPU they run under ``TRITON_INTERPRET=1`` for tests.

Padding (CUDA graphs pad a decode batch to a captured size): a KV write to slot -1 is
skipped, and a row of context length 0 attends to nothing and comes out as zeros.

No recompiles while serving: arguments that vary with the step are listed in
``do_not_specialize`` so not even their divisibility by 16 picks a variant. Launches go
through ``tide_fleet.kernels.launch`` (device checks; the record a test counts variants with).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tide_fleet.kernels.launch import launch

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def upcast_dots(t: torch.Tensor) -> bool:
    """Under Triton's CPU interpreter a bf16 tl.dot returned garbage here (presumably as
    numpy has no bf16), so there the dot operands are upcast to fp32; compiled GPU code
    keeps bf16 dots."""
    return INTERPRETED and t.dtype in (torch.bfloat16, torch.float16)


@triton.jit
def _write_kv_kernel(
    key, value, k_cache, v_cache, slots,
    stride_kt, stride_kh, stride_vt, stride_vh,
    cache_head_stride,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    slot = tl.load(slots + t).to(tl.int64)
    dmask = dmask & (tl.zeros_like(d) + slot >= 0)  # slot -1: a padding row, nothing written
    dst = h * cache_head_stride + slot * HEAD_DIM + d
    k = tl.load(key + t * stride_kt + h * stride_kh + d, mask=dmask)
    v = tl.load(value + t * stride_vt + h * stride_vh + d, mask=dmask)
    tl.store(k_cache + dst, k, mask=dmask)
    tl.store(v_cache + dst, v, mask=dmask)


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Slot -1 marks a padding row: skipped."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    head_stride = k_cache.shape[1] * k_cache.shape[2] * head_dim
    args = dict(
        key=key, value=value, k_cache=k_cache, v_cache=v_cache, slots=slot_mapping,
        stride_kt=key.stride(0), stride_kh=key.stride(1),
        stride_vt=value.stride(0), stride_vh=value.stride(1), cache_head_stride=head_stride,
    )  # fmt: skip
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim))
    launch(_write_kv_kernel, (num_tokens, num_kv_heads), "write_kv_cache", args, constexprs)


@triton.jit
def online_softmax_step(q, k, v, visible, m_i, l_i, acc, scale, UPCAST: tl.constexpr):
    """One online-softmax step: fold a tile of keys/values into (max, sum, accumulator)."""
    if UPCAST:
        k, v = k.to(tl.float32), v.to(tl.float32)
    s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp(s - m_new[:, None])
    alpha = tl.exp(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
    return m_new, l_i, acc


_PREFILL_UNSPECIALISED = ("start_pos", "q_len")


@triton.jit(do_not_specialize=_PREFILL_UNSPECIALISED)
def _prefill_kernel(
    out, query, k_cache, v_cache, block_table,
    stride_qt, stride_qh, stride_ot, stride_oh,
    cache_head_stride, scale, start_pos, q_len,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_SIZE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    head = tl.program_id(1)
    kvh = head // GROUP
    m_offs = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_SIZE)
    mmask = m_offs < q_len
    dmask = d < HEAD_DIM
    q = tl.load(
        query + m_offs[:, None] * stride_qt + head * stride_qh + d[None, :],
        mask=mmask[:, None] & dmask[None, :], other=0.0,
    )  # fmt: skip
    if UPCAST:
        q = q.to(tl.float32)
    q_pos = start_pos + m_offs
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    last = tl.minimum(start_pos + (tile + 1) * BLOCK_M, start_pos + q_len)
    for pos in range(0, last, BLOCK_SIZE):
        block = tl.load(block_table + pos // BLOCK_SIZE).to(tl.int64)
        rows = kvh * cache_head_stride + (block * BLOCK_SIZE + n) * HEAD_DIM
        k_pos = pos + n
        kmask = (k_pos < last)[:, None] & dmask[None, :]
        k = tl.load(k_cache + rows[:, None] + d[None, :], mask=kmask, other=0.0)
        v = tl.load(v_cache + rows[:, None] + d[None, :], mask=kmask, other=0.0)
        visible = k_pos[None, :] <= q_pos[:, None]
        m_i, l_i, acc = online_softmax_step(q, k, v, visible, m_i, l_i, acc, scale, UPCAST)
    result = (acc / l_i[:, None]).to(out.dtype.element_ty)
    tl.store(
        out + m_offs[:, None] * stride_ot + head * stride_oh + d[None, :],
        result, mask=mmask[:, None] & dmask[None, :],
    )  # fmt: skip


def prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    start_pos: int,
    scale: float,
) -> torch.Tensor:
    """query [q_len, heads, head_dim] at positions start_pos.. -> [q_len, heads, head_dim].

    The chunk's own K/V must already be in the cache (write_kv_cache runs first).
    """
    q_len, num_heads, head_dim = query.shape
    num_kv_heads, _, block_size, _ = k_cache.shape
    out = torch.empty_like(query)
    block_m = 16 if q_len <= 16 else 32
    args = dict(
        out=out, query=query, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
        stride_qt=query.stride(0), stride_qh=query.stride(1),
        stride_ot=out.stride(0), stride_oh=out.stride(1),
        cache_head_stride=k_cache.shape[1] * block_size * head_dim, scale=scale,
        start_pos=start_pos, q_len=q_len,
    )  # fmt: skip
    constexprs = dict(
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_M=block_m, BLOCK_SIZE=block_size,
        UPCAST=upcast_dots(query),
    )  # fmt: skip
    grid = (triton.cdiv(q_len, block_m), num_heads)
    launch(_prefill_kernel, grid, "prefill_attention", args, constexprs, _PREFILL_UNSPECIALISED)
    return out
