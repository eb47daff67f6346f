"""Triton decode attention splits each sequence's own context: under a grid sized for a
long context (a CUDA graph's), short sequences run one partition and write their output
directly, long ones combine only their live partitions; rows land in a given output view."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tests.kernels.test_attention import dense_reference
from tide_fleet.kernels import triton_decode as tk


def _batch(contexts: list[int], kvh: int = 2, heads: int = 8, hd: int = 32, bs: int = 16):
    gen = torch.Generator().manual_seed(sum(contexts))
    width = max(1, -(-max(contexts) // bs))
    k_cache = torch.randn(kvh, width * len(contexts), bs, hd, generator=gen)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(width * len(contexts), generator=gen).view(len(contexts), width)
    query = torch.randn(len(contexts), heads, hd, generator=gen)
    lens = torch.tensor(contexts, dtype=torch.int32)
    return query, k_cache, v_cache, tables, lens


def _reference(query, k_cache, v_cache, table, context):
    kvh, _, _, hd = k_cache.shape
    if context == 0:  # a padding row attends to nothing
        return torch.zeros(query.shape[0], hd)
    k = k_cache[:, table].reshape(kvh, -1, hd)[:, :context].transpose(0, 1)
    v = v_cache[:, table].reshape(kvh, -1, hd)[:, :context].transpose(0, 1)
    q = torch.zeros(context, query.shape[0], hd)
    q[-1] = query
    return dense_reference(q, k, v, hd**-0.5)[-1]


@pytest.mark.parametrize("grid_context", [1300, 4096])
def test_short_long_and_empty_rows_under_a_long_grid(grid_context):
    contexts = [40, 512, 513, 1300, 0]
    query, k_cache, v_cache, tables, lens = _batch(contexts)
    out = tk.decode_attention(query, k_cache, v_cache, tables, lens, 32**-0.5, grid_context)
    for i, context in enumerate(contexts):
        ref = _reference(query[i], k_cache, v_cache, tables[i], context)
        torch.testing.assert_close(out[i], ref, atol=2e-3, rtol=2e-3)


def test_rows_are_written_into_the_given_view_and_nothing_else():
    contexts = [30, 900]
    query, k_cache, v_cache, tables, lens = _batch(contexts, kvh=1, heads=1, hd=16)
    step = torch.full((5, 1, 16), 7.0)  # rows 1 and 2 are this group's
    got = tk.decode_attention(query, k_cache, v_cache, tables, lens, 0.25, 900, out=step[1:3])
    assert got.data_ptr() == step[1].data_ptr()
    assert torch.equal(step[0], torch.full((1, 16), 7.0))
    assert torch.equal(step[3:], torch.full((2, 1, 16), 7.0))
    for i, context in enumerate(contexts):
        ref = _reference(query[i], k_cache, v_cache, tables[i], context)
        torch.testing.assert_close(step[1 + i], ref, atol=2e-3, rtol=2e-3)


def test_a_sequence_splits_by_its_own_length():
    """The partitions a sequence of each length works in: at most MAX_PARTITIONS, a
    multiple of the unit, covering its context (what _live_split computes in the kernel)."""
    unit = tk.PARTITION_SIZE
    for context in (1, 512, 513, 8192, 8193, 100_000):
        partition, live = tk.decode_partitions(context, 16)
        assert partition % unit == 0 and 1 <= live <= tk.MAX_PARTITIONS
        assert (live - 1) * partition < context <= live * partition
