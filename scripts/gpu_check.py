#!/usr/bin/env python3
"""What the engine does on a real GPU today (issue 15, "Measured, not assumed"): one command,
one JSON line on stdout, a few minutes on an H200.

    python scripts/gpu_check.py            # random-weight Llama-3-8B and Qwen2.5-7B shapes, bf16
    python scripts/gpu_check.py --smoke    # a tiny shape, any device (CI runs it on CPU)

No network and no service dependencies: the models are built in code, directly on the
device, from torch, triton and numpy (what the engine imports besides is listed under
"imports_outside_allowed"). Each section records its numbers or its error; a failing
section never hides the others. Without CUDA and without --smoke it prints
{"error": "no CUDA device", ...} and exits 0.

Recorded per model: start-up with default settings (error, or seconds and KV blocks);
greedy tokens with the Triton and the torch backends over prompts that hit the prefix
cache and, in a small pool, get preempted; decode step time at batch 1/16/64 and context
512/4096 (first step and steady median, host launch time, compiled variants added);
prefill tokens/s at 1k and 8k; sampler cost at temperature 0 and 1; decode-attention
bandwidth against a measured device copy. Not measured, because the engine has none yet:
CUDA graphs (graph vs eager) and a profiler split of one step.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

ALLOWED = {"torch", "triton", "safetensors", "tokenizers", "numpy", "xxhash"}
SHAPES: dict[str, dict[str, Any]] = {
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                      max_position_embeddings=8192, rope_theta=500000.0),
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128,
                       max_position_embeddings=32768, rope_theta=1000000.0, qkv_bias=True),
    "tiny": dict(vocab_size=260, hidden_size=64, intermediate_size=128, num_layers=2,
                 num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=2048),
}  # fmt: skip
FULL = dict(batches=(1, 16, 64), contexts=(512, 4096), prefills=(1024, 8192), reps=10)
SMOKE = dict(batches=(1, 4), contexts=(32, 80), prefills=(64, 128), reps=2)


def build_random_model(shape: dict[str, Any], device: torch.device, dtype: torch.dtype):  # type: ignore[no-untyped-def]
    """A LlamaModel of this shape with N(0, 0.02) weights made on the device (empty on meta)."""
    from kernels.linear import Linear
    from worker.models.config import ModelConfig
    from worker.models.llama import LayerWeights, LlamaModel

    cfg = ModelConfig(architecture="LlamaForCausalLM", eos_token_ids=[2], **shape)
    gen = None if device.type == "meta" else torch.Generator(device=device).manual_seed(0)

    def mat(*size: int) -> torch.Tensor:
        if gen is None:
            return torch.empty(size, dtype=dtype, device=device)
        return torch.randn(size, generator=gen, dtype=dtype, device=device).mul_(0.02)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=dtype, device=device)

    d, hd, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd
    layers = [
        LayerWeights(
            input_norm=ones(d),
            qkv=Linear(mat(q + 2 * kv, d), mat(q + 2 * kv) if cfg.qkv_bias else None),
            o=Linear(mat(d, q)),
            post_norm=ones(d),
            gate_up=Linear(mat(2 * inter, d)),
            down=Linear(mat(d, inter)),
        )
        for _ in range(cfg.num_layers)
    ]
    return LlamaModel(cfg, mat(cfg.vocab_size, d), layers, ones(d), Linear(mat(cfg.vocab_size, d)))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device) -> float:  # type: ignore[no-untyped-def]
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _section(out: dict[str, Any], name: str, fn) -> None:  # type: ignore[no-untyped-def]
    try:
        out[name] = fn()
    except Exception as e:  # a section's failure is a finding, not the end of the run
        out[name] = {"error": f"{type(e).__name__}: {e}"[:600]}


def startup(model, device: torch.device) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    from worker.engine.config import EngineConfig
    from worker.engine.llm_engine import LLMEngine

    start = time.perf_counter()
    engine = LLMEngine(model, None, EngineConfig())
    _sync(device)
    runner = engine.runner
    return {
        "seconds": round(time.perf_counter() - start, 2),
        "kv_blocks": runner.num_blocks,
        "kv_gib": round(runner.num_blocks * runner.block_bytes / 2**30, 2),
        "block_size": runner.block_size,
    }


def greedy_match(model, smoke: bool) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """The same greedy workload on both backends: a shared prefix (hits), a small pool
    (preemptions)."""
    from kernels import set_attention_backend
    from worker.engine import SamplingParams
    from worker.engine.config import EngineConfig
    from worker.engine.llm_engine import LLMEngine

    prefix = [(7 * i) % 200 + 3 for i in range(48 if smoke else 256)]
    prompts = [prefix + [5 + i] * (4 + i) for i in range(4)]
    params = SamplingParams(max_tokens=12 if smoke else 32, temperature=0.0, ignore_eos=True)
    per_seq = -(-(len(prompts[-1]) + params.max_tokens) // 16)
    result: dict[str, Any] = {}
    for backend in ("triton", "torch"):
        config = EngineConfig(num_kv_blocks=per_seq + 1, attention_backend=backend,
                              max_num_batched_tokens=64 if smoke else 512)  # fmt: skip
        engine = LLMEngine(model, None, config)
        try:
            outs = engine.generate([list(p) for p in prompts], params)
        finally:
            set_attention_backend("auto")
        stats = engine.stats()
        result[backend] = {
            "tokens": [o.token_ids for o in outs],
            "prefix_hits": stats["prefix_cache_hits"],
            "preemptions": stats["num_preemptions"],
        }
        del engine
    a, b = result["triton"]["tokens"], result["torch"]["tokens"]
    diverge = [next((j for j, (x, y) in enumerate(zip(s, t, strict=True)) if x != y), None)
               for s, t in zip(a, b, strict=True)]  # fmt: skip
    return {
        "equal": a == b,
        "first_divergence": diverge,
        **{k: {f: v[f] for f in ("prefix_hits", "preemptions")} for k, v in result.items()},
    }


def compiled_variants() -> int | None:
    """Compiled Triton decode-kernel variants so far (None under the interpreter)."""
    from kernels import triton_attention as tk

    total = 0
    for fn in (tk._decode_kernel, tk._reduce_kernel):
        caches = getattr(fn, "device_caches", None)
        if caches is None:
            return None
        total += sum(len(c[0]) for c in caches.values())
    return total


def decode_steps(model, device: torch.device, plan: dict[str, Any]) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    from worker.engine.config import EngineConfig
    from worker.engine.model_runner import ModelRunner
    from worker.engine.scheduler import ScheduledRequest, SchedulerOutput

    bs, max_b, max_c = 16, max(plan["batches"]), max(plan["contexts"])
    config = EngineConfig(num_kv_blocks=max_b * (max_c // bs + 1), max_num_seqs=max_b)
    runner = ModelRunner(model, config, model.config.max_model_len)
    out: dict[str, Any] = {"variants_after_warmup": compiled_variants()}
    for batch in plan["batches"]:
        for context in plan["contexts"]:
            width = -(-context // bs)
            sched = SchedulerOutput([
                ScheduledRequest(f"r{i}", [1], context - 1, list(range(i * width, (i + 1) * width)),
                                 True) for i in range(batch)
            ])  # fmt: skip
            first = _timed(lambda s=sched: runner.execute(s), device)
            times, hosts = [], []
            for _ in range(plan["reps"]):
                _sync(device)
                t0 = time.perf_counter()
                runner.execute(sched)
                hosts.append(time.perf_counter() - t0)
                _sync(device)
                times.append(time.perf_counter() - t0)
            out[f"b{batch}_c{context}"] = {
                "first_ms": round(first * 1e3, 3),
                "steady_ms": round(statistics.median(times) * 1e3, 3),
                "host_ms": round(statistics.median(hosts) * 1e3, 3),
            }
    out["variants_after_serving"] = compiled_variants()
    for n in plan["prefills"]:
        sched = SchedulerOutput([ScheduledRequest("p", [1] * n, 0, list(range(-(-n // bs))), True)])
        runner.execute(sched)  # compile
        seconds = min(_timed(lambda s=sched: runner.execute(s), device) for _ in range(2))
        out[f"prefill_{n}_tok_s"] = round(n / seconds)
    return out


def sampler_cost(vocab: int, device: torch.device, reps: int) -> dict[str, Any]:
    from worker.engine.request import Request
    from worker.engine.sampler import Sampler
    from worker.engine.sampling_params import SamplingParams

    sampler, out = Sampler(device, seed=0), {}
    logits = torch.randn(64, vocab, device=device)
    for t in (0.0, 1.0):
        reqs = [Request(f"r{i}", [1], SamplingParams(temperature=t)) for i in range(64)]
        sampler.sample(logits.clone(), reqs)
        times = [_timed(lambda r=reqs: sampler.sample(logits.clone(), r), device)
                 for _ in range(reps)]  # fmt: skip
        out[f"b64_t{t:g}_ms"] = round(statistics.median(times) * 1e3, 3)
    return out


def attention_bandwidth(device: torch.device, smoke: bool) -> dict[str, Any]:
    from kernels import triton_attention as tk

    n, context, kvh, heads, hd, bs = (4, 256, 2, 8, 16, 16) if smoke else (64, 4096, 8, 32, 128, 16)
    width = context // bs
    k = torch.randn(kvh, n * width, bs, hd, dtype=torch.bfloat16, device=device)
    v = torch.randn_like(k)
    tables = torch.arange(n * width, device=device).view(n, width)
    lens = torch.full((n,), context, dtype=torch.int32, device=device)
    q = torch.randn(n, heads, hd, dtype=torch.bfloat16, device=device)
    call = lambda: tk.decode_attention(q, k, v, tables, lens, hd**-0.5, context)  # noqa: E731
    call()
    seconds = min(_timed(call, device) for _ in range(3 if smoke else 20))
    src = torch.empty((1 << 24) if smoke else (1 << 30), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    copy = min(_timed(lambda: dst.copy_(src), device) for _ in range(3 if smoke else 10))
    kv_bytes = 2 * n * context * kvh * hd * 2
    achieved, peak = kv_bytes / seconds, 2 * src.numel() / copy
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


def run(smoke: bool) -> dict[str, Any]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    plan = SMOKE if smoke else FULL
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report: dict[str, Any] = {"device": name, "torch": torch.__version__, "smoke": smoke}
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    for shape in ("tiny",) if smoke else ("llama3-8b", "qwen2.5-7b"):
        entry: dict[str, Any] = {}
        start = time.perf_counter()
        model = build_random_model(SHAPES[shape], device, dtype)
        _sync(device)
        entry["build_seconds"] = round(time.perf_counter() - start, 2)
        _section(entry, "startup_defaults", lambda m=model: startup(m, device))
        if device.type == "cuda":
            torch.cuda.empty_cache()
        _section(entry, "greedy_triton_vs_torch", lambda m=model: greedy_match(m, smoke))
        _section(entry, "decode", lambda m=model: decode_steps(m, device, plan))
        _section(entry, "sampler", lambda m=model: sampler_cost(m.config.vocab_size, device,
                                                                plan["reps"]))  # fmt: skip
        report[shape] = entry
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    _section(report, "decode_attention_bandwidth", lambda: attention_bandwidth(device, smoke))
    report["not_measured"] = ["cuda graphs (none yet)", "profiler host/device split"]
    report["imports_outside_allowed"] = imports_outside_allowed()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny model on any device")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        if not args.smoke:
            print(json.dumps({"error": "no CUDA device", "torch": torch.__version__}))
            return 0
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels load
    start = time.perf_counter()
    report = run(args.smoke)
    report["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
