"""Triton decode attention for the CUDA path: one query token per sequence, the paged KV
cache read in place (layout ``[kv_heads, num_blocks, block_size, head_dim]``).

One program per (sequence, KV head, context partition) handles that KV head's group of
query heads, so each K/V row is read once per group; an online softmax per partition
(``triton_attention.online_softmax_step``), then a reduction pass combines partitions
(split-K for long contexts). Each sequence splits its own context from its device-side length, so
under a CUDA graph sized for the longest context only its live partitions work, and a
sequence of one partition writes its output directly and skips the reduction; partials
are kept for the real query rows only. A row of context 0 (padding) comes out as zeros.

No recompiles while serving: the decode kernels' specialisation does not depend on the
context length. A sequence uses at most ``MAX_PARTITIONS`` partitions of ``PARTITION_SIZE``
tokens; longer contexts get longer partitions (computed in the kernel from the sequence's
length), and the reduction loops over that sequence's live partitions. Arguments that vary
with the step are listed in ``do_not_specialize`` so not even their divisibility by 16
picks a variant. Launches go through ``tide_fleet.kernels.launch`` (device checks; the
record a test counts variants with).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tide_fleet.kernels.launch import launch
from tide_fleet.kernels.triton_attention import online_softmax_step, upcast_dots

PARTITION_SIZE = 512  # context tokens per decode program before the reduction pass (at least)
MAX_PARTITIONS = 16  # decode programs per (sequence, KV head); past 8k tokens partitions grow


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
        m_i, l_i, acc = online_softmax_step(q, k, v, visible, m_i, l_i, acc, scale, UPCAST)
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
    constexprs = dict(shared, BLOCK_SIZE=block_size, UPCAST=upcast_dots(query))
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
