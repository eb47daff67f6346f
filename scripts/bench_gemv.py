#!/usr/bin/env python3
"""Projections: native GEMV (AMX tiles up to 64 rows, or AVX-512 BF16 at 1-2 rows) vs oneDNN
packed vs F.linear, weights read from memory.

Streams the 36 distinct projection weights of ``dummy:bench``'s 9 layers (204 MB of
bf16, more than the caches hold) once per pass, as one decode step does, for a few row
counts, and prints each path's time and effective weight-read bandwidth beside a plain
streaming read (``sum()`` over 1 GiB) in the same process. Compare ratios, not times.

    python scripts/bench_gemv.py
    python scripts/bench_gemv.py --rows 1,2,4 --repeats 21
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as `tide` does, before torch loads

import torch
import torch.nn.functional as F
from bench_engine import read_bandwidth  # this folder is on sys.path when run as a script

from tide_fleet.kernels import cpu as cpu_kernels

# dummy:bench's fused projections (out, in): qkv, o, gate_up, down.
LAYER = [(1536, 1024), (1024, 1024), (5632, 1024), (1024, 2816)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rows", default="1,2,8,64", help="comma-separated row counts")
    parser.add_argument("--layers", type=int, default=9)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ops = cpu_kernels.ops()
    gen = torch.Generator().manual_seed(0)
    weights = [
        (torch.randn(n, k, generator=gen) * 0.05).to(torch.bfloat16)
        for _ in range(args.layers)
        for n, k in LAYER
    ]
    onednn = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights]
    native = [ops.gemv_pack_bf16(w) for w in weights] if cpu_kernels.gemv_max_rows() else []
    nbytes = sum(w.numel() * 2 for w in weights)
    print(f"{len(weights)} weights, {nbytes / 1e6:.0f} MB bf16; plain read "
          f"{read_bandwidth() / 1e9:.1f} GB/s; {args.threads} threads")  # fmt: skip

    def timed(step) -> float:
        for _ in range(3):
            step()
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    for rows in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(rows, k, generator=gen).to(torch.bfloat16) for _, k in LAYER}
        paths = {
            "onednn": lambda xs=xs: [
                torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], p, None, "none", [], "")
                for w, p in zip(weights, onednn, strict=True)
            ],
            "F.linear": lambda xs=xs: [F.linear(xs[w.shape[1]], w) for w in weights],
        }
        if native and rows <= cpu_kernels.gemv_max_rows():
            paths["native"] = lambda xs=xs: [
                ops.gemv_bf16(xs[w.shape[1]], p, None, w.shape[0])
                for w, p in zip(weights, native, strict=True)
            ]
        if native and rows <= 2:  # the path CPUs without AMX take
            paths["native-avx512"] = lambda xs=xs: [
                ops.gemv_bf16_vector(xs[w.shape[1]], p, None, w.shape[0])
                for w, p in zip(weights, native, strict=True)
            ]
        results = {name: timed(step) for name, step in paths.items()}
        cells = [f"{n} {t * 1e3:.2f} ms ({nbytes / t / 1e9:.1f} GB/s)" for n, t in results.items()]
        line = f"rows {rows}: " + " | ".join(cells)
        if "native" in results:
            line += f" | native/onednn speed {results['onednn'] / results['native']:.2f}x"
        print(line)


if __name__ == "__main__":
    main()
