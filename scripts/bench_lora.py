#!/usr/bin/env python3
"""LoRA benchmark: many adapters on one base, against the base alone and one model per
fine-tune.

The same requests (seeded prompts, fixed output lengths, greedy, EOS ignored) run three ways:
  base    every request on the base model (also on an engine without adapter slots: what
          serving adapters costs steps that use none);
  lora    request i under adapter i % N, every adapter served at once from the engine's
          slots (mixed in each step);
  merged  each adapter merged into its own copy of the base, loaded and run on its
          requests one after another (the one-model-per-fine-tune way), its load time
          reported apart.
Adapters are random (rank --rank on every projection), written in PEFT's format. Reports
output tokens/s and the ratios lora/base and lora/merged; the last line is one JSON object.

    python scripts/bench_lora.py                      # 64 requests over 8 adapters
    python scripts/bench_lora.py --skip-merged --requests 32

Absolute numbers only mean something on a quiet machine; compare the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as `tide` does, before torch loads

import torch

from tide_fleet.infra.contract.model_config import ModelConfig
from tide_fleet.worker.engine import LLMEngine, SamplingParams
from tide_fleet.worker.lora.files import merge_adapter, write_random_adapter
from tide_fleet.worker.models.resolve import resolve_model_path

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


def _requests(args: argparse.Namespace, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(args.prompt_tokens // 2, args.prompt_tokens * 3 // 2,
                            (args.requests,), generator=g)  # fmt: skip
    return [torch.randint(3, vocab, (int(n),), generator=g).tolist() for n in lengths]


def _engine(folder: Path, args: argparse.Namespace, max_loras: int) -> LLMEngine:
    engine = LLMEngine.from_pretrained(
        str(folder), dtype=args.dtype, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, kv_cache_memory=args.kv_memory,
        max_loras=max_loras, max_lora_rank=args.rank,
    )  # fmt: skip
    engine.generate([[1, 5, 6]], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    return engine


def _run(engine: LLMEngine, prompts: list[list[int]], loras: list[str | None],
         max_tokens: int) -> tuple[int, float]:  # fmt: skip
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    for i, (prompt, lora) in enumerate(zip(prompts, loras, strict=True)):
        engine.add_request(f"b{i}-{start}", prompt, params, lora=lora)
    tokens = 0
    while engine.has_unfinished():
        tokens += sum(len(o.new_token_ids) for o in engine.step())
    seconds = time.perf_counter() - start
    assert tokens == len(prompts) * max_tokens, (
        f"{tokens} tokens, not {len(prompts)} x {max_tokens}"
    )
    return tokens, seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="SmolLM2-135M-Instruct")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--adapters", type=int, default=8)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=96)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=1024)
    p.add_argument("--kv-memory", type=int, default=1 << 30, help="KV pool bytes")
    p.add_argument("--repeats", type=int, default=2, help="base/lora runs, alternating")
    p.add_argument("--skip-merged", action="store_true")
    args = p.parse_args()
    folder = resolve_model_path(args.model)
    config = ModelConfig.from_folder(folder)
    prompts = _requests(args, config.vocab_size)
    names = [f"adapter-{i}" for i in range(args.adapters)]
    report: dict = {"model": args.model, "cpu": platform.processor() or platform.machine(),
                    "torch_threads": torch.get_num_threads(), "adapters": args.adapters,
                    "requests": args.requests, "rank": args.rank,
                    "max_tokens": args.max_tokens}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="tide-bench-lora-") as tmp:
        paths = {n: write_random_adapter(Path(tmp) / n, config, args.rank, TARGETS, seed=i)
                 for i, n in enumerate(names)}  # fmt: skip
        engine = _engine(folder, args, max_loras=args.adapters)
        for n, path in paths.items():
            engine.register_adapter(n, str(path))
        plain = _engine(folder, args, max_loras=0)
        per_request = [names[i % len(names)] for i in range(len(prompts))]
        base_runs, lora_runs, plain_runs = [], [], []
        for _ in range(args.repeats):
            base_runs.append(_run(engine, prompts, [None] * len(prompts), args.max_tokens))
            lora_runs.append(_run(engine, prompts, per_request, args.max_tokens))
            plain_runs.append(_run(plain, prompts, [None] * len(prompts), args.max_tokens))
        del plain
        best = {k: max(t / s for t, s in runs) for k, runs in
                (("base", base_runs), ("lora", lora_runs), ("plain", plain_runs))}  # fmt: skip
        report["base_without_slots_tok_per_s"] = best["plain"]
        report["base_with_slots_over_without"] = best["base"] / best["plain"]
        report["dtype"] = str(engine.model.dtype).removeprefix("torch.")
        del engine
        report["base_tok_per_s"], report["lora_tok_per_s"] = best["base"], best["lora"]
        report["lora_over_base"] = best["lora"] / best["base"]
        if not args.skip_merged:
            gen_s = load_s = 0.0
            tokens = 0
            for n in names:
                mine = [prompts[i] for i, a in enumerate(per_request) if a == n]
                t0 = time.perf_counter()
                merged = merge_adapter(folder, paths[n], Path(tmp) / f"merged-{n}")
                one = _engine(merged, args, max_loras=0)
                load_s += time.perf_counter() - t0
                t, s = _run(one, mine, [None] * len(mine), args.max_tokens)
                tokens, gen_s = tokens + t, gen_s + s
                del one
                for f in merged.iterdir():
                    f.unlink()
            report["merged_tok_per_s"] = tokens / gen_s
            report["merged_with_loads_tok_per_s"] = tokens / (gen_s + load_s)
            report["merged_load_s"] = load_s
            report["lora_over_merged"] = best["lora"] / report["merged_tok_per_s"]
    for key, value in report.items():
        print(f"{key:>28}: {value:.3f}" if isinstance(value, float) else f"{key:>28}: {value}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
