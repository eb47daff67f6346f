"""Triton kernels for the CUDA path, behind the torch reference's signatures.

Cache layout as in ``kernels.attention``: ``[kv_heads, num_blocks, block_size, head_dim]``.

- ``write_kv_cache``: scatter the step's K and V into their slots.
- decode attention: one query token per sequence; one program per (sequence, KV head,
  context partition) handles that KV head's group of query heads, so each K/V row is
  read once per group; an online softmax per partition, then a reduction pass combines
  partitions (split-K for long contexts).
- prefill/extend attention: a chunk of query tokens attends to its cached prefix and
  causally to itself, reading K/V through the block table (chunked prefill and
  prefix-cache hits need no dense copy).

``tl.dot`` operands are at least 16 in each dimension (what a GPU compile accepts), so
the kernels need block_size >= 16 and head_dim >= 16; query-head groups are padded to 16.
On CPU they run under ``TRITON_INTERPRET=1`` for tests.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

PARTITION_SIZE = 512  # context tokens per decode program before the reduction pass
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _upcast(t: torch.Tensor) -> bool:
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
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    head_stride = k_cache.shape[1] * k_cache.shape[2] * head_dim
    _write_kv_kernel[(num_tokens, num_kv_heads)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1), head_stride,
        HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
    )  # fmt: skip


@triton.jit
def _attend(q, k, v, visible, m_i, l_i, acc, scale, UPCAST: tl.constexpr):
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


@triton.jit
def _decode_kernel(
    query, k_cache, v_cache, block_tables, context_lens,
    part_acc, part_max, part_sum,
    stride_qn, stride_qh, stride_bt,
    cache_head_stride, scale,
    NUM_PARTITIONS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    PARTITION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    part = tl.program_id(2)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_SIZE)
    gmask = g < GROUP
    dmask = d < HEAD_DIM
    heads = kvh * GROUP + g
    q = tl.load(
        query + seq * stride_qn + heads[:, None] * stride_qh + d[None, :],
        mask=gmask[:, None] & dmask[None, :], other=0.0,
    )  # fmt: skip
    if UPCAST:
        q = q.to(tl.float32)
    context = tl.load(context_lens + seq)
    start = part * PARTITION
    end = tl.minimum(start + PARTITION, context)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for pos in range(start, end, BLOCK_SIZE):
        block = tl.load(block_tables + seq * stride_bt + pos // BLOCK_SIZE).to(tl.int64)
        rows = kvh * cache_head_stride + (block * BLOCK_SIZE + n) * HEAD_DIM
        valid = pos + n < end
        k = tl.load(
            k_cache + rows[:, None] + d[None, :], mask=valid[:, None] & dmask[None, :], other=0.0
        )
        v = tl.load(
            v_cache + rows[:, None] + d[None, :], mask=valid[:, None] & dmask[None, :], other=0.0
        )
        visible = tl.broadcast_to(valid[None, :], (BLOCK_G, BLOCK_SIZE))
        m_i, l_i, acc = _attend(q, k, v, visible, m_i, l_i, acc, scale, UPCAST)
    base = (seq * tl.num_programs(1) + kvh) * NUM_PARTITIONS + part
    tl.store(part_max + base * BLOCK_G + g, m_i)
    tl.store(part_sum + base * BLOCK_G + g, l_i)
    tl.store(part_acc + (base * BLOCK_G + g[:, None]) * BLOCK_D + d[None, :], acc)


@triton.jit
def _reduce_kernel(
    out, part_acc, part_max, part_sum, stride_on, stride_oh,
    NUM_PARTITIONS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    for part in range(NUM_PARTITIONS):
        base = (seq * tl.num_programs(1) + kvh) * NUM_PARTITIONS + part
        m = tl.maximum(m, tl.load(part_max + base * BLOCK_G + g))
    total = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for part in range(NUM_PARTITIONS):
        base = (seq * tl.num_programs(1) + kvh) * NUM_PARTITIONS + part
        pm = tl.load(part_max + base * BLOCK_G + g)
        w = tl.where(pm == float("-inf"), 0.0, tl.exp(pm - m))
        total += tl.load(part_sum + base * BLOCK_G + g) * w
        acc += tl.load(part_acc + (base * BLOCK_G + g[:, None]) * BLOCK_D + d[None, :]) * w[:, None]
    result = acc / total[:, None]
    heads = kvh * GROUP + g
    mask = (g < GROUP)[:, None] & (d < HEAD_DIM)[None, :]
    ptrs = out + seq * stride_on + heads[:, None] * stride_oh + d[None, :]
    tl.store(ptrs, result.to(out.dtype.element_ty), mask=mask)


def decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_context: int,
) -> torch.Tensor:
    """query [n, heads, head_dim], one token per sequence -> [n, heads, head_dim]."""
    n, num_heads, head_dim = query.shape
    num_kv_heads, _, block_size, _ = k_cache.shape
    group = num_heads // num_kv_heads
    block_g, block_d = max(16, triton.next_power_of_2(group)), triton.next_power_of_2(head_dim)
    partition = max(PARTITION_SIZE, block_size)
    num_parts = max(1, triton.cdiv(max_context, partition))
    shape = (n, num_kv_heads, num_parts, block_g)
    part_max = torch.empty(shape, dtype=torch.float32, device=query.device)
    part_sum = torch.empty_like(part_max)
    part_acc = torch.empty((*shape, block_d), dtype=torch.float32, device=query.device)
    head_stride = k_cache.shape[1] * block_size * head_dim
    _decode_kernel[(n, num_kv_heads, num_parts)](
        query, k_cache, v_cache, block_tables, context_lens, part_acc, part_max, part_sum,
        query.stride(0), query.stride(1), block_tables.stride(0), head_stride, scale,
        NUM_PARTITIONS=num_parts, GROUP=group, BLOCK_G=block_g, HEAD_DIM=head_dim,
        BLOCK_D=block_d, BLOCK_SIZE=block_size, PARTITION=partition, UPCAST=_upcast(query),
    )  # fmt: skip
    out = torch.empty_like(query)
    _reduce_kernel[(n, num_kv_heads)](
        out, part_acc, part_max, part_sum, out.stride(0), out.stride(1),
        NUM_PARTITIONS=num_parts, GROUP=group, BLOCK_G=block_g, HEAD_DIM=head_dim,
        BLOCK_D=block_d,
    )  # fmt: skip
    return out


@triton.jit
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
        m_i, l_i, acc = _attend(q, k, v, visible, m_i, l_i, acc, scale, UPCAST)
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
    _prefill_kernel[(triton.cdiv(q_len, block_m), num_heads)](
        out, query, k_cache, v_cache, block_table,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.shape[1] * block_size * head_dim, scale, start_pos, q_len,
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_M=block_m, BLOCK_SIZE=block_size,
        UPCAST=_upcast(query),
    )  # fmt: skip
    return out
