"""The varlen prefill kernel (every prefill chunk of a step in one launch) against the torch
reference per chunk, in Triton's interpreter on CPU; its specialisation and device checks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from tide_fleet.kernels import paged_attention, set_attention_backend, torch_attention
from tide_fleet.kernels.attention_metadata import AttentionMetadata, PrefillBatch, PrefillChunk
from tide_fleet.kernels.launch import DeviceMismatch, record_launches
from tide_fleet.kernels.triton_prefill import pack_prefills, prefill_attention_varlen, tile_shape

BS = 16
# (num_tokens, start_pos): a fresh chunk not a multiple of any tile; a short one after a
# prefix that ends mid-block; one after a block-aligned prefix; one spanning several tiles
# after a 3-token prefix; a single token.
SPECS = [(37, 0), (5, 21), (16, 16), (70, 3), (1, 40)]


@dataclasses.dataclass
class Step:
    query: torch.Tensor  # [T, heads, head_dim]; the prefill rows are first_row..T
    key: torch.Tensor  # [T, kv_heads, head_dim]: the step's new K/V (already in the cache)
    value: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    chunks: list[PrefillChunk]
    batch: PrefillBatch


def make_step(specs, group, head_dim=16, dtype=torch.float32, first_row=3, kvh=2, seed=0):
    """Random K/V for each chunk's whole context, written to shuffled cache blocks."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-(s + n) // BS) for n, s in specs]
    num_blocks = sum(needed) + 1
    k_cache = torch.zeros(kvh, num_blocks, BS, head_dim, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    rows = first_row + sum(n for n, _ in specs)
    query, key, value = (
        torch.randn(rows, h, head_dim, generator=gen).to(dtype) for h in (kvh * group, kvh, kvh)
    )
    free = torch.randperm(num_blocks, generator=gen).tolist()
    chunks, packed, row = [], [], first_row
    for (n, start), nb in zip(specs, needed, strict=True):
        ids, free = free[:nb], free[nb:]
        prefix_k, prefix_v = (
            torch.randn(start, kvh, head_dim, generator=gen).to(dtype) for _ in "kv"
        )
        k = torch.cat([prefix_k, key[row : row + n]])
        v = torch.cat([prefix_v, value[row : row + n]])
        slots = torch.tensor([ids[p // BS] * BS + p % BS for p in range(start + n)])
        torch_attention.write_kv_cache(k, v, k_cache, v_cache, slots)
        chunks.append(PrefillChunk(slice(row, row + n), start, torch.tensor(ids)))
        packed.append((n, start, ids))
        row += n
    batch = pack_prefills(packed, first_row, "cpu")
    return Step(query, key, value, k_cache, v_cache, chunks, batch)


def references(step: Step, scale: float) -> list[torch.Tensor]:
    args = (step.query, step.key, step.value, step.k_cache, step.v_cache)
    return [torch_attention.prefill_attention(*args, c, scale).float() for c in step.chunks]


@pytest.mark.parametrize(
    ("group", "head_dim", "dtype"),
    [
        (1, 16, torch.float32),
        (4, 16, torch.float32),
        (3, 32, torch.float32),  # a group padded from 3 to 4 heads
        (1, 32, torch.bfloat16),
        (4, 16, torch.bfloat16),
        (3, 16, torch.bfloat16),
    ],
)
def test_one_launch_matches_the_reference_per_chunk(group, head_dim, dtype):
    step = make_step(SPECS, group, head_dim, dtype, seed=group)
    scale = head_dim**-0.5
    out = prefill_attention_varlen(step.query, step.k_cache, step.v_cache, step.batch, scale)
    first = step.batch.first_row
    assert out.shape == (step.query.shape[0] - first, *step.query.shape[1:])
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    for chunk, ref in zip(step.chunks, references(step, scale), strict=True):
        got = out[chunk.rows.start - first : chunk.rows.stop - first].float()
        torch.testing.assert_close(got, ref, atol=tol, rtol=tol, msg=f"chunk at {chunk.rows}")


def test_writing_into_out_leaves_the_rows_before_the_prefills_alone():
    step = make_step(SPECS[:3], group=2)
    out = torch.full_like(step.query, 7.0)
    got = prefill_attention_varlen(step.query, step.k_cache, step.v_cache, step.batch, 0.25, out)
    assert got is out
    assert bool((out[: step.batch.first_row] == 7.0).all())
    for chunk, ref in zip(step.chunks, references(step, 0.25), strict=True):
        torch.testing.assert_close(out[chunk.rows], ref, atol=2e-5, rtol=2e-5)


def test_paged_attention_makes_one_varlen_call_when_the_batch_is_packed(monkeypatch):
    from tide_fleet.kernels import triton_attention

    def per_chunk(*args, **kwargs):
        raise AssertionError("the per-chunk kernel ran")

    monkeypatch.setattr(triton_attention, "prefill_attention", per_chunk)
    step = make_step(SPECS[:3], group=2, first_row=0)
    meta = AttentionMetadata(slot_mapping=torch.zeros(0, dtype=torch.long), block_size=BS,
                             prefills=step.chunks, prefill_batch=step.batch)  # fmt: skip
    set_attention_backend("triton")
    try:
        got = paged_attention(
            step.query, step.key, step.value, step.k_cache, step.v_cache, meta, 0.25
        )
    finally:
        set_attention_backend("auto")
    for chunk, ref in zip(step.chunks, references(step, 0.25), strict=True):
        torch.testing.assert_close(got[chunk.rows], ref, atol=2e-5, rtol=2e-5)


def test_pack_prefills_pads_tables_and_accumulates_lengths():
    batch = pack_prefills([(5, 0, [3]), (2, 17, [4, 1]), (9, 3, [6])], 4, "cpu")
    assert batch.first_row == 4 and batch.max_query_len == 9
    assert batch.query_start.tolist() == [0, 5, 7, 16]
    assert batch.start_pos.tolist() == [0, 17, 3]
    assert batch.block_tables.tolist() == [[3, 0], [4, 1], [6, 0]]
    assert (batch.query_start.dtype, batch.start_pos.dtype) == (torch.int32, torch.int32)
    assert batch.block_tables.dtype == torch.int64
    empty = pack_prefills([], 0, "cpu")
    assert empty.query_start.tolist() == [0] and empty.block_tables.shape == (0, 1)


def test_tiles_have_at_least_16_rows_for_any_group():
    for group in (1, 2, 3, 4, 5, 8, 16, 64, 128):
        block_m, block_g = tile_shape(group)
        assert block_g >= group and block_m * block_g >= 16


def test_steps_of_any_shape_share_one_variant():
    # Chunk counts 1..4, table widths 1, 3, 16, first rows 0, 1, 16, tokens up to 256.
    steps = [
        ([(16, 0)], 1),
        ([(37, 0), (5, 21)], 0),
        ([(70, 3), (1, 40), (20, 0), (6, 250)], 16),
    ]
    with record_launches() as keys:
        for specs, first_row in steps:
            step = make_step(specs, group=2, first_row=first_row)
            prefill_attention_varlen(step.query, step.k_cache, step.v_cache, step.batch, 0.25)
    assert len(keys) == 1


@pytest.mark.parametrize("name", ["block_tables", "query_start", "start_pos"])
def test_every_tensor_is_device_checked(monkeypatch, name):
    from tide_fleet.kernels import launch as launch_module

    monkeypatch.setattr(launch_module, "CHECK_DEVICES", True)  # on under the interpreter
    step = make_step(SPECS[:2], group=1)
    batch = dataclasses.replace(step.batch, **{name: getattr(step.batch, name).to("meta")})
    with pytest.raises(DeviceMismatch, match=f"{name} is on meta"):
        prefill_attention_varlen(step.query, step.k_cache, step.v_cache, batch, 0.25)
