"""Paged attention and KV-cache write: the torch reference (CPU, and any device).

Backends: ``torch`` (this file: gather the blocks, then SDPA), ``cpp`` (decode rows
through ``kernels/csrc``'s native kernel, which reads K/V in place from the block pool;
prefill chunks stay on SDPA, which is GEMM-shaped and fast there) and ``triton``
(CUDA). ``auto`` picks triton for CUDA tensors, cpp on CPU where it builds, and the
torch reference otherwise.

Cache layout per layer, for K and for V: ``[num_kv_heads, num_blocks, block_size,
head_dim]`` (head-major), so gathering a sequence's blocks yields one contiguous
``[kv_heads, tokens, head_dim]`` matrix per head with no transposing copy. A token at
position p of a sequence lives in slot ``block_table[p // block_size] * block_size +
p % block_size``.

The step's tokens are flattened into one batch and ordered decode rows first (one
query token each, attended in one batched call per length group), then prefill
chunks (each attends to its cached prefix and causally to itself).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kernels import cpu as cpu_kernels


@dataclass
class DecodeGroup:
    """Decode rows of similar context length, batched into one SDPA call."""

    rows: slice
    block_tables: torch.Tensor  # [n, max_blocks] int64, padded with block 0
    mask: torch.Tensor  # [1, n, 1, max_blocks * block_size] bool: key is visible
    context_lens: torch.Tensor  # [n] int32 (the Triton kernel reads these, not the mask)
    max_context: int


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


BACKENDS = ("auto", "torch", "cpp", "triton")
_backend = "auto"


def set_attention_backend(name: str) -> None:
    """auto: Triton on CUDA tensors, the native kernel on CPU (torch reference where it
    cannot be built); torch|cpp|triton force one.

    Forcing triton on CPU needs TRITON_INTERPRET=1 (tests and debugging).
    """
    global _backend
    if name not in BACKENDS:
        raise ValueError(f"attention backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    if name == "triton":
        import kernels.triton_attention  # noqa: F401 - fail now if Triton is missing
    if name == "cpp" and cpu_kernels.ops() is None:
        raise RuntimeError(
            "attention backend cpp: the native CPU kernels could not be built (see the log)"
        )
    _backend = name


def _use_triton(t: torch.Tensor) -> bool:
    return _backend == "triton" or (_backend == "auto" and t.is_cuda)


def decode_reads_rows_in_place(device: torch.device, dtype: torch.dtype) -> bool:
    """True where decode attention is the native kernel, which reads each row's own
    length from the block pool (so decode rows need no grouping by length)."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return False
    return _backend == "cpp" or (_backend == "auto" and cpu_kernels.ops() is not None)


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter the step's new K and V ([T, kv_heads, head_dim]) into their cache slots."""
    if _use_triton(key):
        from kernels import triton_attention

        triton_attention.write_kv_cache(key, value, k_cache, v_cache, slot_mapping)
        return
    if decode_reads_rows_in_place(key.device, key.dtype):
        cpu_kernels.ops().write_kv_cache(key, value, k_cache, v_cache, slot_mapping)
        return
    num_kv_heads, head_dim = k_cache.shape[0], k_cache.shape[3]
    k_cache.view(num_kv_heads, -1, head_dim).index_copy_(1, slot_mapping, key.transpose(0, 1))
    v_cache.view(num_kv_heads, -1, head_dim).index_copy_(1, slot_mapping, value.transpose(0, 1))


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
    if _use_triton(query):
        return _triton_attention(query, k_cache, v_cache, meta, scale)
    cpp = decode_reads_rows_in_place(query.device, query.dtype)
    if cpp and not meta.prefills and len(meta.decode_groups) == 1:
        g = meta.decode_groups[0]  # the whole step: no scatter into a separate output
        return cpu_kernels.ops().paged_decode_attention(
            query, k_cache, v_cache, g.block_tables, g.context_lens, scale
        )
    out = torch.empty_like(query)
    for group in meta.decode_groups:
        if cpp:
            out[group.rows] = cpu_kernels.ops().paged_decode_attention(
                query[group.rows], k_cache, v_cache, group.block_tables, group.context_lens, scale
            )
        else:
            out[group.rows] = _decode_attention(query[group.rows], k_cache, v_cache, group, scale)
    for chunk in meta.prefills:
        out[chunk.rows] = _prefill_attention(query, key, value, k_cache, v_cache, chunk, scale)
    return out


def _triton_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    from kernels import triton_attention as tk

    out = torch.empty_like(query)
    for g in meta.decode_groups:
        out[g.rows] = tk.decode_attention(
            query[g.rows], k_cache, v_cache, g.block_tables, g.context_lens, scale, g.max_context
        )
    for chunk in meta.prefills:
        out[chunk.rows] = tk.prefill_attention(
            query[chunk.rows], k_cache, v_cache, chunk.block_table, chunk.start_pos, scale
        )
    return out


def _gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """[kv_heads, len(block_ids), block_size * head_dim]: the blocks, copied contiguously.

    index_select on a 3-D view copies whole rows; on the 4-D cache (or with
    advanced indexing) it takes a per-element path several times slower.
    """
    num_kv_heads, num_blocks = cache.shape[0], cache.shape[1]
    return cache.view(num_kv_heads, num_blocks, -1).index_select(1, block_ids)


def _decode_attention(
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
    keys = _gather_blocks(k_cache, group.block_tables.view(-1)).view(num_kv_heads, n, -1, head_dim)
    values = _gather_blocks(v_cache, group.block_tables.view(-1)).view(
        num_kv_heads, n, -1, head_dim
    )
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=group.mask, scale=scale)
    return out.transpose(0, 1).reshape(n, num_heads, head_dim)


def _prefill_attention(
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
    q_len = q.shape[2]
    context_len = chunk.start_pos + q_len
    num_kv_heads, head_dim = k_cache.shape[0], k_cache.shape[3]
    k = _gather_blocks(k_cache, chunk.block_table).view(num_kv_heads, -1, head_dim)
    v = _gather_blocks(v_cache, chunk.block_table).view(num_kv_heads, -1, head_dim)
    k, v = k[:, :context_len], v[:, :context_len]
    # Query i sits at position start_pos + i and sees keys 0 ..= start_pos + i.
    q_pos = torch.arange(chunk.start_pos, context_len, device=q.device).unsqueeze(1)
    mask = torch.arange(context_len, device=q.device).unsqueeze(0) <= q_pos
    out = F.scaled_dot_product_attention(
        q, k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask, scale=scale, enable_gqa=True
    )
    return out[0].transpose(0, 1)
