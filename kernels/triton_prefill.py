"""Varlen prefill attention for the CUDA path: every prefill chunk of a step in one launch.

The per-chunk kernel in ``tide_fleet.kernels.triton_attention`` launches once per chunk with one
program per query head, so each K/V tile is read once per head of a GQA group. Here one
program handles one (chunk, query tile, KV head): its Q tile is ``BLOCK_M`` tokens times
the group's query heads, flattened to rows (token-major), so each K/V tile is read once
per group and the whole step is one launch.

Chunk c's query row i sits at position ``start_pos[c] + i`` and sees keys ``0 ..=
start_pos[c] + i`` (its own K/V are in the cache already: the KV write runs first). Key
tiles are cache blocks; those wholly before the tile's first query run unmasked, the rest
up to the tile's last query causally masked, and none past it are read.

No recompiles while serving: the grid carries the chunk count and longest chunk, chunk
lengths and prefixes are read from tensors, and the step-varying ints (``first_row``,
the block table width) are in ``do_not_specialize``. ``tl.dot`` needs every dimension
>= 16: block_size >= 16, head_dim >= 16 (padded to a power of two), and Q tiles of at
least 16 rows. The prefill rows are the tail of the step's batch (decode rows come
first), so their count is known without reading ``query_start`` back from the device.
"""

from __future__ import annotations

from itertools import accumulate

import torch
import triton
import triton.language as tl

from tide_fleet.kernels.attention_metadata import PrefillBatch
from tide_fleet.kernels.launch import launch
from tide_fleet.kernels.triton_attention import INTERPRETED

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): the scale is folded into log2 units

_UNSPECIALISED = ("stride_bt", "first_row", "out_first_row")


@triton.jit  # type: ignore[untyped-decorator]
def _fold_block(  # type: ignore[no-untyped-def]
    q, k_cache, v_cache, table, kv_base, pos, q_pos, last, m_i, l_i, acc, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Fold the cache block holding keys pos.. into the online softmax (max, sum, acc)."""
    n = tl.arange(0, BLOCK_SIZE)
    d = tl.arange(0, BLOCK_D)
    block = tl.load(table + pos // BLOCK_SIZE).to(tl.int64)
    offs = kv_base + (block * BLOCK_SIZE + n)[:, None] * HEAD_DIM + d[None, :]
    k_pos = pos + n
    kmask = (d < HEAD_DIM)[None, :]
    if CAUSAL:
        kmask = kmask & (k_pos < last)[:, None]
    k = tl.load(k_cache + offs, mask=kmask, other=0.0)
    v = tl.load(v_cache + offs, mask=kmask, other=0.0)
    if UPCAST:
        k, v = k.to(tl.float32), v.to(tl.float32)
    s = tl.dot(q, tl.trans(k)).to(tl.float32) * qk_scale
    if CAUSAL:
        s = tl.where(k_pos[None, :] <= q_pos[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=_UNSPECIALISED)  # type: ignore[untyped-decorator]
def _varlen_prefill_kernel(  # type: ignore[no-untyped-def]
    out, query, k_cache, v_cache, query_start, start_pos, block_tables,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    cache_head_stride, qk_scale, first_row, out_first_row,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_SIZE: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    chunk = tl.program_id(0)
    tile = tl.program_id(1)
    kvh = tl.program_id(2)
    q_begin = tl.load(query_start + chunk)
    q_len = tl.load(query_start + chunk + 1) - q_begin
    if tile * BLOCK_M >= q_len:
        return  # the grid is sized for the longest chunk
    start = tl.load(start_pos + chunk)
    r = tl.arange(0, BLOCK_M * BLOCK_G)
    m = tile * BLOCK_M + r // BLOCK_G  # the row's token within the chunk
    g = r % BLOCK_G  # the row's query head within the group
    d = tl.arange(0, BLOCK_D)
    row_mask = (m < q_len) & (g < GROUP)
    io_mask = row_mask[:, None] & (d < HEAD_DIM)[None, :]
    heads = (kvh * GROUP + g)[:, None]
    q_rows = (first_row + q_begin + m).to(tl.int64)[:, None]
    q = tl.load(
        query + q_rows * stride_qt + heads * stride_qh + d[None, :], mask=io_mask, other=0.0
    )
    if UPCAST:
        q = q.to(tl.float32)
    q_pos = start + m
    first = start + tile * BLOCK_M  # the tile's first query position: keys before it all count
    last = start + tl.minimum((tile + 1) * BLOCK_M, q_len)  # one past the tile's last key
    table = block_tables + chunk.to(tl.int64) * stride_bt
    kv_base = kvh.to(tl.int64) * cache_head_stride
    m_i = tl.full([BLOCK_M * BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M * BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_M * BLOCK_G, BLOCK_D], tl.float32)
    unmasked_end = first // BLOCK_SIZE * BLOCK_SIZE
    for pos in range(0, unmasked_end, BLOCK_SIZE):
        m_i, l_i, acc = _fold_block(
            q, k_cache, v_cache, table, kv_base, pos, q_pos, last, m_i, l_i, acc, qk_scale,
            HEAD_DIM, BLOCK_D, BLOCK_SIZE, False, UPCAST,
        )  # fmt: skip
    for pos in range(unmasked_end, last, BLOCK_SIZE):
        m_i, l_i, acc = _fold_block(
            q, k_cache, v_cache, table, kv_base, pos, q_pos, last, m_i, l_i, acc, qk_scale,
            HEAD_DIM, BLOCK_D, BLOCK_SIZE, True, UPCAST,
        )  # fmt: skip
    # Every row sees key 0, so l_i > 0 (padding rows too: they are masked at the store).
    result = (acc / l_i[:, None]).to(out.dtype.element_ty)
    o_rows = (out_first_row + q_begin + m).to(tl.int64)[:, None]
    tl.store(out + o_rows * stride_ot + heads * stride_oh + d[None, :], result, mask=io_mask)


def tile_shape(group: int) -> tuple[int, int]:
    """(BLOCK_M tokens, BLOCK_G padded heads) of a Q tile: 64 rows for groups up to 4, 128
    above (fewer tokens per tile as the group grows), never under the 16 tl.dot needs."""
    block_g = triton.next_power_of_2(group)
    rows = 64 if block_g <= 4 else 128
    return max(1, rows // block_g), block_g


def prefill_attention_varlen(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: PrefillBatch,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention for every prefill chunk of a step, one launch.

    query: the step's ``[T, heads, head_dim]``; the prefill rows are ``first_row..T``.
    Returns them, ``[T - first_row, heads, head_dim]``; with ``out`` (shaped like query)
    they are written into ``out[first_row:]`` in place instead and ``out`` is returned.
    """
    num_rows, num_heads, head_dim = query.shape
    num_kv_heads, _, block_size, _ = k_cache.shape
    group = num_heads // num_kv_heads
    out_first_row = batch.first_row
    if out is None:
        out = query.new_empty((num_rows - batch.first_row, num_heads, head_dim))
        out_first_row = 0
    num_chunks = batch.start_pos.shape[0]
    if num_chunks == 0 or batch.max_query_len == 0:
        return out
    block_m, block_g = tile_shape(group)
    args = dict(
        out=out, query=query, k_cache=k_cache, v_cache=v_cache,
        query_start=batch.query_start, start_pos=batch.start_pos, block_tables=batch.block_tables,
        stride_qt=query.stride(0), stride_qh=query.stride(1),
        stride_ot=out.stride(0), stride_oh=out.stride(1), stride_bt=batch.block_tables.stride(0),
        cache_head_stride=k_cache.shape[1] * block_size * head_dim, qk_scale=scale * LOG2E,
        first_row=batch.first_row, out_first_row=out_first_row,
    )  # fmt: skip
    constexprs = dict(
        GROUP=group, BLOCK_G=block_g, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_M=block_m, BLOCK_SIZE=block_size,
        # The interpreter's bf16 tl.dot is wrong (see triton_attention.upcast_dots): fp32 there.
        UPCAST=INTERPRETED and query.dtype in (torch.bfloat16, torch.float16),
    )  # fmt: skip
    grid = (num_chunks, triton.cdiv(batch.max_query_len, block_m), num_kv_heads)
    launch(
        _varlen_prefill_kernel, grid, "prefill_attention_varlen", args, constexprs, _UNSPECIALISED
    )
    return out


def pack_prefills(
    chunks: list[tuple[int, int, list[int]]], first_row: int, device: torch.device | str
) -> PrefillBatch:
    """A PrefillBatch from (num_tokens, start_pos, block_ids) per chunk, in row order.

    Each chunk's block_ids must cover its context (start_pos + num_tokens tokens); the
    table is padded with block 0 to the widest chunk.
    """
    lengths = [n for n, _, _ in chunks]
    width = max((len(ids) for _, _, ids in chunks), default=0) or 1
    tables = [ids + [0] * (width - len(ids)) for _, _, ids in chunks]
    return PrefillBatch(
        first_row=first_row,
        query_start=torch.tensor([0, *accumulate(lengths)], dtype=torch.int32, device=device),
        start_pos=torch.tensor([s for _, s, _ in chunks], dtype=torch.int32, device=device),
        block_tables=torch.tensor(tables, dtype=torch.int64, device=device).view(-1, width),
        max_query_len=max(lengths, default=0),
    )
