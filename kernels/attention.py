"""Paged attention and KV-cache write: the torch reference (CPU, and any device).

Cache layout per layer: ``[num_blocks, block_size, num_kv_heads, head_dim]`` for K and
for V. A token at position p of a sequence lives in slot
``block_table[p // block_size] * block_size + p % block_size``.

The step's tokens are flattened into one batch and ordered decode rows first (one
query token each, attended in one batched call per length group), then prefill
chunks (each attends to its cached prefix and causally to itself).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class DecodeGroup:
    """Decode rows of similar context length, batched into one SDPA call."""

    rows: slice
    block_tables: torch.Tensor  # [n, max_blocks] int64, padded with block 0
    mask: torch.Tensor  # [n, 1, 1, max_blocks * block_size] bool: key is visible


@dataclass
class PrefillChunk:
    rows: slice  # this chunk's rows in the flattened token batch
    start_pos: int  # tokens before the chunk that are already in the cache
    block_table: torch.Tensor  # [num_blocks_for_context] int64


@dataclass
class AttentionMetadata:
    """Everything attention needs for one step, built once and shared by all layers."""

    slot_mapping: torch.Tensor  # [num_tokens] int64
    block_size: int
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter the step's new K and V ([T, kv_heads, head_dim]) into their cache slots."""
    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)


def paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Attention for a flattened step; query [T, heads, head_dim] -> [T, heads, head_dim].

    key/value are this step's new K/V (already written to the cache); a prefill chunk
    with no cached prefix attends to them directly and skips the gather.
    """
    out = torch.empty_like(query)
    for group in meta.decode_groups:
        out[group.rows] = _decode_attention(query[group.rows], k_cache, v_cache, group, scale)
    for chunk in meta.prefills:
        out[chunk.rows] = _prefill_attention(query, key, value, k_cache, v_cache, chunk, scale)
    return out


def _decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    group: DecodeGroup,
    scale: float,
) -> torch.Tensor:
    n, num_kv_heads, head_dim = query.shape[0], k_cache.shape[2], k_cache.shape[3]
    keys = k_cache[group.block_tables].view(n, -1, num_kv_heads, head_dim).transpose(1, 2)
    values = v_cache[group.block_tables].view(n, -1, num_kv_heads, head_dim).transpose(1, 2)
    out = F.scaled_dot_product_attention(
        query.unsqueeze(2), keys, values, attn_mask=group.mask, scale=scale, enable_gqa=True
    )
    return out.squeeze(2)


def _prefill_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    chunk: PrefillChunk,
    scale: float,
) -> torch.Tensor:
    q = query[chunk.rows].transpose(0, 1)  # [heads, q_len, head_dim]
    if chunk.start_pos == 0:
        k, v = key[chunk.rows].transpose(0, 1), value[chunk.rows].transpose(0, 1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
        return out.transpose(0, 1)
    q_len = q.shape[1]
    context_len = chunk.start_pos + q_len
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k = k_cache[chunk.block_table].view(-1, num_kv_heads, head_dim)[:context_len].transpose(0, 1)
    v = v_cache[chunk.block_table].view(-1, num_kv_heads, head_dim)[:context_len].transpose(0, 1)
    # Query i sits at position start_pos + i and sees keys 0 ..= start_pos + i.
    q_pos = torch.arange(chunk.start_pos, context_len, device=q.device).unsqueeze(1)
    mask = torch.arange(context_len, device=q.device).unsqueeze(0) <= q_pos
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(0, 1)
