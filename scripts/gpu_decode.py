"""The timing pieces of scripts/gpu_check.py: device sync and timing, decode steps with
and without CUDA graphs, a profiler split of a step, compiled-variant counts, the device's
copy bandwidth. Imports torch and the engine only (gpu_check runs without Tide's service
dependencies)."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:  # type: ignore[no-untyped-def]
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def device_time(fn, device: torch.device, iters: int) -> float:  # type: ignore[no-untyped-def]
    """Seconds per call of back-to-back calls: CUDA events on a GPU (a kernel's own rate, its
    launches overlapped as in a captured step), the best of single wall-clock calls on CPU."""
    fn()
    if device.type != "cuda":
        return min(timed(fn, device) for _ in range(iters))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters / 1e3


def section(out: dict[str, Any], name: str, fn) -> None:  # type: ignore[no-untyped-def]
    try:
        out[name] = fn()
    except Exception as e:  # a section's failure is a finding, not the end of the run
        out[name] = {"error": f"{type(e).__name__}: {e}"[:600]}


def compiled_variants() -> int | None:
    """Compiled Triton decode-kernel variants so far (None under the interpreter)."""
    from tide_fleet.kernels import triton_decode as tk
    from tide_fleet.kernels import triton_prefill as tp

    total = 0
    for fn in (tk._decode_kernel, tk._reduce_kernel, tp._varlen_prefill_kernel):
        caches = getattr(fn, "device_caches", None)
        if caches is None:
            return None
        total += sum(len(c[0]) for c in caches.values())
    return total


def _decode_sched(batch: int, context: int, bs: int):  # type: ignore[no-untyped-def]
    from tide_fleet.worker.engine.scheduler import ScheduledRequest, SchedulerOutput

    width = -(-context // bs)
    return SchedulerOutput([
        ScheduledRequest(f"r{i}", [1], context - 1, list(range(i * width, (i + 1) * width)), True)
        for i in range(batch)
    ])  # fmt: skip


def _step_times(runner, sched, device: torch.device, reps: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    first = timed(lambda: runner.execute(sched), device)
    times, hosts = [], []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        runner.execute(sched)
        hosts.append(time.perf_counter() - t0)
        sync(device)
        times.append(time.perf_counter() - t0)
    return {
        "first_ms": round(first * 1e3, 3),
        "steady_ms": round(statistics.median(times) * 1e3, 3),
        "host_ms": round(statistics.median(hosts) * 1e3, 3),
    }


def device_busy(runner, sched, device: torch.device) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """A profiler split of steady decode steps: device kernel time against wall time."""
    from torch.profiler import ProfilerActivity, profile

    runner.execute(sched)
    sync(device)
    steps = 5
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            runner.execute(sched)
            sync(device)
        wall = time.perf_counter() - start
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e6
    return {"step_ms": round(wall / steps * 1e3, 3),
            "device_busy_ms": round(busy / steps * 1e3, 3),
            "gpu_idle_fraction": round(max(0.0, 1 - busy / wall), 3),
            "kernels_per_step": len(kernels) // steps}  # fmt: skip


def _prefill_tok_s(runner, n: int, bs: int, device: torch.device) -> int:  # type: ignore[no-untyped-def]
    from tide_fleet.worker.engine.scheduler import ScheduledRequest, SchedulerOutput

    blocks = list(range(-(-n // bs)))
    sched = SchedulerOutput([ScheduledRequest("p", [1] * n, 0, blocks, True)])
    runner.execute(sched)  # compile
    seconds = min(timed(lambda: runner.execute(sched), device) for _ in range(2))
    return round(n / seconds)


def decode_steps(model, device: torch.device, plan: dict[str, Any], copy_gb_s: float | None):  # type: ignore[no-untyped-def]
    """Decode steps with CUDA graphs (eager padded steps on CPU) and without, one runner at
    a time (each holds its own KV pool); prefill tokens/s on the first."""
    from tide_fleet.worker.engine.config import EngineConfig
    from tide_fleet.worker.engine.kv_budget import model_weight_bytes
    from tide_fleet.worker.engine.model_runner import ModelRunner

    bs, max_b, max_c = 16, max(plan["batches"]), max(plan["contexts"])
    graphs = "auto" if device.type == "cuda" else "eager"
    out: dict[str, Any] = {"variants_at_start": compiled_variants()}
    for label, mode in (("graphs", graphs), ("eager", "off")):
        # The step budget holds the longest prefill measured below in one chunk.
        config = EngineConfig(num_kv_blocks=max_b * (max_c // bs + 1), max_num_seqs=max_b,
                              max_num_batched_tokens=max(plan["prefills"]),
                              cuda_graphs=mode)  # fmt: skip
        runner = ModelRunner(model, config, model.config.max_model_len)
        out[f"{label}_mode"] = runner.graph_mode
        out[f"variants_after_{label}_warmup"] = compiled_variants()
        for batch in plan["batches"]:
            for context in plan["contexts"]:
                sched = _decode_sched(batch, context, bs)
                timing = lambda r=runner, s=sched: _step_times(r, s, device, plan["reps"])  # noqa: E731
                section(out, f"{label}_b{batch}_c{context}", timing)
        out[f"variants_after_{label}_serving"] = compiled_variants()
        if device.type == "cuda":
            sched = _decode_sched(max_b, min(plan["contexts"]), bs)
            section(out, f"{label}_profile_b{max_b}",
                     lambda r=runner, s=sched: device_busy(r, s, device))  # fmt: skip
        if label == "graphs":
            for n in plan["prefills"]:
                section(out, f"prefill_{n}_tok_s",
                        lambda r=runner, n=n: _prefill_tok_s(r, n, bs, device))  # fmt: skip
        del runner
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if copy_gb_s:
        read_ms = model_weight_bytes(model) / (copy_gb_s * 1e9) * 1e3
        c = min(plan["contexts"])
        out["weight_read_ms"] = round(read_ms, 3)
        for label in ("graphs", "eager"):
            out[f"{label}_b1_c{c}_over_weight_read"] = round(
                out[f"{label}_b1_c{c}"]["steady_ms"] / read_ms, 2
            )
    return out


def copy_bandwidth(device: torch.device, smoke: bool) -> float:
    """GB/s of a device-to-device copy (reads plus writes), the bandwidth the goals use."""
    src = torch.empty((1 << 24) if smoke else (1 << 30), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = device_time(lambda: dst.copy_(src), device, 3 if smoke else 20)
    return 2 * src.numel() / seconds / 1e9
