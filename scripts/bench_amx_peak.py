#!/usr/bin/env python3
"""How close oneDNN's matmul comes to this CPU's AMX tile peak, measured side by side.

    python scripts/bench_amx_peak.py [--rows 430] [--rounds 12]

Each round times (1) a loop of tile multiplies on register-resident tiles (four
independent 16x16x32 bf16 products per iteration: nothing but the tile unit) on one thread
and on --threads, then (2) the bench model's four projections (q|k|v, o, gate|up, down of
``dummy:bench`` shapes) at --rows rows through the packed oneDNN matmul the engine uses
(kernels/linear.py), on one thread and on --threads. A shared machine's tile rate moves
between rounds, so read the per-round ratio: the share of that moment's tile peak each
matmul reaches at the same thread count. The tile loop is compiled here with torch's C++
extension builder (once; torch caches the build).
The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.utils.cpp_extension import load_inline

TILE_LOOP = r"""
#include <torch/extension.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Four independent tile products per iteration on tiles that never leave the registers.
double tile_loop_one(int64_t iterations) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
  alignas(64) static uint16_t a[512] = {}, b[512] = {};
  alignas(64) float out[256];
  _tile_loadd(4, a, 64);
  _tile_loadd(5, b, 64);
  _tile_loadd(6, a, 64);
  _tile_loadd(7, b, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 6, 5);
    _tile_dpbf16ps(3, 6, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}

// The same loop on `threads` threads at once (each its own tiles).
double tile_loop(int64_t iterations, int64_t threads) {
  TORCH_CHECK(syscall(SYS_arch_prctl, 0x1023, 18) == 0, "the OS did not grant the AMX tile state");
  double sum = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : sum)
  for (int64_t t = 0; t < threads; ++t) sum += tile_loop_one(iterations);
  return sum;
}
"""

SHAPES = ((1536, 1024), (1024, 1024), (5632, 1024), (1024, 2816))  # dummy:bench, [out, in]
ITERATIONS = 200_000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=430, help="a mixed step's token count")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    ext = load_inline(
        "tide_bench_tile_loop", cpp_sources=TILE_LOOP, functions=["tile_loop"],
        extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"],
    )  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    weights = [
        torch.ops.mkldnn._reorder_linear_weight(
            torch.randn(n, k, generator=gen).to(torch.bfloat16), 64
        )
        for n, k in SHAPES
    ]
    xs = [torch.randn(args.rows, k, generator=gen).to(torch.bfloat16) for _, k in SHAPES]
    flops = sum(2 * args.rows * n * k for n, k in SHAPES)

    def matmuls(threads: int) -> float:
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        for x, w in zip(xs, weights, strict=True):
            torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
        return flops / (time.perf_counter() - t0)

    def tile_peak(threads: int) -> float:
        t0 = time.perf_counter()
        ext.tile_loop(ITERATIONS, threads)
        return threads * 4 * ITERATIONS * 16 * 16 * 32 * 2 / (time.perf_counter() - t0)

    n = args.threads
    matmuls(1), matmuls(n), ext.tile_loop(1000, n)  # warm-up
    rounds = []
    for _ in range(args.rounds):
        peak_1, peak_n = tile_peak(1), tile_peak(n)
        one, many = matmuls(1), matmuls(n)
        rounds.append({"tile_peak_1": peak_1, f"tile_peak_{n}": peak_n,
                       "onednn_1": one, f"onednn_{n}": many})  # fmt: skip
        print(f"tile peak 1 thread {peak_1 / 1e12:.2f}, {n} threads {peak_n / 1e12:.2f} TFLOP/s; "
              f"oneDNN at {args.rows} rows: 1 thread {one / 1e12:.2f} ({100 * one / peak_1:.0f}%), "
              f"{n} threads {many / 1e12:.2f} ({100 * many / peak_n:.0f}%)")  # fmt: skip
    share = {
        "onednn_1": statistics.median(r["onednn_1"] / r["tile_peak_1"] for r in rounds),
        f"onednn_{n}": statistics.median(r[f"onednn_{n}"] / r[f"tile_peak_{n}"] for r in rounds),
    }
    print(json.dumps({"rows": args.rows, "median_share_of_tile_peak": share, "rounds": rounds}))


if __name__ == "__main__":
    main()
