"""The torch reference for paged attention: gather the blocks, then SDPA (CPU, and any
device). The dispatch is kernels/attention.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tide_fleet.kernels.attention_metadata import DecodeGroup, PrefillChunk


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter [T, kv_heads, head_dim] K/V into their slots; slot -1 (a padding row) is
    skipped. Checking for padding reads the slots back (free on CPU, a sync elsewhere)."""
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    num_kv_heads, head_dim = k_cache.shape[0], k_cache.shape[3]
    k_cache.view(num_kv_heads, -1, head_dim).index_copy_(1, slot_mapping, key.transpose(0, 1))
    v_cache.view(num_kv_heads, -1, head_dim).index_copy_(1, slot_mapping, value.transpose(0, 1))


def gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """[kv_heads, len(block_ids), block_size * head_dim]: the blocks, copied contiguously.

    index_select on a 3-D view copies whole rows; on the 4-D cache (or with
    advanced indexing) it takes a per-element path several times slower.
    """
    num_kv_heads, num_blocks = cache.shape[0], cache.shape[1]
    return cache.view(num_kv_heads, num_blocks, -1).index_select(1, block_ids)


def decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    group: DecodeGroup,
    scale: float,
) -> torch.Tensor:
    # Each KV head with its query heads acts as one "sequence" of G query tokens:
    # SDPA batch = kv heads, SDPA heads = requests, so every K/V row is read once per
    # group of query heads and the 4-D flash kernel applies.
    n, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[0]
    q = query.view(n, num_kv_heads, num_heads // num_kv_heads, head_dim).transpose(0, 1)
    blocks = group.block_tables.reshape(-1)
    keys = gather_blocks(k_cache, blocks).view(num_kv_heads, n, -1, head_dim)
    values = gather_blocks(v_cache, blocks).view(num_kv_heads, n, -1, head_dim)
    # Key j of row i is visible when j < its context length.
    width = keys.shape[2]
    visible = torch.arange(width, device=query.device) < group.context_lens.unsqueeze(1)
    out = F.scaled_dot_product_attention(
        q, keys, values, attn_mask=visible[None, :, None, :], scale=scale
    )
    return out.transpose(0, 1).reshape(n, num_heads, head_dim)


def prefill_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    chunk: PrefillChunk,
    scale: float,
) -> torch.Tensor:
    # 4-D tensors throughout: 3-D inputs send SDPA to its slow math path on CPU.
    q = query[chunk.rows].transpose(0, 1).unsqueeze(0)  # [1, heads, q_len, head_dim]
    if chunk.start_pos == 0:
        k = key[chunk.rows].transpose(0, 1).unsqueeze(0)
        v = value[chunk.rows].transpose(0, 1).unsqueeze(0)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
        return out[0].transpose(0, 1)
    if q.device.type == "cpu":
        return _prefix_then_self(query, key, value, k_cache, v_cache, chunk, scale)
    q_len = q.shape[2]
    context_len = chunk.start_pos + q_len
    num_kv_heads, head_dim = k_cache.shape[0], k_cache.shape[3]
    k = gather_blocks(k_cache, chunk.block_table).view(num_kv_heads, -1, head_dim)
    v = gather_blocks(v_cache, chunk.block_table).view(num_kv_heads, -1, head_dim)
    k, v = k[:, :context_len], v[:, :context_len]
    # Query i sits at position start_pos + i and sees keys 0 ..= start_pos + i.
    q_pos = torch.arange(chunk.start_pos, context_len, device=q.device).unsqueeze(1)
    mask = torch.arange(context_len, device=q.device).unsqueeze(0) <= q_pos
    out = F.scaled_dot_product_attention(
        q, k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask, scale=scale, enable_gqa=True
    )
    return out[0].transpose(0, 1)


def _prefix_then_self(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    chunk: PrefillChunk,
    scale: float,
) -> torch.Tensor:
    """A chunk after a cached prefix as two flash calls merged by their log-sum-exp (CPU).

    One masked call over [prefix + chunk] costs the whole rectangle, at about half the
    rate of an unmasked one, plus building the mask. Split: every query sees the whole
    prefix (no mask; each KV head's query group folded into the sequence, so K/V are read
    once per group), and the chunk sees itself causally (its own new K/V, no gather).
    softmax over the union = the two partial results weighted by sigmoid(lse1 - lse2).
    """
    rows, start = chunk.rows, chunk.start_pos
    q_len, num_heads, head_dim = query[rows].shape
    num_kv_heads, block_size = k_cache.shape[0], k_cache.shape[2]
    group = num_heads // num_kv_heads
    q = query[rows].transpose(0, 1)  # [heads, q_len, head_dim]: heads grouped by KV head
    blocks = chunk.block_table[: -(-start // block_size)]
    k_pre = gather_blocks(k_cache, blocks).view(num_kv_heads, -1, head_dim)[:, :start]
    v_pre = gather_blocks(v_cache, blocks).view(num_kv_heads, -1, head_dim)[:, :start]
    folded = q.reshape(1, num_kv_heads, group * q_len, head_dim)
    o_pre, lse_pre = _flash(folded, k_pre.unsqueeze(0), v_pre.unsqueeze(0), scale=scale)
    k_own = key[rows].repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)
    v_own = value[rows].repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)
    o_own, lse_own = _flash(q.unsqueeze(0), k_own, v_own, is_causal=True, scale=scale)
    weight = torch.sigmoid(lse_pre.reshape(num_heads, q_len) - lse_own.reshape(num_heads, q_len))
    out = torch.lerp(
        o_own[0], o_pre.reshape(num_heads, q_len, head_dim), weight.unsqueeze(-1).to(q.dtype)
    )
    return out.transpose(0, 1)


def _flash(q, k, v, is_causal=False, scale=None):  # type: ignore[no-untyped-def]
    """torch's CPU flash attention, which also returns the log-sum-exp per query row."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, is_causal=is_causal, scale=scale
    )
    return out, lse
