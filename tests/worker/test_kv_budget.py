"""The CUDA KV budget (worker/engine/kv_budget.py) on the numbers of real GPUs, on CPU.

An 8B bf16 model (Llama-3-8B: 8.03e9 parameters, 128 KiB of KV per token, 2 MiB blocks of
16 tokens). The old rule (total x 0.5 - peak) left an L4 a negative budget and an H200
about half of vLLM's.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_engine
from tide_fleet.worker.engine.config import EngineConfig
from tide_fleet.worker.engine.kv_budget import GIB, GpuMemory, KVBudgetError, gpu_kv_budget

MIB = 1 << 20
MODEL = 8_030_261_248 * 2  # Llama-3-8B in bf16: 14.96 GiB
BLOCK = 2 * 32 * 8 * 128 * 2 * 16  # K and V, 32 layers, 8 KV heads, head_dim 128, bf16, 16 tokens
CONTEXT = 500 * MIB  # the CUDA context and torch's workspace: used, never allocated by torch
PROFILE_CACHE = 125 * BLOCK  # the profile's stand-in KV cache (1024 tokens, 64 sequences)
ACTIVATIONS = 400 * MIB


def measured(total_mib: int, other_processes: int = 0) -> GpuMemory:
    """What the runner reads after the profile run of the 8B model on this GPU."""
    total = total_mib * MIB
    return GpuMemory(
        total=total,
        free=total - MODEL - CONTEXT - other_processes,
        peak_allocated=MODEL + PROFILE_CACHE + ACTIVATIONS,
        allocated=MODEL,
    )


def budget(mem: GpuMemory, utilization: float = 0.9):  # type: ignore[no-untyped-def]
    return gpu_kv_budget(mem, utilization, BLOCK, 16, MODEL, PROFILE_CACHE, 1024)


def old_rule(mem: GpuMemory) -> int:
    return int(mem.total * 0.5) - mem.peak_allocated


def test_an_8b_model_on_an_l4_gets_a_pool():
    l4 = measured(23_034)  # nvidia-smi: 23034 MiB
    got = budget(l4)
    assert old_rule(l4) < 0
    # 0.9 x 22.49 GiB - (14.96 + 0.49) GiB in use - 0.39 GiB activations = 4.40 GiB
    assert 4.3 * GIB < got.budget_bytes < 4.5 * GIB
    assert got.activation_bytes == ACTIVATIONS
    assert got.num_blocks * 16 > 35_000  # tokens of KV


def test_an_8b_model_on_an_h200_gets_what_vllm_would():
    h200 = measured(143_771)  # nvidia-smi: 143771 MiB
    got = budget(h200)
    # 0.9 x 140.4 GiB - 15.45 GiB - 0.39 GiB = 110.5 GiB, against 54.6 GiB before
    assert 110 * GIB < got.budget_bytes < 111 * GIB
    assert got.budget_bytes / old_rule(h200) > 1.9


def test_other_processes_and_the_utilization_count():
    h200 = budget(measured(143_771))
    shared = budget(measured(143_771, other_processes=40 * GIB))
    assert h200.budget_bytes - shared.budget_bytes == 40 * GIB
    more = budget(measured(23_034), utilization=0.95)
    assert more.budget_bytes - budget(measured(23_034)).budget_bytes == pytest.approx(
        0.05 * 23_034 * MIB, abs=1
    )


def test_a_model_that_does_not_fit_names_the_numbers():
    t4 = measured(15_360)  # a 16 GB T4
    with pytest.raises(KVBudgetError) as err:
        budget(t4)
    msg = str(err.value)
    for part in ("0.9 x 15.00 GiB total = 13.50 GiB", "model weights 14.96 GiB",
                 "activation peak of a 1024-token step 0.39 GiB", "below one block",
                 f"16 tokens = {BLOCK} bytes", "--gpu-memory-utilization"):  # fmt: skip
        assert part in msg, part


def test_utilization_is_validated():
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig(gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        budget(measured(23_034), utilization=0.0)


def test_the_runner_reads_the_device_and_applies_the_config(tiny_path, monkeypatch):
    engine = make_engine(tiny_path, num_kv_blocks=8, gpu_memory_utilization=0.5)
    runner = engine.runner
    total, free = 8 * GIB, 6 * GIB
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 1 * GIB)
    blocks = runner._cuda_num_blocks(profile_cache_bytes=GIB // 2)
    # 0.5 x 8 GiB - 2 GiB used - (3 - 1 - 0.5) GiB activations = 0.5 GiB
    assert blocks == (GIB // 2) // runner.block_bytes
