"""gpu_check.py's engine-level sections: the whole loop (scheduling, input building, the
step, sampling, the host's read of the tokens) at a steady decode batch, with the
overlapped loop and the serial one side by side, and the GPU's busy share over it from a
device-only trace; and the bf16 matmul peak with prefill's share of it."""

from __future__ import annotations

import time
from typing import Any

import torch
from gpu_decode import device_time, sync

FULL = dict(batches=(1, 64, 256), warm=16, steps=64, prompt=128)
SMOKE = dict(batches=(1, 4), warm=2, steps=6, prompt=16)


def engine_loop(model, device: torch.device, smoke: bool) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Output tok/s per batch, overlapped and serial, and the overlapped loop's GPU busy
    share (kernel time over wall time in a CUDA-only profiler trace)."""
    plan = SMOKE if smoke else FULL
    out: dict[str, Any] = {"prompt_tokens": plan["prompt"], "timed_steps": plan["steps"]}
    out["overlap_equals_serial"] = _same_tokens(model, device, smoke)
    for batch in plan["batches"]:
        row: dict[str, Any] = {}
        for mode in ("on", "off"):
            row[f"overlap_{mode}"] = _steady(model, device, batch, plan, mode)
        on, off = row["overlap_on"], row["overlap_off"]
        row["overlap_speedup"] = round(on["output_tok_s"] / off["output_tok_s"], 3)
        out[f"b{batch}"] = row
    return out


def _steady(  # type: ignore[no-untyped-def]
    model, device: torch.device, batch: int, plan: dict[str, Any], mode: str
) -> dict[str, Any]:
    from tide_fleet.worker.engine import SamplingParams
    from tide_fleet.worker.engine.config import EngineConfig
    from tide_fleet.worker.engine.llm_engine import LLMEngine

    total = plan["prompt"] + plan["warm"] + 2 * plan["steps"] + 32
    graphs = "auto" if device.type == "cuda" else "eager"
    config = EngineConfig(
        max_num_seqs=batch, max_num_batched_tokens=max(2048, batch), cuda_graphs=graphs,
        num_kv_blocks=batch * (total // 16 + 2), overlap_schedule=mode,
        max_model_len=total + 16,
    )  # fmt: skip
    engine = LLMEngine(model, None, config)
    params = SamplingParams(max_tokens=total - plan["prompt"], temperature=0.0, ignore_eos=True)
    for i in range(batch):
        prompt = [(7 * i + j) % (model.config.vocab_size - 4) + 3 for j in range(plan["prompt"])]
        engine.add_request(f"r{i}", prompt, params)
    while engine.stats()["num_waiting"] or engine.counters["generation_tokens"] < batch:
        engine.step()  # prompts in, every row decoding
    for _ in range(plan["warm"]):
        engine.step()
    sync(device)
    before, start = engine.counters["generation_tokens"], time.perf_counter()
    for _ in range(plan["steps"]):
        engine.step()
    sync(device)
    wall = time.perf_counter() - start
    made = engine.counters["generation_tokens"] - before
    result = {"output_tok_s": round(made / wall, 1),
              "step_ms": round(wall / plan["steps"] * 1e3, 3)}  # fmt: skip
    if device.type == "cuda" and mode == "on":
        result.update(_busy(engine, device, plan["steps"]))
    for rid in list(engine.requests):
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    return result


def _same_tokens(model, device: torch.device, smoke: bool) -> bool:  # type: ignore[no-untyped-def]
    """The overlapped loop's outputs equal the serial loop's: greedy rows, seeded random
    rows and a row cut by top-p, over a shared prefix in a small pool (preemptions)."""
    from tide_fleet.worker.engine import SamplingParams
    from tide_fleet.worker.engine.config import EngineConfig
    from tide_fleet.worker.engine.llm_engine import LLMEngine

    vocab = model.config.vocab_size - 4
    prefix = [(11 * i) % vocab + 3 for i in range(32 if smoke else 200)]
    prompts = [prefix + [5 + i] * (3 + 2 * i) for i in range(6)]
    new = 8 if smoke else 48
    params = [
        SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=new, temperature=0.9, seed=11, ignore_eos=True),
        SamplingParams(max_tokens=new, temperature=0.7, top_p=0.8, seed=5, ignore_eos=True),
    ] * 2
    blocks = 6 * -(-(len(prompts[-1]) + new) // 16) // 2 + 2  # about half: preemptions
    graphs = "auto" if device.type == "cuda" else "eager"
    results = []
    for mode in ("off", "on"):
        config = EngineConfig(num_kv_blocks=blocks, overlap_schedule=mode, cuda_graphs=graphs,
                              max_num_batched_tokens=256)  # fmt: skip
        engine = LLMEngine(model, None, config)
        results.append([o.token_ids for o in engine.generate([list(p) for p in prompts], params)])
        del engine
    return results[0] == results[1]


def _busy(engine, device: torch.device, steps: int) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """The GPU's busy share of steady steps: the union of kernel intervals in a CUDA-only
    trace over the wall time (overlapping kernels counted once)."""
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        sync(device)
        wall = time.perf_counter() - start
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    )
    busy, end = 0, None
    for s, e in spans:
        if end is None or s > end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    first, last = (spans[0][0], max(e for _, e in spans)) if spans else (0, 0)
    return {
        "gpu_busy_of_wall": round(busy / 1e6 / wall, 3),
        "gpu_busy_of_trace_span": round(busy / max(last - first, 1), 3),
        "kernels_per_step": len(spans) // steps,
    }


def matmul_peak(device: torch.device, smoke: bool) -> float:
    """bf16 (float32 on CPU) matmul FLOP/s at a large square shape: the prefill goal's peak."""
    n = 256 if smoke else 8192
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    seconds = device_time(lambda: a @ b, device, 3 if smoke else 20)
    return 2 * n**3 / seconds


def prefill_share(model, decode: dict[str, Any], peak: float, n: int) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Prefill FLOP/s at n tokens (2 x parameters x tokens, plus attention's QK and PV over
    the causal half) against the matmul peak."""
    tok_s = decode.get(f"prefill_{n}_tok_s")
    if not isinstance(tok_s, (int, float)):
        return {"error": f"no prefill_{n}_tok_s in the decode section"}
    cfg = model.config
    attention = 2 * 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * (n / 2)  # per token
    flops = tok_s * (2 * cfg.num_parameters() + attention)
    return {"tokens": n, "tflop_s": round(flops / 1e12, 2), "peak_tflop_s": round(peak / 1e12, 2),
            "fraction_of_peak": round(flops / peak, 3)}  # fmt: skip
