#!/usr/bin/env python3
"""CPU attention kernels side by side: the native bf16 kernels against what they replace.

    python scripts/bench_cpu_attention.py [--threads 2] [--reps 12]

Prefill chunks (bench model shape: 16 query heads over 4 KV heads, head_dim 64, bf16):
``tide::prefill_attention`` against the torch path (CPU flash attention; after a cached
prefix, two flash calls merged). Decode: 64 rows sharing a 1,024-token cached prefix plus
46 keys of their own, ``tide::decode_shared_prefix`` against the per-row
``tide::paged_decode_attention``. Each pair alternates in one process; reported: the best
time of each and the median of the per-pair ratios (a shared machine's speed drifts, so read
the ratios). Needs a CPU with AMX or AVX-512 BF16 (the kernels run on tiles where there
are any).

Last, decode rows that share nothing: the per-row kernel's KV read rate (64 rows, contexts
100-800, blocks scattered over a pool per layer, nine layers in turn, as a decode step of
the bench model reads them) beside a plain sequential read of a large tensor, alternating:
decode attention at these sizes is bound by how fast scattered blocks come from memory.
And the same kernel on rows as a decode step orders them (by context length: 48 rows of 80
keys, then 16 of 1,200) against the same rows shuffled: the kernel runs its tasks longest
first (kernels/csrc/longest_first.h), so the order should not matter (with each thread
given an equal range of rows, the sorted case ran 1.42x slower).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.kernels import torch_attention
from tide_fleet.kernels.attention_metadata import PrefillChunk

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 16, 4, 64, 16


def alternate(old, new, reps: int) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    old(), new()
    t_old, t_new = [], []
    for _ in range(reps):
        for fn, out in ((old, t_old), (new, t_new)):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    return (
        min(t_old),
        min(t_new),
        statistics.median(a / b for a, b in zip(t_old, t_new, strict=True)),
    )


def prefill_pair(rand, k_cache, v_cache, length, start, reps):  # type: ignore[no-untyped-def]
    ops, scale = cpu_kernels.ops(), HEAD_DIM**-0.5
    table = torch.arange(-(-(start + length) // BLOCK))
    q, k, v = (
        rand(length, HEADS, HEAD_DIM),
        rand(length, KV_HEADS, HEAD_DIM),
        rand(length, KV_HEADS, HEAD_DIM),
    )
    chunk = PrefillChunk(rows=slice(0, length), start_pos=start, block_table=table)
    return alternate(
        lambda: torch_attention.prefill_attention(q, k, v, k_cache, v_cache, chunk, scale),
        lambda: ops.prefill_attention(q, k_cache, v_cache, table, start, scale),
        reps,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not cpu_kernels.native_prefill():
        raise SystemExit(
            "the native bf16 attention kernels are not available here "
            "(no AMX or AVX-512 BF16, or the build failed)"
        )
    print(f"native bf16 attention on {cpu_kernels.attention_pass_isa()}")
    ops, scale = cpu_kernels.ops(), HEAD_DIM**-0.5
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(torch.bfloat16)

    k_cache, v_cache = rand(KV_HEADS, 400, BLOCK, HEAD_DIM), rand(KV_HEADS, 400, BLOCK, HEAD_DIM)
    for length, start in ((1024, 0), (1024, 1024), (16, 1024), (256, 0)):
        reps = args.reps if length > 100 else 5 * args.reps
        old, new, ratio = prefill_pair(rand, k_cache, v_cache, length, start, reps)
        print(f"prefill {length:5d} after {start:5d}: torch {old * 1e3:7.2f} ms, "
              f"native {new * 1e3:7.2f} ms, {ratio:.2f}x")  # fmt: skip
    n, shared, own = 64, 1024, 46
    own_blocks = shared // BLOCK + torch.arange(n * 3).view(n, 3)
    tables = torch.cat([torch.arange(shared // BLOCK).expand(n, -1), own_blocks], 1).contiguous()
    lens = torch.full((n,), shared + own, dtype=torch.int32)
    q = rand(n, HEADS, HEAD_DIM)
    old, new, ratio = alternate(
        lambda: ops.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale),
        lambda: ops.decode_shared_prefix(q, k_cache, v_cache, tables, lens, shared, scale),
        5 * args.reps,
    )
    print(f"decode {n} rows x ({shared} shared + {own} own): per-row {old * 1e3:.2f} ms, "
          f"shared {new * 1e3:.2f} ms, {ratio:.2f}x")  # fmt: skip
    decode_read_rate(rand, args.reps)
    decode_row_order(rand, args.reps)


def decode_read_rate(rand, reps: int) -> None:  # type: ignore[no-untyped-def]
    ops, scale, layers, n, pool = cpu_kernels.ops(), HEAD_DIM**-0.5, 9, 64, 4096
    gen = torch.Generator().manual_seed(1)
    caches = [(rand(KV_HEADS, pool, BLOCK, HEAD_DIM), rand(KV_HEADS, pool, BLOCK, HEAD_DIM))
              for _ in range(layers)]  # fmt: skip
    lens = torch.randint(100, 801, (n,), generator=gen, dtype=torch.int32)
    width = -(-int(lens.max()) // BLOCK)
    tables = torch.randperm(pool, generator=gen)[: n * width].view(n, width).contiguous()
    q = rand(n, HEADS, HEAD_DIM)
    kv_bytes = int(lens.sum()) * KV_HEADS * HEAD_DIM * 2 * 2 * layers  # K and V, bf16
    big = torch.ones(kv_bytes // 4, dtype=torch.float32)  # the same bytes, read in order
    step, read, _ = alternate(
        lambda: [ops.paged_decode_attention(q, k, v, tables, lens, scale) for k, v in caches],
        big.sum,
        reps,
    )
    print(f"decode {n} rows x 100-800 scattered keys, {layers} layers: per-row kernel "
          f"{kv_bytes / step / 1e9:.1f} GB/s of K/V, "
          f"a plain read {kv_bytes / read / 1e9:.1f} GB/s")  # fmt: skip


def decode_row_order(rand, reps: int) -> None:  # type: ignore[no-untyped-def]
    ops, scale, n = cpu_kernels.ops(), HEAD_DIM**-0.5, 64
    lens = torch.tensor([80] * 48 + [1200] * 16, dtype=torch.int32)
    width = -(-1200 // BLOCK)
    k_cache, v_cache = (
        rand(KV_HEADS, n * width, BLOCK, HEAD_DIM),
        rand(KV_HEADS, n * width, BLOCK, HEAD_DIM),
    )
    tables = torch.arange(n * width).view(n, width)
    q = rand(n, HEADS, HEAD_DIM)
    mix = torch.randperm(n, generator=torch.Generator().manual_seed(2))
    mixed_tables, mixed_lens = tables[mix].contiguous(), lens[mix].contiguous()
    by_length, shuffled, ratio = alternate(
        lambda: ops.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale),
        lambda: ops.paged_decode_attention(q, k_cache, v_cache, mixed_tables, mixed_lens, scale),
        5 * reps,
    )
    print(f"decode {n} rows, sorted by length: {by_length * 1e3:.2f} ms, shuffled "
          f"{shuffled * 1e3:.2f} ms, {ratio:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
