"""Paged attention (torch reference) against dense causal attention on the same data."""

from __future__ import annotations

import pytest
import torch

from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.kernels import paged_attention, set_attention_backend, write_kv_cache
from tide_fleet.worker.engine.config import EngineConfig
from tide_fleet.worker.engine.scheduler import ScheduledRequest
from tide_fleet.worker.engine.step_inputs import build_step_inputs


def dense_reference(q, k, v, scale):
    """q [L, H, D] at positions 0..L-1 of one sequence; k, v [L, KVH, D]."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).float()
    v = v.repeat_interleave(group, dim=1).float()
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    causal = torch.ones(q.shape[0], q.shape[0], dtype=torch.bool).triu(1)
    return torch.einsum("hqk,khd->qhd", scores.masked_fill(causal, float("-inf")).softmax(-1), v)


def slots_of(table: list[int], positions: range, block_size: int) -> torch.Tensor:
    return torch.tensor([table[p // block_size] * block_size + p % block_size for p in positions])


@pytest.fixture(params=["torch", "cpp"])
def backend(request):
    if request.param == "cpp" and cpu_kernels.ops() is None:
        pytest.skip("native CPU kernels could not be built here (see the log)")
    set_attention_backend(request.param)
    yield request.param
    set_attention_backend("auto")


@pytest.mark.parametrize("ratio", [1, 2, 4])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hd", [16, 64])
@pytest.mark.parametrize("split", [True, False], ids=["groups", "one-group"])
def test_mixed_decode_and_prefill_rows(ratio, block_size, dtype, hd, split, backend):
    gen = torch.Generator().manual_seed(ratio * 100 + block_size + hd)
    kvh = 2
    heads = kvh * ratio
    # (length, tokens already cached): decodes of 1..300 tokens, a fresh prefill, a
    # prefill after a cached prefix.
    seqs = [(1, 0), (5, 4), (37, 36), (300, 299), (23, 0), (50, 17)]
    num_blocks = sum(-(-n // block_size) for n, _ in seqs) + 3
    k_cache = torch.zeros(kvh, num_blocks, block_size, hd, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    free = torch.randperm(num_blocks, generator=gen).tolist()  # scattered blocks
    data, scheduled = {}, []
    for i, (n, cached) in enumerate(seqs):
        table, free = free[: -(-n // block_size)], free[-(-n // block_size) :]
        q, k, v = (torch.randn(n, h, hd, generator=gen).to(dtype) for h in (heads, kvh, kvh))
        data[f"r{i}"] = (q, k, v)
        if cached:
            slots = slots_of(table, range(cached), block_size)
            write_kv_cache(k[:cached], v[:cached], k_cache, v_cache, slots)
        scheduled.append(ScheduledRequest(f"r{i}", [0] * (n - cached), cached, table, True))
    step = build_step_inputs(scheduled, block_size, torch.device("cpu"), split_decodes=split)
    if split:
        assert len(step.meta.decode_groups) >= 2, "lengths 1..300 should form several groups"
    else:
        assert len(step.meta.decode_groups) == 1
    q, k, v = (
        torch.cat([data[s.request_id][j][s.start_pos :] for s in step.order]) for j in range(3)
    )
    write_kv_cache(k, v, k_cache, v_cache, step.meta.slot_mapping)
    scale = hd**-0.5
    out = paged_attention(q, k, v, k_cache, v_cache, step.meta, scale)
    tol = 1e-5 if dtype == torch.float32 else 2e-2 * (hd / 16) ** 0.5
    row = 0
    for s in step.order:
        ref = dense_reference(*data[s.request_id], scale)[s.start_pos :]
        got = out[row : row + s.num_tokens].float()
        torch.testing.assert_close(got, ref, atol=tol, rtol=tol, msg=f"sequence {s.request_id}")
        row += s.num_tokens


def test_engine_config_rejects_bad_values():
    with pytest.raises(ValueError, match="block_size must be a power of two, got 12"):
        EngineConfig(block_size=12)
    with pytest.raises(ValueError, match="kv_cache_memory must be positive"):
        EngineConfig(kv_cache_memory=0)


def test_auto_falls_back_to_torch_where_the_triton_kernels_cannot_take_the_shape():
    # stories260K (head_dim 8) on a GPU: auto must not pick kernels that refuse the shape.
    from tide_fleet.kernels.attention import resolve_backend

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert resolve_backend("auto", cuda, block_size=16, head_dim=128) == "auto"  # triton
    assert resolve_backend("auto", cuda, block_size=16, head_dim=8) == "torch"
    assert resolve_backend("auto", cuda, block_size=8, head_dim=64) == "torch"
    assert resolve_backend("auto", cpu, block_size=16, head_dim=8) == "auto"
    assert resolve_backend("torch", cuda, block_size=16, head_dim=8) == "torch"
    with pytest.raises(ValueError, match="head_dim >= 16, got block_size 16, head_dim 8"):
        resolve_backend("triton", cuda, block_size=16, head_dim=8)
