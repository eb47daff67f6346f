#!/usr/bin/env python3
"""Tide's engine on a workload file, in its own process: scripts/bench_peers.py runs it.

The workload file is a list of [prompt token ids, output tokens]; greedy, ignore_eos. Model
load and a warm-up excluded. Prints one JSON line: output tokens, seconds, tok/s, TTFT
p50/p99, the share of step time by step kind. With --profile (a separate run: the profiler
slows it) instead the share of the run's time by kind of op: matmuls, attention, other ops,
and what no op accounts for (Python, scheduling, sampling glue).

Beside the run, the machine's read bandwidth and matmul peak are measured (before and after
it, best of both: the speed of a shared machine drifts) and the run's roofline is reported:
one weight read per step with decode rows plus the prefill FLOPs at the peak
(infra/plan/roofline.py: run_roofline_seconds), and the run's share of it.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as `tide` does, before torch loads

import torch

from tide_fleet.infra.bench.op_kinds import op_kind
from tide_fleet.infra.bench.peer_args import peer_parser
from tide_fleet.infra.plan.roofline import DevicePeaks, ModelCost, run_roofline_seconds
from tide_fleet.infra.stats import percentile
from tide_fleet.worker.engine import LLMEngine, SamplingParams


def measure_peaks(engine: LLMEngine) -> DevicePeaks:
    """Read bandwidth: the best of 5 sums of 512 MiB (far past the caches). Matmul peak:
    the best of 5 runs of each of the model's projections at 1,024 rows through the
    engine's own matmul path, with their weights as the engine holds them."""

    def best(fn, *args, repeats: int = 5) -> float:  # type: ignore[no-untyped-def]
        fn(*args)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - t0)
        return max(min(times), 1e-9)

    big = torch.ones(1 << 27, dtype=torch.float32)
    bandwidth = big.nbytes / best(big.sum)
    del big
    layer = engine.model.layers[0]
    flops = 0.0
    for lin in (layer.qkv, layer.o, layer.gate_up, layer.down):
        x = torch.randn(1024, lin.in_features, dtype=engine.model.dtype)
        flops = max(flops, 2 * 1024 * lin.in_features * lin.out_features / best(lin, x))
    return DevicePeaks(flops, bandwidth, "measured")


def run(engine: LLMEngine, work: list) -> tuple[float, list]:
    params = [SamplingParams(max_tokens=o, temperature=0.0, ignore_eos=True) for _, o in work]
    t0 = time.perf_counter()
    outs = engine.generate([p for p, _ in work], params)
    return time.perf_counter() - t0, outs


def main() -> None:
    parser = peer_parser(__doc__)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = json.loads(Path(args.workload).read_text())
    engine = LLMEngine.from_pretrained(
        args.model, dtype=args.dtype, device="cpu", max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )  # fmt: skip
    engine.generate([[1, 5, 6]], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            wall, _ = run(engine, work)
        by_kind: dict[str, float] = defaultdict(float)
        for e in prof.key_averages():
            by_kind[op_kind(e.key)] += e.self_cpu_time_total / 1e6
        ops = {k: by_kind[k] / wall for k in ("matmul", "attention", "other_ops")}
        ops["python_and_scheduling"] = max(0.0, 1.0 - sum(ops.values()))
        print(json.dumps({"ops": ops, "seconds": wall}))
        return
    steps: dict[str, float] = defaultdict(float)
    shapes: list[tuple[int, int]] = []  # (decode rows, prefill tokens) per step

    def on_step(stats, outputs) -> None:  # type: ignore[no-untyped-def]
        if stats is not None:
            steps[stats.kind] += stats.duration_s
            shapes.append((stats.num_decode_tokens, stats.num_prefill_tokens))

    engine.on_step = on_step
    before = measure_peaks(engine)
    wall, outs = run(engine, work)
    after = measure_peaks(engine)
    peaks = DevicePeaks(
        max(before.flops, after.flops), max(before.bandwidth, after.bandwidth), "measured"
    )
    roofline = run_roofline_seconds(
        ModelCost.from_config(engine.model.config, engine.model.dtype.itemsize), shapes, peaks
    )
    tokens = sum(len(o.token_ids) for o in outs)
    assert tokens == sum(o for _, o in work), "Tide produced a different number of tokens"
    ttft = [o.timings.first_token - o.timings.arrival for o in outs]
    split = {k: steps[k] / wall for k in ("prefill", "mixed", "decode")}
    split["outside_steps"] = max(0.0, 1.0 - sum(split.values()))
    print(json.dumps({
        "tokens": tokens, "seconds": wall, "tok_per_s": tokens / wall,
        "ttft_p50_s": statistics.median(ttft), "ttft_p99_s": percentile(ttft, 99),
        "step_split": split, "prefix_cache_hits": engine.stats().get("prefix_cache_hits"),
        "roofline": {"seconds": roofline, "share": roofline / wall,
                     "read_gb_s": peaks.bandwidth / 1e9, "matmul_tflop_s": peaks.flops / 1e12},
    }))  # fmt: skip


if __name__ == "__main__":
    main()
