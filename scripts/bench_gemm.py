#!/usr/bin/env python3
"""Projections on Tide's own GEMMs against oneDNN's packed matmul.

bfloat16 (default): the native AMX GEMM, past the GEMV's rows. float32 (``--dtype
float32``): the AVX2 + FMA GEMM of kernels/csrc/cpu_gemm_f32.cpp, at every row count, which
float32 projections take on CPUs without AVX-512 (AMD Zen 2/3).

For each row count, each projection shape of ``dummy:bench`` (qkv, o, gate|up, down, their
9 layers' weights streamed from memory as a step streams them) runs through
``tide::gemm_bf16`` on the GEMV's packed weight and through oneDNN's packed matmul at its
row bucket (what kernels/linear.py ran before the GEMM: weights packed for 64 rows, rows
padded to a multiple of 64), alternating; reported per shape: TFLOP/s of each (best of the
repeats) and their ratio. Compare ratios, not rates: the machine is shared.

    python scripts/bench_gemm.py
    python scripts/bench_gemm.py --rows 96,1024 --repeats 9
    python scripts/bench_gemm.py --dtype float32 --rows 1,8,16,32,64,256,1024
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as `tide` does, before torch loads

import torch

from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.kernels.linear import PACK_BATCH_HINT, packed_rows

# dummy:bench's fused projections (out, in).
SHAPES = {"qkv": (1536, 1024), "o": (1024, 1024), "gate_up": (5632, 1024), "down": (1024, 2816)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rows", default="128,256,512,1024", help="comma-separated row counts")
    parser.add_argument("--layers", type=int, default=9)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ops = cpu_kernels.ops()
    f32 = args.dtype == "float32"
    if f32 and (ops is None or not ops.gemm_f32_supported()):
        raise SystemExit("no float32 GEMM here (it needs AVX2 + FMA and the native kernels)")
    if not f32 and (ops is None or not cpu_kernels.gemm_rows_ready()):
        raise SystemExit("no native GEMM here (it needs AMX tiles and the native kernels)")
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    weights = {
        name: [(torch.randn(n, k, generator=gen) * 0.05).to(dtype) for _ in range(args.layers)]
        for name, (n, k) in SHAPES.items()
    }
    onednn = {
        name: [torch.ops.mkldnn._reorder_linear_weight(w, PACK_BATCH_HINT) for w in ws]
        for name, ws in weights.items()
    }
    pack, gemm = (ops.gemm_f32_pack, ops.gemm_f32) if f32 else (ops.gemv_pack_bf16, ops.gemm_bf16)
    native = {name: [pack(w) for w in ws] for name, ws in weights.items()}

    def best(step) -> float:  # type: ignore[no-untyped-def]
        step()
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            step()
            times.append(time.perf_counter() - started)
        return min(times)

    results: dict[str, dict[str, dict[str, float]]] = {}
    for rows in (int(r) for r in args.rows.split(",")):
        cells, row = [], {}
        for name, (n, k) in SHAPES.items():
            x = torch.randn(rows, k, generator=gen).to(dtype)
            padded = torch.cat([x, x.new_zeros(packed_rows(rows) - rows, k)])

            def run_onednn(name: str = name, padded: torch.Tensor = padded) -> None:
                for w in onednn[name]:
                    torch.ops.mkldnn._linear_pointwise(padded, w, None, "none", [], "")

            def run_gemm(name: str = name, x: torch.Tensor = x, n: int = n) -> None:
                for w in native[name]:
                    gemm(x, w, None, n)

            a, b = best(run_onednn), best(run_gemm)
            a, b = min(a, best(run_onednn)), min(b, best(run_gemm))  # alternate twice
            flops = 2.0 * rows * n * k * args.layers
            row[name] = {"onednn_tflops": flops / a / 1e12, "gemm_tflops": flops / b / 1e12}
            cells.append(f"{name} {flops / a / 1e12:.3f} / {flops / b / 1e12:.3f} ({a / b:.2f}x)")
        results[str(rows)] = row
        print(f"rows {rows}: " + " | ".join(cells) + "   (oneDNN / GEMM TFLOP/s)", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
