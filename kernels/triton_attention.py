"""Triton kernels for the CUDA path, behind the torch reference's signatures.

Cache layout as in ``kernels.attention``: ``[kv_heads, num_blocks, block_size, head_dim]``.

- ``write_kv_cache``: scatter the step's K and V into their slots.
- decode attention: one query token per sequence; one program per (sequence, KV head,
  context partition) handles that KV head's group of query heads, so each K/V row is
  read once per group; an online softmax per partition, then a reduction pass combines
  partitions (split-K for long contexts). Each sequence splits its own context, so only
  its live partitions work and a sequence of one partition writes its output directly;
  partials are kept for the real query rows only.
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

No recompiles while serving: the decode kernels' specialisation does not depend on the
context length. A sequence uses at most ``MAX_PARTITIONS`` partitions of ``PARTITION_SIZE``
tokens; longer contexts get longer partitions (computed in the kernel from the sequence's
length), and the reduction loops over that sequence's live partitions. Arguments that vary
with the step are listed in ``do_not_specialize`` so not even their divisibility by 16
picks a variant. Launches go
through ``tide_fleet.kernels.launch`` (device checks; the record a test counts variants with).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tide_fleet.kernels.launch import launch

PARTITION_SIZE = 512  # context tokens per decode program before the reduction pass (at least)
MAX_PARTITIONS = 16  # decode programs per (sequence, KV head); past 8k tokens partitions grow
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


_DECODE_UNSPECIALISED = ("stride_bt", "stride_on", "stride_oh")


@triton.jit
def _live_split(context, UNIT: tl.constexpr, MAX_PARTS: tl.constexpr):
    """A sequence's own split of its context: at most MAX_PARTS partitions, each a multiple
    of UNIT tokens (so of the block size); (tokens per partition, live partitions)."""
    units = tl.maximum(tl.cdiv(context, UNIT), 1)
    partition = UNIT * tl.cdiv(units, MAX_PARTS)
    return partition, tl.cdiv(context, partition)


@triton.jit(do_not_specialize=_DECODE_UNSPECIALISED)
def _decode_kernel(
    query, k_cache, v_cache, block_tables, context_lens, out,
    part_acc, part_max, part_sum,
    stride_qn, stride_qh, stride_on, stride_oh, stride_bt,
    cache_head_stride, scale,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    UNIT: tl.constexpr, MAX_PARTS: tl.constexpr, UPCAST: tl.constexpr,
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
    context = tl.load(context_lens + seq)
    partition, live = _live_split(context, UNIT, MAX_PARTS)
    start = part * partition  # a multiple of BLOCK_SIZE; past the context: no work
    end = tl.minimum(start + partition, context)
    q = tl.load(
        query + seq * stride_qn + heads[:, None] * stride_qh + d[None, :],
        mask=gmask[:, None] & dmask[None, :], other=0.0,
    )  # fmt: skip
    if UPCAST:
        q = q.to(tl.float32)
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
    real = gmask[:, None] & dmask[None, :]
    if live <= 1:
        # One partition (a context of up to UNIT tokens, or none: a padding row comes out
        # as zeros): the output itself, no partials and nothing for the reduce pass.
        result = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        ptrs = out + seq * stride_on + heads[:, None] * stride_oh + d[None, :]
        first = (tl.zeros([BLOCK_G, BLOCK_D], tl.int32) + part) == 0  # program 0 writes
        tl.store(ptrs, result.to(out.dtype.element_ty), mask=real & first)
    else:
        # Partials of the real query rows only, for the live partitions.
        base = ((seq * tl.num_programs(1) + kvh) * tl.num_programs(2) + part) * GROUP
        keep = gmask & ((tl.zeros([BLOCK_G], tl.int32) + part) < live)
        tl.store(part_max + base + g, m_i, mask=keep)
        tl.store(part_sum + base + g, l_i, mask=keep)
        ptrs = part_acc + (base + g[:, None]) * HEAD_DIM + d[None, :]
        tl.store(ptrs, acc, mask=real & keep[:, None])


_REDUCE_UNSPECIALISED = ("stride_on", "stride_oh", "grid_parts")


@triton.jit(do_not_specialize=_REDUCE_UNSPECIALISED)
def _reduce_kernel(
    out, part_acc, part_max, part_sum, context_lens, stride_on, stride_oh, grid_parts,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    UNIT: tl.constexpr, MAX_PARTS: tl.constexpr,
):  # fmt: skip
    """Combine a sequence's live partitions into its output rows; a sequence of one
    partition was written by the decode kernel already."""
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    gmask = g < GROUP
    real = gmask[:, None] & (d < HEAD_DIM)[None, :]
    _, live = _live_split(tl.load(context_lens + seq), UNIT, MAX_PARTS)
    if live > 1:
        first = (seq * tl.num_programs(1) + kvh) * grid_parts
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        for part in range(0, live):
            m = tl.maximum(m, tl.load(part_max + (first + part) * GROUP + g, mask=gmask,
                                      other=float("-inf")))  # fmt: skip
        total = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for part in range(0, live):
            base = (first + part) * GROUP
            pm = tl.load(part_max + base + g, mask=gmask, other=float("-inf"))
            w = tl.where(pm == float("-inf"), 0.0, tl.exp(pm - m))
            total += tl.load(part_sum + base + g, mask=gmask, other=0.0) * w
            ptrs = part_acc + (base + g[:, None]) * HEAD_DIM + d[None, :]
            acc += tl.load(ptrs, mask=real, other=0.0) * w[:, None]
        result = acc / tl.where(total > 0, total, 1.0)[:, None]
        heads = kvh * GROUP + g
        ptrs = out + seq * stride_on + heads[:, None] * stride_oh + d[None, :]
        tl.store(ptrs, result.to(out.dtype.element_ty), mask=real)


def decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_context: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """query [n, heads, head_dim], one token per sequence -> [n, heads, head_dim], written
    into ``out`` when given (a strided view of the step's output: no copy after).

    ``max_context`` (at least the longest context) only sizes the grid: each sequence splits
    its own context (``_live_split``), so under a CUDA graph captured for the longest
    context a short sequence still runs one partition and skips the reduce pass."""
    n, num_heads, head_dim = query.shape
    num_kv_heads, _, block_size, _ = k_cache.shape
    group = num_heads // num_kv_heads
    block_g, block_d = max(16, triton.next_power_of_2(group)), triton.next_power_of_2(head_dim)
    unit = max(PARTITION_SIZE, block_size)  # powers of two: a multiple of both
    _, grid_parts = decode_partitions(max_context, block_size)
    if out is None:
        out = torch.empty_like(query)
    if grid_parts > 1:
        shape = (n, num_kv_heads, grid_parts, group)
        part_max = torch.empty(shape, dtype=torch.float32, device=query.device)
        part_sum = torch.empty_like(part_max)
        part_acc = torch.empty((*shape, head_dim), dtype=torch.float32, device=query.device)
    else:  # one partition per sequence: the kernel writes the output, never a partial
        part_max = part_sum = part_acc = torch.empty(1, dtype=torch.float32, device=query.device)
    head_stride = k_cache.shape[1] * block_size * head_dim
    args = dict(
        query=query, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
        context_lens=context_lens, out=out, part_acc=part_acc, part_max=part_max,
        part_sum=part_sum, stride_qn=query.stride(0), stride_qh=query.stride(1),
        stride_on=out.stride(0), stride_oh=out.stride(1), stride_bt=block_tables.stride(0),
        cache_head_stride=head_stride, scale=scale,
    )  # fmt: skip
    shared = dict(GROUP=group, BLOCK_G=block_g, HEAD_DIM=head_dim, BLOCK_D=block_d, UNIT=unit,
                  MAX_PARTS=MAX_PARTITIONS)  # fmt: skip
    constexprs = dict(shared, BLOCK_SIZE=block_size, UPCAST=_upcast(query))
    grid = (n, num_kv_heads, grid_parts)
    launch(_decode_kernel, grid, "decode_attention", args, constexprs, _DECODE_UNSPECIALISED)
    if grid_parts > 1:
        args = dict(
            out=out, part_acc=part_acc, part_max=part_max, part_sum=part_sum,
            context_lens=context_lens, stride_on=out.stride(0), stride_oh=out.stride(1),
            grid_parts=grid_parts,
        )  # fmt: skip
        launch(_reduce_kernel, grid[:2], "decode_reduce", args, shared, _REDUCE_UNSPECIALISED)
    return out


def decode_partitions(max_context: int, block_size: int) -> tuple[int, int]:
    """(tokens per partition, partitions) of the longest context: at most MAX_PARTITIONS,
    each a multiple of PARTITION_SIZE and of the block size (a partition starts on a block
    edge). The partitions' count is the decode grid's third dimension."""
    unit = max(PARTITION_SIZE, block_size)  # powers of two: a multiple of both
    needed = max(1, triton.cdiv(max_context, unit))
    partition = unit * triton.cdiv(needed, MAX_PARTITIONS)
    return partition, max(1, triton.cdiv(max_context, partition))


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
        UPCAST=_upcast(query),
    )  # fmt: skip
    grid = (triton.cdiv(q_len, block_m), num_heads)
    launch(_prefill_kernel, grid, "prefill_attention", args, constexprs, _PREFILL_UNSPECIALISED)
    return out
