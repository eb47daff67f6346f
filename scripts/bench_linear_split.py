#!/usr/bin/env python3
"""Large packed CPU matmuls in one call against the same rows in pieces, per projection.

For each projection shape of a model (dummy:bench: qkv, o, gate|up, down over 9 layers,
its weights streamed from memory as a step streams them), a pass over every layer at
ROWS rows in one oneDNN call each against the same pass in ``SPLIT_ROWS``-row pieces,
alternating, with the engine's allocator settings (worker/engine/host_memory.py). Prints
the best time of each and the median of the per-pass ratios, and what the model loader's
``choose_row_split`` picks for the shape on this machine. Compare ratios, not times. On
AMX the engine's bf16 projections take the native GEMM, not oneDNN; this script times
oneDNN's path regardless (what CPUs without AMX run, and float32 everywhere).

    python scripts/bench_linear_split.py
    python scripts/bench_linear_split.py --rows 768 --repeats 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as `tide` does, before torch loads

import torch

from tide_fleet.infra.contract.model_config import ModelConfig
from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.kernels import linear
from tide_fleet.kernels.linear import Linear
from tide_fleet.worker.engine.host_memory import keep_step_buffers
from tide_fleet.worker.models.resolve import resolve_model_path


def timed_pass(layers: list[Linear], x: torch.Tensor, split: int) -> float:
    for lin in layers:
        lin.split_rows = split
    started = time.perf_counter()
    for lin in layers:
        lin(x)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model", default="dummy:bench")
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_step_buffers()
    cfg = ModelConfig.from_folder(resolve_model_path(args.model))
    h, inter, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    shapes = {
        "qkv": ((cfg.num_heads + 2 * cfg.num_kv_heads) * hd, h),
        "o": (h, cfg.num_heads * hd),
        "gate_up": (2 * inter, h),
        "down": (h, inter),
    }
    gen = torch.Generator().manual_seed(0)
    print(f"{args.model}: {cfg.num_layers} layers, {args.rows} rows, pieces of "
          f"{linear.SPLIT_ROWS}, {args.threads} threads")  # fmt: skip
    # Time oneDNN's path: on AMX, bf16 projections take the native GEMM instead.
    cpu_kernels.gemm_rows_ready = lambda: False
    for name, (out_f, in_f) in shapes.items():
        layers = [
            Linear((torch.randn(out_f, in_f, generator=gen) * 0.02).to(torch.bfloat16))
            for _ in range(cfg.num_layers)
        ]
        if not layers[0].packed:
            raise SystemExit("oneDNN's packed bf16 matmul is not available here")
        layers[0].warm_up(args.rows)
        x = torch.randn(args.rows, in_f, generator=gen).to(torch.bfloat16)
        whole, pieces = [], []
        timed_pass(layers, x, 0), timed_pass(layers, x, linear.SPLIT_ROWS)
        for _ in range(args.repeats):
            whole.append(timed_pass(layers, x, 0))
            pieces.append(timed_pass(layers, x, linear.SPLIT_ROWS))
        ratio = statistics.median(w / p for w, p in zip(whole, pieces, strict=True))
        chosen = linear.choose_row_split(layers, args.rows)
        flops = 2 * out_f * in_f * args.rows * cfg.num_layers
        print(f"  {name:8s} one call {min(whole) * 1e3:6.1f} ms "
              f"({flops / min(whole) / 1e12:.2f} TFLOP/s), pieces {min(pieces) * 1e3:6.1f} ms "
              f"({flops / min(pieces) / 1e12:.2f}): {ratio:.2f}x; chosen: "
              f"{'pieces' if chosen else 'one call'}")  # fmt: skip


if __name__ == "__main__":
    main()
