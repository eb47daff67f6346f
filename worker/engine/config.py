"""Engine configuration: one dataclass, validated when built."""

from __future__ import annotations

from dataclasses import dataclass

from tide_fleet.infra.contract.model_config import ModelConfig


@dataclass
class EngineConfig:
    """Knobs of the scheduler and KV cache.

    kv_cache_memory: bytes for the KV pool; when None the runner sizes it: on CPU from
    kv_cache_fraction of free memory; on CUDA like vLLM, from gpu_memory_utilization of
    the device's memory minus what is in use and the peak of a profiling run
    (worker/engine/kv_budget.py).
    num_kv_blocks: an explicit block count that overrides both (tests use tiny pools).
    """

    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    max_model_len: int | None = None
    kv_cache_memory: int | None = None
    kv_cache_fraction: float = 0.5  # CPU: of MemAvailable
    gpu_memory_utilization: float = 0.9  # CUDA: of the device's total memory, for everything
    num_kv_blocks: int | None = None
    enable_prefix_caching: bool = True
    attention_backend: str = "auto"  # auto (Triton on CUDA, cpp on CPU) | torch | cpp | triton
    # Decode-only steps as CUDA graphs (worker/engine/decode_graphs.py). auto: on CUDA with
    # the Triton kernels; off: never; eager: the same padded static-buffer steps, uncaptured.
    cuda_graphs: str = "auto"
    # Steps with prefill of up to this many tokens run under the same mode, captured in
    # pieces around attention (worker/engine/mixed_graphs.py); 0: those steps stay eager.
    mixed_graph_tokens: int = 512
    # Detokenize a step's tokens while the device runs the next (worker/engine/output_text.py):
    # auto = on CUDA; on (tests on CPU) | off.
    overlap_detokenize: str = "auto"
    # Schedule and launch step n+1 while step n's sampled tokens are still on the device,
    # reading them one step late (worker/engine/overlap.py): auto = on CUDA at one rank;
    # on (tests on CPU) | off.
    overlap_schedule: str = "auto"
    # continuous: admit whenever there is room. static: admit only into an empty engine,
    # then run that batch to completion (HF-generate-style; a baseline for benchmarks).
    batching: str = "continuous"
    # LoRA adapters (worker/lora/): device slots (0: none served; their bytes come out of
    # the KV budget), adapters kept in host memory (None: as many as the slots, at least),
    # and the largest rank a slot holds (an adapter over it is refused at load).
    max_loras: int = 0
    max_cpu_loras: int | None = None
    max_lora_rank: int = 16
    # Ranks (processes, one device each) the model is sharded over (worker/parallel/):
    # 1 runs it in this process alone.
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be at least 1, got {self.max_num_batched_tokens}"
            )
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be positive bytes, got {self.kv_cache_memory}")
        if not 0.0 < self.kv_cache_fraction <= 1.0:
            raise ValueError(f"kv_cache_fraction must be in (0, 1], got {self.kv_cache_fraction}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.attention_backend not in ("auto", "torch", "cpp", "triton"):
            raise ValueError(
                "attention_backend must be auto, torch, cpp or triton, "
                f"got {self.attention_backend!r}"
            )
        if self.mixed_graph_tokens < 0:
            raise ValueError(
                f"mixed_graph_tokens must be at least 0 (0: off), got {self.mixed_graph_tokens}"
            )
        if self.cuda_graphs not in ("auto", "off", "eager"):
            raise ValueError(f"cuda_graphs must be auto, off or eager, got {self.cuda_graphs!r}")
        if self.overlap_detokenize not in ("auto", "on", "off"):
            raise ValueError(
                f"overlap_detokenize must be auto, on or off, got {self.overlap_detokenize!r}"
            )
        if self.overlap_schedule not in ("auto", "on", "off"):
            raise ValueError(
                f"overlap_schedule must be auto, on or off, got {self.overlap_schedule!r}"
            )
        if self.batching not in ("continuous", "static"):
            raise ValueError(f"batching must be continuous or static, got {self.batching!r}")
        if self.max_loras < 0:
            raise ValueError(f"max_loras must be 0 or more, got {self.max_loras}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras must be at least max_loras ({self.max_loras}), "
                f"got {self.max_cpu_loras}"
            )
        if not 1 <= self.max_lora_rank <= 64:
            raise ValueError(f"max_lora_rank must be 1 to 64, got {self.max_lora_rank}")
        if self.tensor_parallel_size < 1:
            raise ValueError(
                f"tensor_parallel_size must be at least 1, got {self.tensor_parallel_size}"
            )
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be at least 1, got {self.num_kv_blocks}")


def model_len(config: EngineConfig, model: ModelConfig) -> int:
    """The context the engine serves: its max_model_len, never past the model's own."""
    return min(config.max_model_len or model.max_model_len, model.max_model_len)
