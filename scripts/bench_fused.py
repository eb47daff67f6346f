#!/usr/bin/env python3
"""The layer's elementwise glue: native fused ops against their torch spelling.

Residual add + RMSNorm, SiLU x up and RoPE at decode (1, 23 rows) and prefill (1024
rows) sizes of dummy:bench (hidden 1024, intermediate 2816, head_dim 64), bf16,
median microseconds per call and the torch/native ratio.

    python scripts/bench_fused.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.worker.models.rope import apply_rotary


def micros(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def time_rows(ops, rows: int, repeats: int) -> list[str]:
    """One table row: each fused op against its torch spelling at `rows` rows."""
    bf16, hidden, inter, hd, heads = torch.bfloat16, 1024, 2816, 64, 24  # 16 q + 4 k + 4 v
    cos = torch.randn(4096, hd).to(bf16)
    sin = torch.randn(4096, hd).to(bf16)
    x = torch.randn(rows, hidden).to(bf16)
    delta = torch.randn(rows, hidden).to(bf16)
    w = torch.randn(hidden).to(bf16)
    gate_up = torch.randn(rows, 2 * inter).to(bf16)
    qkv = torch.randn(rows, heads * hd).to(bf16)
    pos = torch.arange(rows)
    pairs = {
        "add+rmsnorm": (
            lambda: ops.add_rms_norm_(x.clone(), delta, w, 1e-5),
            lambda: F.rms_norm(x + delta, (hidden,), w, 1e-5),
        ),
        "silu*up": (
            lambda: ops.silu_mul(gate_up),
            lambda: F.silu(gate_up[:, :inter]) * gate_up[:, inter:],
        ),
        "rope q+k": (
            lambda: ops.rotary_(qkv, pos, cos, sin, 20, hd),
            lambda: apply_rotary(
                qkv[:, : 20 * hd].view(rows, 20, hd), cos[pos][:, None], sin[pos][:, None]
            ),
        ),
    }
    cells = []
    for name, (native, reference) in pairs.items():
        n, r = micros(native, repeats), micros(reference, repeats)
        cells.append(f"{name} {n:.1f} vs {r:.1f} us ({r / n:.1f}x)")
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rows", default="1,23,1024")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ops = cpu_kernels.ops()
    if ops is None:
        sys.exit("native CPU kernels are not available here")
    for rows in (int(r) for r in args.rows.split(",")):
        print(f"rows {rows}: " + " | ".join(time_rows(ops, rows, args.repeats)))


if __name__ == "__main__":
    main()
