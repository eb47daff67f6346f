#!/usr/bin/env python3
"""What the engine does on a real GPU: one command, one JSON line on stdout, a few minutes
on an H200. It imports the installed ``tide_fleet`` (``pip install -e .``; on a machine with
no index, ``pip install --no-deps --no-build-isolation -e .``).

    python scripts/gpu_check.py            # random-weight Llama-3-8B and Qwen2.5-7B shapes, bf16
    python scripts/gpu_check.py --smoke    # a tiny shape, any device (CI runs it on CPU)
    python scripts/gpu_check.py --out r.json --stories ../shared/models/stories260K
        # also write the report as it grows; also check the llama2.c references

No network and no service dependencies: the models are built in code, directly on the
device, from torch, triton and numpy (what the engine imports besides is listed under
"imports_outside_allowed"). Each section records its numbers or its error; a failing
section never hides the others. Without CUDA and without --smoke it prints
{"error": "no CUDA device", ...} and exits 0.

Recorded per model: start-up with default settings (error, or seconds, KV blocks and the
CUDA-graph capture time); greedy tokens with the Triton backend (CUDA graphs on, and off)
and the torch backend over prompts that hit the prefix cache and, in a small pool, get
preempted; the two backends' logits over one greedy request (largest difference, and the
top-2 margin where the tokens first differ: bf16 near-ties on random weights); decode step
time at batch 1/16/64 and context 512/4096 with CUDA graphs and eager (first step and steady
median, host time, compiled variants added), the batch-1 step against its weight-read time
at the measured copy bandwidth; a profiler split of a steady decode step (device busy vs
wall: the GPU's idle share); prefill tokens/s at 1k and 8k; sampler cost at batch 64 and
256 for greedy, temperature 1 and top-k + top-p rows on the Triton kernel and the torch path,
and whether their tokens agree; decode-attention bandwidth against a measured device copy.
On CPU (--smoke) the graph path runs eagerly (padded static buffers), and the profiler split
is skipped. For the first
shape: the engine loop at a steady decode batch of 1, 64 and 256, overlapped and serial,
output tok/s and the GPU's busy share from a device-only trace, and prefill at 1k tokens
against the measured bf16 matmul peak (scripts/gpu_engine_loop.py); steps carrying a
prefill chunk beside decode rows, their layers replayed as CUDA graphs in pieces around
attention and run eagerly (time, logits and greedy tokens both ways: scripts/gpu_mixed.py);
the engine at
tensor_parallel_size 1 through the distributed path (NCCL; gloo on CPU) against the plain
one: greedy tokens and decode step time (scripts/gpu_tp.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from gpu_decode import copy_bandwidth, decode_steps, device_time, section, sync, timed
from gpu_engine_loop import engine_loop, matmul_peak, prefill_share
from gpu_greedy import greedy_match, logits_gap, stories_references
from gpu_mixed import mixed_steps
from gpu_tp import one_rank

from tide_fleet.worker.models.random_model import SHAPES, build_random_model

ALLOWED = {"torch", "triton", "safetensors", "tokenizers", "numpy", "xxhash"}
FULL = dict(batches=(1, 16, 64), contexts=(512, 4096), prefills=(1024, 8192), reps=10)
SMOKE = dict(batches=(1, 4), contexts=(32, 80), prefills=(64, 128), reps=2)


def startup(model, device: torch.device) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    from tide_fleet.worker.engine.config import EngineConfig
    from tide_fleet.worker.engine.llm_engine import LLMEngine

    start = time.perf_counter()
    engine = LLMEngine(model, None, EngineConfig())
    sync(device)
    runner = engine.runner
    return {
        "seconds": round(time.perf_counter() - start, 2),
        "kv_blocks": runner.num_blocks,
        "kv_gib": round(runner.num_blocks * runner.block_bytes / 2**30, 2),
        "block_size": runner.block_size,
        "cuda_graphs": runner.graph_mode,
        "graph_capture_seconds": round(runner.graphs.capture_seconds, 2) if runner.graphs else None,
        "prefill_graph_capture_seconds": round(runner.mixed.capture_seconds, 2)
        if runner.mixed
        else None,
        "prefill_graph_error": runner.mixed.error if runner.mixed else None,
    }


def sampler_cost(vocab: int, device: torch.device, smoke: bool, reps: int) -> dict[str, Any]:
    """A sample() call at batch 64 and 256 (smoke: 4) for greedy, temperature-1 and
    top-k 50 + top-p 0.9 rows, seeded, on the Triton kernel and the torch path (forced in
    turn): median ms each, and whether the two picked the same tokens (rows that differ)."""
    from tide_fleet.infra.contract.sampling_params import SamplingParams
    from tide_fleet.kernels import dispatch
    from tide_fleet.worker.engine.request import Request
    from tide_fleet.worker.engine.sampler import Sampler

    kinds = {"greedy": dict(temperature=0.0), "t1": dict(temperature=1.0),
             "topk_topp": dict(temperature=1.0, top_k=50, top_p=0.9)}  # fmt: skip
    out: dict[str, Any] = {}
    for n in (4,) if smoke else (64, 256):
        logits = torch.randn(n, vocab, device=device)
        for kind, options in kinds.items():
            reqs = [Request(f"r{i}", [1], SamplingParams(seed=i, **options)) for i in range(n)]
            picked = {}
            for impl in ("triton", "torch"):
                dispatch.force("sampling", impl, "gpu_check")
                try:
                    sampler = Sampler(device)
                    picked[impl] = sampler.sample(logits.clone(), reqs).token_ids
                    call = lambda s=sampler, r=reqs, x=logits: s.sample(x.clone(), r)  # noqa: E731
                    times = [timed(call, device) for _ in range(reps)]
                finally:
                    dispatch.force("sampling", None, "gpu_check")
                out[f"b{n}_{kind}_{impl}_ms"] = round(statistics.median(times) * 1e3, 3)
            differ = sum(a != b for a, b in zip(picked["triton"], picked["torch"], strict=True))
            out[f"b{n}_{kind}_equal"], out[f"b{n}_{kind}_rows_differ"] = differ == 0, differ
    return out


def attention_bandwidth(device: torch.device, smoke: bool, copy_gb_s: float) -> dict[str, Any]:
    from tide_fleet.kernels import triton_decode as tk

    n, context, kvh, heads, hd, bs = (4, 256, 2, 8, 16, 16) if smoke else (64, 4096, 8, 32, 128, 16)
    width = context // bs
    k = torch.randn(kvh, n * width, bs, hd, dtype=torch.bfloat16, device=device)
    v = torch.randn_like(k)
    tables = torch.arange(n * width, device=device).view(n, width)
    lens = torch.full((n,), context, dtype=torch.int32, device=device)
    q = torch.randn(n, heads, hd, dtype=torch.bfloat16, device=device)
    call = lambda: tk.decode_attention(q, k, v, tables, lens, hd**-0.5, context)  # noqa: E731
    seconds = device_time(call, device, 3 if smoke else 50)
    kv_bytes = 2 * n * context * kvh * hd * 2
    achieved, peak = kv_bytes / seconds, copy_gb_s * 1e9
    return {"shape": f"batch {n}, context {context}, kv_heads {kvh}, head_dim {hd}, bf16",
            "achieved_gb_s": round(achieved / 1e9, 1), "copy_peak_gb_s": round(peak / 1e9, 1),
            "fraction_of_peak": round(achieved / peak, 3)}  # fmt: skip


def imports_outside_allowed() -> list[str]:
    tops = {name.split(".")[0] for name in list(sys.modules)}
    site = [p for p in sys.path if "site-packages" in p]
    extra = []
    for top in sorted(tops - ALLOWED):
        mod = sys.modules.get(top)
        path = getattr(mod, "__file__", None) or ""
        if any(path.startswith(s) for s in site) and not top.startswith("_"):
            extra.append(top)
    return extra


def run(smoke: bool, out: Path | None = None, stories: Path | None = None) -> dict[str, Any]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    plan = SMOKE if smoke else FULL
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report: dict[str, Any] = {"device": name, "torch": torch.__version__, "smoke": smoke}

    def step(into: dict[str, Any], title: str, fn) -> None:  # type: ignore[no-untyped-def]
        section(into, title, fn)
        if out is not None:  # the report so far: a run cut off keeps what it measured
            out.write_text(json.dumps(report))

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    copy_gb_s = copy_bandwidth(device, smoke)
    report["copy_gb_s"] = round(copy_gb_s, 1)
    peak = matmul_peak(device, smoke)
    report["matmul_peak_tflop_s"] = round(peak / 1e12, 2)
    if stories is not None:
        step(report, "stories260k_references", lambda: stories_references(stories, device))
    for shape in ("tiny",) if smoke else ("llama3-8b", "qwen2.5-7b"):
        entry: dict[str, Any] = {}
        report[shape] = entry
        start = time.perf_counter()
        model = build_random_model(SHAPES[shape], device, dtype)
        sync(device)
        entry["build_seconds"] = round(time.perf_counter() - start, 2)
        step(entry, "startup_defaults", lambda m=model: startup(m, device))
        if device.type == "cuda":
            torch.cuda.empty_cache()
        step(entry, "greedy_triton_vs_torch", lambda m=model: greedy_match(m, smoke))
        step(entry, "logits_triton_vs_torch", lambda m=model: logits_gap(m, smoke))
        step(entry, "decode", lambda m=model: decode_steps(m, device, plan, copy_gb_s))
        step(entry, "sampler", lambda m=model: sampler_cost(m.config.vocab_size, device, smoke,
                                                                plan["reps"]))  # fmt: skip
        if shape in ("tiny", "llama3-8b"):
            step(entry, "engine_loop", lambda m=model: engine_loop(m, device, smoke))
            n = min(plan["prefills"])
            step(entry, f"prefill_{n}_of_matmul_peak", lambda m=model, e=entry, n=n:
                 prefill_share(m, e.get("decode", {}), peak, n))  # fmt: skip
            step(entry, "mixed_steps", lambda m=model: mixed_steps(m, device, smoke))
            step(entry, "tensor_parallel_one_rank", lambda m=model: one_rank(m, device, smoke))
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    step(report, "decode_attention_bandwidth",
             lambda: attention_bandwidth(device, smoke, copy_gb_s))  # fmt: skip
    report["imports_outside_allowed"] = imports_outside_allowed()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny model on any device")
    parser.add_argument(
        "--out",
        type=Path,
        metavar="PATH",
        help="also write the report here, rewritten after every section",
    )
    parser.add_argument(
        "--stories",
        type=Path,
        metavar="DIR",
        help="also check greedy tokens against the llama2.c references in this stories260K folder",
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        if not args.smoke:
            print(json.dumps({"error": "no CUDA device", "torch": torch.__version__}))
            return 0
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels load
    start = time.perf_counter()
    report = run(args.smoke, args.out, args.stories)
    report["seconds"] = round(time.perf_counter() - start, 1)
    if args.out is not None:
        args.out.write_text(json.dumps(report))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
