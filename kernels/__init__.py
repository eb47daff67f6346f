"""Tide's kernels: projections, attention and KV cache, the layer's elementwise ops, sampling;
native C++ for CPU, Triton for CUDA and a torch reference behind the same signatures.
Which serves each op on each hardware class: kernels/dispatch.py."""

from tide_fleet.kernels.attention import paged_attention, set_attention_backend, write_kv_cache
from tide_fleet.kernels.attention_metadata import AttentionMetadata

__all__ = ["AttentionMetadata", "paged_attention", "set_attention_backend", "write_kv_cache"]
