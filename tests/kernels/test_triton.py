"""Triton kernels against the torch reference, in Triton's interpreter on CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from tests.conftest import make_engine
from tests.kernels.test_attention import dense_reference, slots_of
from tide_fleet.kernels import paged_attention, set_attention_backend, write_kv_cache
from tide_fleet.worker.engine import SamplingParams
from tide_fleet.worker.engine.scheduler import ScheduledRequest
from tide_fleet.worker.engine.step_inputs import build_step_inputs


@pytest.fixture
def triton_backend():
    set_attention_backend("triton")
    yield
    set_attention_backend("auto")


def run_mixed_step(ratio, head_dim, block_size, dtype, seqs, seed=0):
    """Attention for one flattened step through the active backend, and the dense reference."""
    gen = torch.Generator().manual_seed(seed)
    kvh = 2
    heads = kvh * ratio
    num_blocks = sum(-(-n // block_size) for n, _ in seqs) + 2
    k_cache = torch.zeros(kvh, num_blocks, block_size, head_dim, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    data, scheduled = {}, []
    for i, (n, cached) in enumerate(seqs):
        nb = -(-n // block_size)
        table, free = free[:nb], free[nb:]
        q, k, v = (torch.randn(n, h, head_dim, generator=gen).to(dtype) for h in (heads, kvh, kvh))
        data[f"r{i}"] = (q, k, v)
        if cached:
            write_kv_cache(
                k[:cached], v[:cached], k_cache, v_cache, slots_of(table, range(cached), block_size)
            )
        scheduled.append(ScheduledRequest(f"r{i}", [0] * (n - cached), cached, table, True))
    step = build_step_inputs(scheduled, block_size, torch.device("cpu"))
    q, k, v = (
        torch.cat([data[s.request_id][j][s.start_pos :] for s in step.order]) for j in range(3)
    )
    write_kv_cache(k, v, k_cache, v_cache, step.meta.slot_mapping)
    out = paged_attention(q, k, v, k_cache, v_cache, step.meta, head_dim**-0.5)
    row, pairs = 0, []
    for s in step.order:
        ref = dense_reference(*data[s.request_id], head_dim**-0.5)[s.start_pos :]
        pairs.append((out[row : row + s.num_tokens].float(), ref, s.request_id))
        row += s.num_tokens
    return pairs


# (length, cached): a 1-token context, decodes not on block boundaries, a fresh
# prefill, and a prefill chunk after a cached prefix.
SEQS = [(1, 0), (5, 4), (17, 16), (40, 39), (23, 0), (50, 19)]


@pytest.mark.parametrize("ratio", [1, 2, 4, 8])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_matches_the_reference(triton_backend, ratio, block_size, dtype):
    tol = 2e-3 if dtype == torch.float32 else 3e-2
    for got, ref, name in run_mixed_step(ratio, 16, block_size, dtype, SEQS, seed=ratio):
        torch.testing.assert_close(got, ref, atol=tol, rtol=tol, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("head_dim", [64, 128])
def test_triton_realistic_head_dims_and_split_context(triton_backend, head_dim):
    # 700 tokens: more than one 512-token partition, so the reduction pass runs.
    seqs = [(700, 699), (3, 2), (40, 0), (70, 33)]
    for got, ref, name in run_mixed_step(4, head_dim, 16, torch.bfloat16, seqs):
        torch.testing.assert_close(got, ref, atol=3e-2, rtol=3e-2, msg=name)


@pytest.mark.slow
def test_batching_equivalence_holds_on_the_triton_path(tiny_path):
    """The engine's batching test (chunked prefill, prefix hits, preemption) on Triton."""
    from tests.worker.test_batching import _workload

    # Six requests, at most 12 tokens each, on 14 blocks: still chunked prefill, prefix
    # hits and preemption, at 40% of the interpreter's time for twelve full ones.
    prompts, params = _workload(0, 6)
    params = [dataclasses.replace(p, max_tokens=min(p.max_tokens, 12)) for p in params]
    config = {"num_kv_blocks": 14, "max_num_batched_tokens": 48, "max_num_seqs": 8}
    alone = make_engine(tiny_path, attention_backend="torch", enable_prefix_caching=False)
    expected = [
        alone.generate([p], [sp])[0].token_ids for p, sp in zip(prompts, params, strict=True)
    ]
    engine = make_engine(tiny_path, attention_backend="triton", **config)
    try:
        got = [o.token_ids for o in engine.generate(prompts, params)]
    finally:
        set_attention_backend("auto")
    assert got == expected
    stats = engine.stats()
    assert stats["num_preemptions"] > 0 and stats["prefix_cache_hits"] > 0
    engine.block_manager.assert_all_free()


def test_the_engine_gives_the_same_tokens_with_triton_forced(tiny_path):
    prompts = [[1, *range(5, 5 + n)] for n in (3, 20, 41)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    torch_run = make_engine(tiny_path, num_kv_blocks=32, attention_backend="torch")
    expected = [o.token_ids for o in torch_run.generate(prompts, params)]
    triton_run = make_engine(tiny_path, num_kv_blocks=32, attention_backend="triton",
                             max_num_batched_tokens=24)  # fmt: skip
    try:
        got = [o.token_ids for o in triton_run.generate(prompts, params)]
    finally:
        set_attention_backend("auto")
    assert got == expected
    triton_run.block_manager.assert_all_free()


def test_triton_refuses_shapes_a_gpu_compile_rejects(tiny_path):
    # tl.dot operands must be >= 16 in each dimension: block_size 8 would make a
    # [16, 8] tile. (Query groups are padded to 16; per-chunk prefill tiles are 16 or 32 rows.)
    with pytest.raises(ValueError, match="block_size >= 16"):
        make_engine(tiny_path, block_size=8, attention_backend="triton")
    set_attention_backend("auto")
