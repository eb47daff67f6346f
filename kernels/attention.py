"""Paged attention and KV-cache write: each part of a step on the implementation
kernels/dispatch.py names for the ops decode_attention, prefill_attention and kv_write.

Implementations: ``torch`` (kernels/torch_attention.py: gather the blocks, then SDPA),
``cpp-*`` (decode rows through ``kernels/csrc``'s native kernel, which reads K/V in place
from the block pool; prefill chunks on its bf16 kernel, AMX tiles or AVX-512 BF16) and
``triton`` (CUDA; on CPU under ``TRITON_INTERPRET=1``). ``set_attention_backend`` forces
all three ops at once (the engine's ``--attention-backend``).

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

import torch

from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.kernels import dispatch, torch_attention
from tide_fleet.kernels.attention_metadata import AttentionMetadata, DecodeGroup

BACKENDS = ("auto", "torch", "cpp", "triton")
OPS = ("decode_attention", "prefill_attention", "kv_write")
NATIVE_DTYPES = (torch.float32, torch.bfloat16)
ORIGIN = "the attention backend (--attention-backend)"


def set_attention_backend(name: str) -> None:
    """auto: the kernel table's choices (TIDE_KERNELS included); torch|cpp|triton force
    decode attention, prefill attention and the KV write together (cpp: this CPU's native
    kernels, prefill chunks on SDPA where it has none).

    Forcing triton on CPU needs TRITON_INTERPRET=1 (tests and debugging).
    """
    if name not in BACKENDS:
        raise ValueError(f"attention backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    if name == "triton":
        import tide_fleet.kernels.triton_attention  # noqa: F401 - fail now if Triton is missing
    if name == "cpp" and cpu_kernels.ops() is None:
        raise RuntimeError(
            "attention backend cpp: the native CPU kernels could not be built (see the log)"
        )
    for op in OPS:
        impl = {"torch": "torch", "triton": "triton"}.get(name)
        if name == "cpp":  # this CPU's defaults: its native kernels, SDPA where it has none
            impl = dispatch.TABLE[op][dispatch.cpu_class()].impl
        dispatch.force(op, impl, origin=ORIGIN)


def resolve_backend(name: str, device: torch.device, block_size: int, head_dim: int) -> str:
    """The backend a runner on this device sets. ``auto`` (triton on CUDA) stays where the
    Triton kernels take the shape (block_size and head_dim >= 16); on CUDA with a shape they
    cannot take it becomes the torch reference, so a small model (stories260K: head_dim 8)
    still runs on a GPU. A forced triton that cannot take the shape is refused."""
    fits = block_size >= 16 and head_dim >= 16
    if name == "auto" and device.type == "cuda" and not fits:
        return "torch"
    if name == "triton" and not fits:
        raise ValueError(
            f"the Triton attention kernels need block_size >= 16 and head_dim >= 16, "
            f"got block_size {block_size}, head_dim {head_dim}"
        )
    return name


def decode_reads_rows_in_place(device: torch.device, dtype: torch.dtype) -> bool:
    """True where decode attention is the native kernel, which reads each row's own
    length from the block pool (so decode rows need no grouping by length)."""
    native = dispatch.is_native(dispatch.impl("decode_attention", device))
    return native and device.type == "cpu" and dtype in NATIVE_DTYPES


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter the step's new K and V ([T, kv_heads, head_dim]) into their cache slots."""
    impl = dispatch.impl("kv_write", key.device)
    if impl == "triton":
        # Here, not at the top: Triton is optional (a dev extra; CPU-only installs lack it).
        from tide_fleet.kernels import triton_attention

        triton_attention.write_kv_cache(key, value, k_cache, v_cache, slot_mapping)
        return
    if dispatch.is_native(impl) and key.device.type == "cpu" and key.dtype in NATIVE_DTYPES:
        cpu_kernels.ops().write_kv_cache(key, value, k_cache, v_cache, slot_mapping)
        return
    torch_attention.write_kv_cache(key, value, k_cache, v_cache, slot_mapping)


def paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention for a flattened step; query [T, heads, head_dim] -> [T, heads, head_dim],
    written into ``out`` when given (a buffer a CUDA graph reads).

    key/value are this step's new K/V (already written to the cache); a prefill chunk
    with no cached prefix attends to them directly and skips the gather.
    """
    device = query.device
    decode = dispatch.impl("decode_attention", device)
    prefill = dispatch.impl("prefill_attention", device)
    if decode == "triton" and prefill == "triton":
        return _triton_attention(query, k_cache, v_cache, meta, scale, out)
    on_cpu = device.type == "cpu" and query.dtype in NATIVE_DTYPES
    cpp = on_cpu and dispatch.is_native(decode)
    if cpp and not meta.prefills and len(meta.decode_groups) == 1 and out is None:
        # the whole step: no scatter into a separate output
        return _cpp_decode(query, k_cache, v_cache, meta.decode_groups[0], scale)
    out = torch.empty_like(query) if out is None else out
    for group in meta.decode_groups:
        if cpp:
            out[group.rows] = _cpp_decode(query[group.rows], k_cache, v_cache, group, scale)
        elif decode == "triton":
            _triton_decode(query[group.rows], k_cache, v_cache, group, scale, out[group.rows])
        else:
            out[group.rows] = torch_attention.decode_attention(
                query[group.rows], k_cache, v_cache, group, scale
            )
    if prefill == "triton":
        return _triton_prefill(query, k_cache, v_cache, meta, scale, out)
    native = on_cpu and dispatch.is_native(prefill) and _pairs_take(query.dtype, query.shape[2])
    if native and meta.prefill_batch is not None:  # every chunk in one call, into out
        b = meta.prefill_batch
        cpu_kernels.ops().prefill_attention_varlen(
            query, k_cache, v_cache, b.query_start, b.start_pos, b.block_tables, b.first_row,
            scale, out,
        )  # fmt: skip
        return out
    for chunk in meta.prefills:
        if native:
            out[chunk.rows] = cpu_kernels.ops().prefill_attention(
                query[chunk.rows], k_cache, v_cache, chunk.block_table, chunk.start_pos, scale
            )
        else:
            out[chunk.rows] = torch_attention.prefill_attention(
                query, key, value, k_cache, v_cache, chunk, scale
            )
    return out


# Decode rows take the shared-prefix kernel when at least this many share at least this
# many leading cached tokens (below that the per-row kernel is as fast).
SHARED_MIN_ROWS = 4
SHARED_MIN_TOKENS = 256
_shared_seen: tuple[DecodeGroup | None, int] = (None, 0)


def _cpp_decode(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    group: DecodeGroup,
    scale: float,
) -> torch.Tensor:
    """Decode rows on the native kernels: where they share a long cached prefix (a common
    system prompt), its keys are read once for all rows, 16 to a task
    (``tide::decode_shared_prefix``); otherwise one task per row and KV head."""
    ops = cpu_kernels.ops()
    shared = cpp_decode_shared_tokens(query.dtype, query.shape[2], group, k_cache.shape[2])
    if shared:
        return ops.decode_shared_prefix(
            query, k_cache, v_cache, group.block_tables, group.context_lens, shared, scale
        )
    return ops.paged_decode_attention(
        query, k_cache, v_cache, group.block_tables, group.context_lens, scale
    )


def cpp_decode_shared_tokens(
    dtype: torch.dtype, head_dim: int, group: DecodeGroup, block_size: int
) -> int:
    """The leading tokens the native decode attends once for all of the group's rows
    (``tide::decode_shared_prefix``); 0: one task per row and KV head."""
    return shared_prefix_tokens(group, block_size) if native_prefill(dtype, head_dim) else 0


def shared_prefix_tokens(group: DecodeGroup, block_size: int) -> int:
    """Tokens in the leading blocks every row of the group has in common and fully in its
    context (0 below SHARED_MIN_ROWS rows or SHARED_MIN_TOKENS tokens). Asked once per
    group: every layer of a step passes the same group."""
    global _shared_seen
    if _shared_seen[0] is group:
        return _shared_seen[1]
    tables, tokens = group.block_tables, 0
    if tables.shape[0] >= SHARED_MIN_ROWS:
        same = (tables == tables[:1]).all(0).to(torch.int32).cumprod(0)
        blocks = min(int(same.sum()), int(group.context_lens.min()) // block_size)
        tokens = blocks * block_size if blocks * block_size >= SHARED_MIN_TOKENS else 0
    _shared_seen = (group, tokens)
    return tokens


def native_prefill(dtype: torch.dtype, head_dim: int, device: torch.device | str = "cpu") -> bool:
    """True where prefill chunks (and decode rows sharing a long prefix) run on the native
    bf16 kernels: prefill_attention is cpp-amx or cpp-avx512bf16 here, and the chunk is
    bf16 with head_dim a multiple of 32; elsewhere SDPA."""
    native = dispatch.is_native(dispatch.impl("prefill_attention", device))
    return native and _pairs_take(dtype, head_dim)


def _pairs_take(dtype: torch.dtype, head_dim: int) -> bool:
    return dtype == torch.bfloat16 and head_dim % 32 == 0 and cpu_kernels.native_prefill()


def set_native_prefill(enabled: bool) -> None:
    """Off: CPU prefill chunks take SDPA (and shared-prefix decode rows the per-row kernel)
    even where the native bf16 kernels run (comparisons, tests): prefill_attention forced
    to torch until it is turned back on."""
    dispatch.force("prefill_attention", None if enabled else "torch", origin="set_native_prefill")


def _triton_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    out = torch.empty_like(query) if out is None else out
    for g in meta.decode_groups:  # each group's rows written in place
        _triton_decode(query[g.rows], k_cache, v_cache, g, scale, out[g.rows])
    return _triton_prefill(query, k_cache, v_cache, meta, scale, out)


def _triton_decode(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    g: DecodeGroup,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    # Here, not at the top: Triton is optional (a dev extra; CPU-only installs lack it).
    from tide_fleet.kernels import triton_decode

    return triton_decode.decode_attention(
        query, k_cache, v_cache, g.block_tables, g.context_lens, scale, g.max_context, out
    )


def _triton_prefill(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor,
) -> torch.Tensor:
    from tide_fleet.kernels import triton_attention as tk
    from tide_fleet.kernels import triton_prefill

    if meta.prefill_batch is not None:  # every chunk in one launch, written into out in place
        triton_prefill.prefill_attention_varlen(
            query, k_cache, v_cache, meta.prefill_batch, scale, out=out
        )
        return out
    for chunk in meta.prefills:
        out[chunk.rows] = tk.prefill_attention(
            query[chunk.rows], k_cache, v_cache, chunk.block_table, chunk.start_pos, scale
        )
    return out
