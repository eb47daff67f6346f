"""How many bytes the KV pool gets on a GPU: nano-vllm's and vLLM's rule, as pure arithmetic.

After a profiling run of the largest step (``ModelRunner.profile_run``)::

    budget = total x gpu_memory_utilization - used - activation peak

- ``used`` = total - free from ``torch.cuda.mem_get_info``: the weights, the CUDA context,
  torch's cached blocks and every other process on the GPU (another worker pinned to the
  same device counts against this one);
- the activation peak = torch's peak allocation during the profile minus what is still
  allocated after it (the weights), minus the profile's own stand-in KV cache (the real
  pool replaces it).

The CPU keeps its own rule (``kv_cache_fraction`` of MemAvailable, shared by the ranks of a
tensor-parallel worker). Torch-free: a test feeds it the numbers of an L4 or an H200.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from tide_fleet.worker.models.llama import LlamaModel

GIB = 1 << 30


class KVBudgetError(ValueError):
    """The model and one step's activations leave no room for a single KV block."""


@dataclass(frozen=True)
class GpuMemory:
    """Bytes, read right after the profiling run with its tensors released."""

    total: int  # mem_get_info()[1]
    free: int  # mem_get_info()[0]
    peak_allocated: int  # torch.cuda.max_memory_allocated() over the profile
    allocated: int  # torch.cuda.memory_allocated() after it: the weights, mostly

    @property
    def used(self) -> int:
        return self.total - self.free


@dataclass(frozen=True)
class KVBudget:
    budget_bytes: int  # for the KV pool
    num_blocks: int
    activation_bytes: int  # the profiled step's peak on top of what stays allocated


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def gpu_kv_budget(
    mem: GpuMemory,
    utilization: float,
    block_bytes: int,
    block_size: int,
    model_bytes: int,
    profile_cache_bytes: int = 0,
    step_tokens: int | None = None,
) -> KVBudget:
    """The KV budget and block count, or KVBudgetError naming every number."""
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    activation = max(0, mem.peak_allocated - mem.allocated - profile_cache_bytes)
    allowed = int(mem.total * utilization)
    budget = allowed - mem.used - activation
    if budget < block_bytes:
        step = f"a {step_tokens}-token step" if step_tokens else "the profiled step"
        other = max(0, mem.used - model_bytes)
        raise KVBudgetError(
            f"the model does not fit with room for the KV cache: "
            f"gpu_memory_utilization {utilization} x {_gib(mem.total)} total = {_gib(allowed)}; "
            f"in use {_gib(mem.used)} (model weights {_gib(model_bytes)}, CUDA context, "
            f"cached blocks and other processes {_gib(other)}); activation peak of {step} "
            f"{_gib(activation)}; left for the KV cache {_gib(budget)}, below one block "
            f"({block_size} tokens = {block_bytes} bytes). Raise --gpu-memory-utilization, "
            f"lower --max-num-batched-tokens or --max-num-seqs, free the GPU, or use a GPU "
            f"with more memory"
        )
    return KVBudget(budget, budget // block_bytes, activation)


def model_weight_bytes(model: LlamaModel) -> int:
    """Bytes of the model's tensors (a tied lm_head counted once)."""
    seen: dict[int, int] = {}
    tensors: list[torch.Tensor | None] = [model.embed, model.norm, model.lm_head.weight]
    for layer in model.layers:
        tensors += [layer.input_norm, layer.post_norm]
        for lin in (layer.qkv, layer.o, layer.gate_up, layer.down):
            tensors += [lin.weight, lin.bias, lin.gemv_weight]
    for t in tensors:
        if t is None:
            continue  # a oneDNN-packed weight (kernels/linear.py) has no data pointer
        key = id(t) if t.is_mkldnn else t.data_ptr()
        seen[key] = t.numel() * t.element_size()
    return sum(seen.values())


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux); a conservative 4 GiB elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30
