"""Attention and KV-cache kernels: a torch reference; Triton for CUDA behind the same signatures."""

from tide_fleet.kernels.attention import paged_attention, set_attention_backend, write_kv_cache
from tide_fleet.kernels.attention_metadata import AttentionMetadata

__all__ = ["AttentionMetadata", "paged_attention", "set_attention_backend", "write_kv_cache"]
