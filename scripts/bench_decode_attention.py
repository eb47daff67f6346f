#!/usr/bin/env python3
"""Decode attention on any CPU: the native per-row kernel against the torch path.

    python scripts/bench_decode_attention.py [--threads 2] [--reps 10] [--dtype float32]
    python scripts/bench_decode_attention.py --dtype bfloat16 --blocks in-order

One decode step of the bench model's attention (16 query heads over 4 KV heads, head_dim
64, block size 16): 64 rows with contexts of 100-800 tokens whose blocks are scattered
over a pool per layer (or, with --blocks in-order, each row's blocks one after another, as
the engine's block manager mostly hands them out), nine layers in turn.
``tide::paged_decode_attention`` (AVX-512 where the CPU has it, decode_avx2.h on AVX2-only
CPUs such as AMD Zen 2/3) against ``kernels/torch_attention.decode_attention`` (gather the
blocks, torch SDPA), alternating in one process; reported: the best time of each, the
median of the per-pair ratios, and the kernel's K/V read rate beside a plain read of as
many bytes. Only the ratios mean much on a shared machine. The last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import json

import torch
from bench_cpu_attention import alternate  # best of each, median old/new over pairs

from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.kernels import dispatch, torch_attention
from tide_fleet.kernels.attention_metadata import DecodeGroup

HEADS, KV_HEADS, HEAD_DIM, BLOCK, LAYERS, ROWS, POOL = 16, 4, 64, 16, 9, 64, 4096


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--blocks", default="scattered", choices=("scattered", "in-order"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ops = cpu_kernels.ops()
    if ops is None:
        raise SystemExit("the native CPU kernels could not be built here")
    # The kernel table, with TIDE_KERNELS applied: on AMX, decode_attention=cpp-avx512bf16
    # runs the VDPBF16PS loop where the tiles would.
    impl = dispatch.impl("decode_attention", "cpu")
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(1)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    caches = [(rand(KV_HEADS, POOL, BLOCK, HEAD_DIM), rand(KV_HEADS, POOL, BLOCK, HEAD_DIM))
              for _ in range(LAYERS)]  # fmt: skip
    lens = torch.randint(100, 801, (ROWS,), generator=gen, dtype=torch.int32)
    width = -(-int(lens.max()) // BLOCK)
    order = torch.arange(POOL) if args.blocks == "in-order" else torch.randperm(POOL, generator=gen)
    tables = order[: ROWS * width].view(ROWS, width).contiguous()
    group = DecodeGroup(slice(0, ROWS), tables, lens, int(lens.max()))
    q = rand(ROWS, HEADS, HEAD_DIM)
    scale = HEAD_DIM**-0.5
    kv_bytes = int(lens.sum()) * KV_HEADS * HEAD_DIM * 2 * dtype.itemsize * LAYERS

    def native() -> None:
        for k, v in caches:
            ops.paged_decode_attention(q, k, v, tables, lens, scale)

    def reference() -> None:
        for k, v in caches:
            torch_attention.decode_attention(q, k, v, group, scale)

    got = ops.paged_decode_attention(q, *caches[0], tables, lens, scale).float()
    want = torch_attention.decode_attention(q, *caches[0], group, scale).float()
    err = float((got - want).abs().max())
    t_torch, t_native, ratio = alternate(reference, native, args.reps)
    big = torch.ones(kv_bytes // 4, dtype=torch.float32)
    _, t_read, _ = alternate(native, big.sum, args.reps)
    isa = ops.decode_attention_isa()
    print(f"decode {ROWS} rows x 100-800 keys ({args.blocks} blocks), {LAYERS} layers, "
          f"{args.dtype}: "
          f"torch {t_torch * 1e3:.1f} ms, native ({impl}, {isa}) {t_native * 1e3:.1f} ms, "
          f"{ratio:.2f}x (median of pairs); max |diff| {err:.1e}")  # fmt: skip
    print(f"native kernel reads K/V at {kv_bytes / t_native / 1e9:.1f} GB/s, "
          f"a plain read of as many bytes {kv_bytes / t_read / 1e9:.1f} GB/s")  # fmt: skip
    print(json.dumps({
        "dtype": args.dtype, "blocks": args.blocks, "isa": isa, "impl": impl,
        "torch_ms": t_torch * 1e3,
        "native_ms": t_native * 1e3,
        "torch_over_native": ratio, "max_abs_diff": err,
        "kv_read_gb_s": kv_bytes / t_native / 1e9, "plain_read_gb_s": kv_bytes / t_read / 1e9,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
