"""A CPU tensor reaching a GPU kernel fails here, on CPU.

Triton's interpreter takes CPU pointers that a compiled kernel refuses, so CI cannot see
that bug by running kernels. Instead the model lives on the ``meta`` device (shapes, no
data: an 8B model costs nothing) and attention is replaced by stand-ins that check every
tensor they get against the query's device, then return an empty result. The runner's
profiling run (a max-size mixed step, a decode step at max_num_seqs, a small chunk) and
an ordinary step must pass through them.
"""

from __future__ import annotations

import pytest
import torch

from tide_fleet.kernels.attention_metadata import AttentionMetadata, PrefillChunk
from tide_fleet.kernels.launch import DeviceMismatch, check_devices
from tide_fleet.worker.engine.config import EngineConfig
from tide_fleet.worker.engine.model_runner import ModelRunner
from tide_fleet.worker.engine.scheduler import ScheduledRequest, SchedulerOutput
from tide_fleet.worker.models.random_model import SHAPES, build_random_model

META = torch.device("meta")


@pytest.fixture
def checked_attention(monkeypatch):
    """Attention and KV writes that only check devices; the steps they saw."""
    from tide_fleet.worker.models import llama

    steps: list[tuple[int, int, list[int]]] = []  # (tokens, decode rows, prefill lengths)

    def write_kv_cache(key, value, k_cache, v_cache, slot_mapping):  # type: ignore[no-untyped-def]
        check_devices("write_kv_cache", dict(key=key, value=value, k_cache=k_cache,
                      v_cache=v_cache, slot_mapping=slot_mapping))  # fmt: skip

    def paged_attention(query, key, value, k_cache, v_cache, meta, scale, out=None):  # type: ignore[no-untyped-def]
        check_devices("paged_attention", {"query": query, "k_cache": k_cache, **meta.tensors()})
        decodes = sum(g.rows.stop - g.rows.start for g in meta.decode_groups)
        steps.append((query.shape[0], decodes, [c.rows.stop - c.rows.start for c in meta.prefills]))
        return torch.empty_like(query) if out is None else out

    monkeypatch.setattr(llama, "write_kv_cache", write_kv_cache)
    monkeypatch.setattr(llama, "paged_attention", paged_attention)
    return steps


def test_a_cpu_block_table_beside_a_device_query_is_caught(checked_attention):
    # A start-up crash: the profiling run's block table from torch.arange on the host.
    from tide_fleet.worker.models import llama

    meta = AttentionMetadata(slot_mapping=torch.arange(4, device=META), block_size=16)
    meta.prefills.append(PrefillChunk(slice(0, 4), 0, torch.arange(1)))  # CPU
    q = torch.empty(4, 2, 16, device=META)
    cache = torch.empty(2, 1, 16, 16, device=META)
    with pytest.raises(DeviceMismatch, match=r"prefills\[0\].block_table is on cpu"):
        llama.paged_attention(q, q, q, cache, cache, meta, 1.0)


@pytest.mark.parametrize("shape", ["llama3-8b", "qwen2.5-7b"])
def test_the_profile_run_keeps_every_tensor_on_the_models_device(checked_attention, shape):
    model = build_random_model(SHAPES[shape], META, torch.bfloat16)
    config = EngineConfig(num_kv_blocks=64, max_num_seqs=8, max_num_batched_tokens=256)
    runner = ModelRunner(model, config, 8192)
    layers = model.config.num_layers
    # Per layer: the max-size mixed step (7 decodes + a 249-token prefill, 8 sampled
    # rows), a decode step at max_num_seqs, and a 16-token chunk after a cached block.
    assert (
        checked_attention
        == [(256, 7, [249])] * layers + [(8, 8, [])] * layers + [(16, 0, [16])] * layers
    )
    assert all(k.device == META for k, _ in runner.kv_caches)


def test_a_served_step_keeps_every_tensor_on_the_models_device(checked_attention):
    model = build_random_model(SHAPES["tiny"], META, torch.float32)
    runner = ModelRunner(model, EngineConfig(num_kv_blocks=16, max_num_seqs=4), 512)
    checked_attention.clear()
    step = SchedulerOutput([
        ScheduledRequest("a", [1], 20, [0, 1], True),
        ScheduledRequest("b", [1, 2, 3], 16, [2, 3], True),
    ])  # fmt: skip
    result = runner.execute(step)
    assert result.logits.device == META and result.sampled_ids == ["a", "b"]
    assert checked_attention == [(4, 1, [3])] * model.config.num_layers


def test_the_engine_starts_on_a_non_cpu_device(checked_attention):
    from tide_fleet.worker.engine.llm_engine import LLMEngine

    model = build_random_model(SHAPES["tiny"], META, torch.float32)
    engine = LLMEngine(model, None, EngineConfig(num_kv_blocks=16, max_num_seqs=4))
    assert engine.runner.num_blocks == 16 and checked_attention


def test_a_device_without_a_budget_rule_asks_for_an_explicit_pool(checked_attention):
    model = build_random_model(SHAPES["tiny"], META, torch.float32)
    with pytest.raises(ValueError, match="no KV budget rule for device meta"):
        ModelRunner(model, EngineConfig(max_num_seqs=4), 512)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_the_profile_run_executes_on_real_kernels(tiny_path, backend):
    """Its steps are valid steps: real attention (Triton in the interpreter) runs them."""
    from tests.conftest import make_engine
    from tide_fleet.kernels import set_attention_backend

    engine = make_engine(tiny_path, num_kv_blocks=8, attention_backend=backend,
                         max_num_seqs=4, max_num_batched_tokens=64)  # fmt: skip
    try:
        cache_bytes = engine.runner.profile_run()
    finally:
        set_attention_backend("auto")
    cfg = engine.model.config
    blocks = -(-(64 - 3) // 16) + 4
    assert cache_bytes == 2 * cfg.num_layers * cfg.num_kv_heads * blocks * 16 * cfg.head_dim * 4
