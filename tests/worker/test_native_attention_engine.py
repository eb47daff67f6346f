"""The native bf16 attention kernels (AMX tiles or AVX-512 BF16) inside real engine steps:
every attention call of a bf16 model with 32-wide heads (dummy:small), on chunked prompts
after cached prefixes and decode rows sharing a system prompt, is checked against the same
call on SDPA and the per-row decode kernel. (Comparing greedy tokens would not do: the
random model's top tokens are within 0.01 nats, and its logits barely move when attention
does.)"""

from __future__ import annotations

import random

import pytest
import torch

from tests.conftest import make_engine
from tide_fleet.kernels import attention
from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.worker.engine import SamplingParams
from tide_fleet.worker.models import llama_native as llama

pytestmark = pytest.mark.skipif(
    not cpu_kernels.native_prefill(), reason="no AMX tiles or AVX-512 BF16 here"
)


@pytest.fixture
def small_path(_dummy_cache):
    from tide_fleet.worker.models.resolve import resolve_model_path

    return resolve_model_path("dummy:small")


def test_native_kernels_match_sdpa_in_engine_steps(small_path, monkeypatch):
    rng = random.Random(5)
    system = [1, *(rng.randrange(4, 260) for _ in range(320))]
    prompts = [system + [rng.randrange(4, 260) for _ in range(10)] for _ in range(6)]
    prompts.append([1, *(rng.randrange(4, 260) for _ in range(300))])  # no shared prefix
    seen = {"prefix_chunks": 0, "shared_decodes": 0}

    def checked(query, key, value, k_cache, v_cache, meta, scale):
        got = attention.paged_attention(query, key, value, k_cache, v_cache, meta, scale)
        attention.set_native_prefill(False)
        try:
            want = attention.paged_attention(query, key, value, k_cache, v_cache, meta, scale)
        finally:
            attention.set_native_prefill(True)
        # within two bf16 steps of 1.0 (both round their output to bf16)
        torch.testing.assert_close(got.float(), want.float(), atol=8e-3, rtol=8e-3)
        seen["prefix_chunks"] += sum(c.start_pos > 0 for c in meta.prefills)
        seen["shared_decodes"] += any(
            attention.shared_prefix_tokens(g, meta.block_size) for g in meta.decode_groups
        )
        return got

    monkeypatch.setattr(llama, "paged_attention", checked)
    # 128-token steps: prompts arrive in chunks, most after a cached prefix.
    engine = make_engine(small_path, "bfloat16", max_num_batched_tokens=128)
    # The op-by-op loop, whose attention calls the check wraps (the one-call step runs the
    # same kernels from C++: tests/kernels/test_step_packed.py holds the two equal).
    engine.runner.model._packed_weights = []
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outs = engine.generate(prompts, [params] * len(prompts))
    assert [len(o.token_ids) for o in outs] == [6] * len(prompts)
    assert seen["prefix_chunks"] > 0, "no chunk ran after a cached prefix"
    assert seen["shared_decodes"] > 0, "no decode step shared a prefix"
