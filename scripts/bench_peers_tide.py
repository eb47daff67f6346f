#!/usr/bin/env python3
"""Tide's engine on a workload file, in its own process: scripts/bench_peers.py runs it.

The workload file is a list of [prompt token ids, output tokens]; greedy, ignore_eos. Model
load and a warm-up excluded. Prints one JSON line: output tokens, seconds, tok/s, TTFT
p50/p99, the share of step time by step kind. With --profile (a separate run: the profiler
slows it) instead the share of the run's time by kind of op: matmuls, attention, other ops,
and what no op accounts for (Python, scheduling, sampling glue).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as `tide` does, before torch loads

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.bench.peer_args import peer_parser
from infra.stats import percentile
from worker.engine import LLMEngine, SamplingParams

MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "mkldnn")
ATTENTION = ("attention", "sdpa", "scaled_dot_product", "write_kv_cache", "flash")


def op_kind(name: str) -> str:
    low = name.lower()
    if any(low.startswith(m) or m in low for m in MATMUL):
        return "matmul"
    if any(a in low for a in ATTENTION):
        return "attention"
    return "other_ops"


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
        args.model, dtype="bfloat16", device="cpu", max_num_seqs=args.max_num_seqs,
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

    def on_step(stats, outputs) -> None:  # type: ignore[no-untyped-def]
        if stats is not None:
            steps[stats.kind] += stats.duration_s

    engine.on_step = on_step
    wall, outs = run(engine, work)
    tokens = sum(len(o.token_ids) for o in outs)
    assert tokens == sum(o for _, o in work), "Tide produced a different number of tokens"
    ttft = [o.timings.first_token - o.timings.arrival for o in outs]
    split = {k: steps[k] / wall for k in ("prefill", "mixed", "decode")}
    split["outside_steps"] = max(0.0, 1.0 - sum(split.values()))
    print(json.dumps({
        "tokens": tokens, "seconds": wall, "tok_per_s": tokens / wall,
        "ttft_p50_s": statistics.median(ttft), "ttft_p99_s": percentile(ttft, 99),
        "step_split": split, "prefix_cache_hits": engine.stats().get("prefix_cache_hits"),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
