#!/usr/bin/env python3
"""Engine benchmark: Tide against HF transformers on the same weights and workload.

One invocation runs the same seeded, heavy-tailed workload through
  (a) Tide's engine, (b) transformers `generate` with static padded batches,
  (c) transformers continuous batching (`generate_batch` machinery),
and prints useful output tokens/s for each with the ratios. It also measures the
batch-1 decode step against the bandwidth roofline, and TTFT with and without prefix
caching for requests sharing a long prefix. The last line is one JSON object.

    python scripts/bench_engine.py                 # the full run (several minutes)
    python scripts/bench_engine.py --num-requests 40 --peers tide,hf-cb   # quicker

Absolute numbers only mean something on a quiet machine; compare the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as `tide` does, before torch loads

import torch

from tide_fleet.infra.bench.peer_workloads import mixed as workload
from tide_fleet.infra.contract.model_config import ModelConfig
from tide_fleet.worker.engine import LLMEngine, SamplingParams
from tide_fleet.worker.models.resolve import resolve_model_path


def bench_tide(folder: Path, work, args) -> dict:
    engine = LLMEngine.from_pretrained(
        str(folder), dtype="bfloat16", device="cpu",
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
    )  # fmt: skip
    engine.generate([[1, 5, 6]], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    params = [SamplingParams(max_tokens=o, temperature=0.0, ignore_eos=True) for _, o in work]
    t0 = time.perf_counter()
    outs = engine.generate([p for p, _ in work], params)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.token_ids) for o in outs)
    assert tokens == sum(o for _, o in work), "Tide produced a different number of tokens"
    return {"tokens": tokens, "seconds": wall, "tok_per_s": tokens / wall, "stats": engine.stats()}


def bench_hf_static(folder: Path, work, args) -> dict:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16)
    model.eval()
    order = sorted(
        range(len(work)), key=lambda i: len(work[i][0])
    )  # its best case: similar lengths
    useful, t0 = 0, time.perf_counter()
    for start in range(0, len(order), args.hf_batch):
        batch = [work[i] for i in order[start : start + args.hf_batch]]
        width = max(len(p) for p, _ in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, (p, _) in enumerate(batch):  # left padding
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        new = max(o for _, o in batch)
        with torch.inference_mode():
            model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                do_sample=False, pad_token_id=0, eos_token_id=None,
            )  # fmt: skip
        useful += sum(o for _, o in batch)
    wall = time.perf_counter() - t0
    return {"tokens": useful, "seconds": wall, "tok_per_s": useful / wall, "batch": args.hf_batch}


def bench_hf_cb(folder: Path, work, args) -> dict:
    import transformers
    from transformers import GenerationConfig

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.bfloat16, attn_implementation="sdpa"
    )
    model.eval()
    gen = GenerationConfig(
        max_new_tokens=max(o for _, o in work), do_sample=False, eos_token_id=-1, pad_token_id=0
    )
    manager = model.init_continuous_batching(generation_config=gen)
    manager.start()
    try:
        t0 = time.perf_counter()
        for i, (p, o) in enumerate(work):
            manager.add_request(p, request_id=f"r{i}", max_new_tokens=o, eos_token_id=-1)
        done, tokens = 0, 0
        while done < len(work):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                done += 1
                tokens += len(result.generated_tokens)
            elif result is None and not manager.is_running():
                raise RuntimeError("transformers continuous batching stopped early")
        wall = time.perf_counter() - t0
    finally:
        manager.stop(block=True)
    return {"tokens": tokens, "seconds": wall, "tok_per_s": tokens / wall}


def read_bandwidth() -> float:
    """Best of a few streaming reads of 1 GiB (bytes/s)."""
    x = torch.ones(256 * 1024 * 1024, dtype=torch.float32)
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - t))
    return best


def bench_decode_roofline(folder: Path) -> dict:
    engine = LLMEngine.from_pretrained(str(folder), dtype="bfloat16", device="cpu")
    engine.add_request(
        "d", [1, 5, 6, 7], SamplingParams(max_tokens=80, temperature=0.0, ignore_eos=True)
    )
    for _ in range(10):
        engine.step()
    times = []
    while engine.has_unfinished():
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    step = statistics.median(times)
    weight_bytes = ModelConfig.from_folder(folder).num_parameters() * 2
    bw = read_bandwidth()
    roofline = weight_bytes / bw
    return {
        "step_ms": step * 1e3,
        "roofline_ms": roofline * 1e3,
        "fraction_of_roofline": roofline / step,
        "read_gb_per_s": bw / 1e9,
        "weight_bytes": weight_bytes,
    }


def bench_prefix_ttft(folder: Path, n: int, prefix_len: int, caching: bool, seed: int) -> dict:
    rng = random.Random(seed)
    prefix = [1, *(rng.randrange(4, 260) for _ in range(prefix_len - 1))]
    engine = LLMEngine.from_pretrained(
        str(folder), dtype="bfloat16", device="cpu", enable_prefix_caching=caching
    )
    for i in range(n):
        suffix = [rng.randrange(4, 260) for _ in range(16)]
        engine.add_request(f"p{i}", prefix + suffix, SamplingParams(max_tokens=1, temperature=0.0))
    ttft = []
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                ttft.append(out.timings.first_token - out.timings.arrival)
    return {
        "p50_s": statistics.median(ttft),
        "max_s": max(ttft),
        "hits": engine.stats()["prefix_cache_hits"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model", default="dummy:bench", help="HF folder or dummy:PRESET")
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peers", default="tide,hf-static,hf-cb")
    parser.add_argument("--hf-batch", type=int, default=32, help="static batch size for (b)")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=1024)
    parser.add_argument("--skip-roofline", action="store_true")
    parser.add_argument("--skip-prefix", action="store_true")
    parser.add_argument("--prefix-requests", type=int, default=64)
    parser.add_argument("--prefix-len", type=int, default=1024)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = resolve_model_path(args.model)
    cfg = ModelConfig.from_folder(folder)
    work = workload(args.num_requests, args.seed, cfg.max_model_len)
    print(
        f"model {args.model} ({cfg.num_parameters() / 1e6:.0f}M params, bf16), "
        f"{len(work)} requests, prompt tokens {sum(len(p) for p, _ in work)}, "
        f"output tokens {sum(o for _, o in work)}, torch threads {args.threads}"
    )
    results: dict = {"model": args.model, "num_requests": len(work)}
    runners = {"tide": bench_tide, "hf-static": bench_hf_static, "hf-cb": bench_hf_cb}
    for name in args.peers.split(","):
        r = runners[name](folder, work, args)
        results[name] = r
        print(f"  {name:10s} {r['tok_per_s']:8.1f} output tok/s  ({r['seconds']:.1f} s)")
    if "tide" in results:
        for peer in ("hf-static", "hf-cb"):
            if peer in results:
                ratio = results["tide"]["tok_per_s"] / results[peer]["tok_per_s"]
                results[f"tide_over_{peer}"] = ratio
                print(f"  tide / {peer}: {ratio:.2f}x")
    if not args.skip_roofline:
        r = bench_decode_roofline(folder)
        results["decode_batch1"] = r
        print(
            f"  batch-1 decode step {r['step_ms']:.2f} ms, roofline {r['roofline_ms']:.2f} ms "
            f"({r['read_gb_per_s']:.1f} GB/s read): "
            f"{100 * r['fraction_of_roofline']:.0f}% of roofline"
        )
    if not args.skip_prefix:
        off = bench_prefix_ttft(folder, args.prefix_requests, args.prefix_len, False, args.seed)
        on = bench_prefix_ttft(folder, args.prefix_requests, args.prefix_len, True, args.seed)
        results["prefix_ttft"] = {"off": off, "on": on, "p50_speedup": off["p50_s"] / on["p50_s"]}
        print(
            f"  TTFT p50, {args.prefix_requests} requests sharing {args.prefix_len} tokens: "
            f"{off['p50_s']:.2f} s without prefix caching, {on['p50_s']:.3f} s with: "
            f"{off['p50_s'] / on['p50_s']:.1f}x"
        )
    print(json.dumps(results, default=float))


if __name__ == "__main__":
    main()
