"""``Plan``: what ``plan()`` (planner.py) decides for a model on a device, and how it
prints as `tide worker` flags and as a dict (``tide plan --json``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Plan:
    """What fits where, and the engine settings and bucket thresholds that follow from it."""

    model: str
    device: str | None
    weight_dtype: str
    kv_dtype: str
    num_parameters: int
    weight_bytes: int
    kv_bytes_per_token: int
    memory_bytes: int
    headroom: float
    reserve_bytes: int
    usable_bytes: int  # memory less headroom
    kv_budget_bytes: int
    kv_budget_tokens: int
    prompt_len: int
    output_len: int
    avg_len: int  # prompt_len + output_len
    p99_len: int
    max_concurrent_seqs: int  # at avg_len
    max_concurrent_seqs_p99: int
    recommended_max_num_seqs: int
    recommended_max_num_batched_tokens: int
    prefill_chunk_tokens: int
    activation_bytes_estimate: int
    decode_context_len: int  # mean context while decoding: prompt + half the output
    decode_tokens_per_s_batch1: float | None  # None without a device
    decode_tokens_per_s: float | None  # at recommended_max_num_seqs
    decode_bound: str | None  # "memory" or "compute", at the recommended batch
    work_tokens_per_s: float | None  # prompt + output tokens finished per second (roofline)
    bucket_short_max: int
    bucket_medium_max: int
    max_model_len: int
    # Tensor parallelism. The memory, KV budget and concurrency figures above are per GPU (a
    # worker holds N GPUs); weight_bytes and kv_bytes_per_token are the whole model's.
    tensor_parallel_size: int = 1
    weight_bytes_per_gpu: int = 0
    kv_bytes_per_token_per_gpu: int = 0
    min_tensor_parallel_size: int | None = 1  # smallest N that fits; None: none up to 8
    interconnect: str | None = None
    interconnect_bytes_per_s: float | None = None
    # One decode step at recommended_max_num_seqs, per GPU (None without a device): the
    # roofline of the weight and KV read (or the compute, if larger) plus the all-reduces.
    step_allreduce_bytes: int = 0
    step_read_seconds: float | None = None
    step_allreduce_seconds: float | None = None
    step_seconds: float | None = None
    warnings: tuple[str, ...] = ()

    @property
    def is_tensor_parallel(self) -> bool:
        return self.tensor_parallel_size > 1

    def worker_flags(self) -> str:
        """The `tide worker` flags of this plan (--kv-cache-memory is each rank's pool)."""
        split = (
            f" --tensor-parallel-size {self.tensor_parallel_size}"
            if self.is_tensor_parallel
            else ""
        )
        return (
            f"--max-num-seqs {self.recommended_max_num_seqs} "
            f"--max-num-batched-tokens {self.recommended_max_num_batched_tokens} "
            f"--kv-cache-memory {self.kv_budget_bytes}{split}"
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["warnings"] = list(self.warnings)
        d["worker_flags"] = self.worker_flags()
        d["settings"] = {
            "TIDE_BUCKET_SHORT_MAX": self.bucket_short_max,
            "TIDE_BUCKET_MEDIUM_MAX": self.bucket_medium_max,
        }
        return d
