"""How fast one simulated worker serves its batch: the decode roofline (infra/plan/roofline.py)
for the pool's model on its device (split over its ``gpus_per_worker`` GPUs), or a measured
curve from a service file (docs/simulator.md)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tide_fleet.infra.fleet.fleet_config import FleetConfig, PoolConfig
from tide_fleet.infra.plan.devices import get_device
from tide_fleet.infra.plan.planner import PlanError, load_shape, plan
from tide_fleet.infra.plan.roofline import DevicePeaks, ModelCost, allreduce_bytes
from tide_fleet.infra.sim.traces import Job

DEFAULT_MODEL = "llama-3-8b"  # a planner preset: what pools without `model` are taken to serve
EFFICIENCY = 0.6  # of the roofline, as the planner's estimate_pool_tokens_per_s takes it
DEFAULT_MAX_NUM_SEQS = 64  # the engine's default (worker/engine/config.py)


@dataclass(frozen=True)
class ServiceModel:
    """How fast one worker serves its batch. Each running job gains one token per step; a step
    takes max(step_s + the jobs' memory time, the jobs' compute time) + their prefill time
    (the planner's decode roofline, plus each prompt's prefill spread over its decode steps),
    so per-job speed falls as the batch grows while throughput rises and saturates."""

    max_num_seqs: int
    kv_tokens: int  # KV room: prompt + max_tokens of the running jobs must fit
    step_s: float  # reading the weights, whatever the batch
    mem_s_per_seq: float = 0.0  # per job per step (a measured curve's marginal cost)
    mem_s_per_ctx: float = 0.0  # per job per step per context token (its KV read)
    flop_s_per_seq: float = 0.0  # compute per job per step
    flop_s_per_ctx: float = 0.0  # attention compute per context token
    prefill_s_per_token: float = 0.0  # a prompt token's prefill ...
    prefill_s_per_token_sq: float = 0.0  # ... and its attention over the prompt
    allreduce_s_per_token: float = 0.0  # split over GPUs: each token's all-reduces (no overlap)
    source: str = "roofline"

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "kv_tokens", "step_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"service model: {name} must be > 0, got {getattr(self, name)}")

    def job_costs(self, job: Job) -> tuple[float, float, float]:
        """(memory, compute, prefill) seconds the job adds to each step while it runs; the
        all-reduces of its decode token and its prompt's share count with the prefill (they
        add to the step, whatever bounds it)."""
        ctx = job.prompt_tokens + job.output_tokens / 2
        p, comm = job.prompt_tokens, self.allreduce_s_per_token
        per_prompt_token = self.prefill_s_per_token + comm
        prefill = (per_prompt_token * p + self.prefill_s_per_token_sq * p * p) / job.output_tokens
        prefill += comm
        return (
            self.mem_s_per_seq + self.mem_s_per_ctx * ctx,
            self.flop_s_per_seq + self.flop_s_per_ctx * ctx,
            prefill,
        )

    def step_time(self, mem: float, flop: float, prefill: float) -> float:
        return max(self.step_s + mem, flop) + prefill

    def full_rate(self, jobs: list[Job]) -> float:
        """Work tokens/s of one worker kept full of jobs like these."""
        sums = [0.0] * 6
        for job in jobs:
            self.add_to(sums, job)
        return self.full_rate_of(sums)

    def add_to(self, sums: list[float], job: Job) -> None:
        """Accumulate [count, work, output, memory, compute, prefill] for full_rate_of."""
        mem, flop, pre = self.job_costs(job)
        sums[0] += 1
        sums[1] += job.work
        sums[2] += job.output_tokens
        sums[3] += mem
        sums[4] += flop
        sums[5] += pre

    def full_rate_of(self, sums: list[float]) -> float:
        n, work, out, mem, flop, pre = sums
        batch = max(1, min(self.max_num_seqs, int(self.kv_tokens * n // work)))
        step = self.step_time(batch * mem / n, batch * flop / n, batch * pre / n)
        return batch * work / (out * step)


def _flag(pool: PoolConfig, name: str) -> int | None:
    """An integer flag from the pool's worker_args (`--name N` or `--name=N`), if given."""
    args, value = pool.worker_args, None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"pools.{pool.name}.worker_args: {name} needs an integer >= 1")
    return int(value)


def roofline_model(pool: PoolConfig) -> ServiceModel:
    """The pool's model (a planner preset or config.json; llama-3-8b when it names none) on its
    device: the planner's KV budget and decode roofline at EFFICIENCY, bf16 weights and KV.
    A worker of N GPUs (gpus_per_worker) is one GPU's shard plus the all-reduces over the
    device's interconnect, as the planner splits it."""
    dev, n = get_device(pool.device), pool.gpus_per_worker
    try:
        shape = load_shape(pool.model or DEFAULT_MODEL)
        kv_tokens = plan(shape, device=dev, tensor_parallel_size=n).kv_budget_tokens
    except PlanError as e:
        raise ValueError(f"pools.{pool.name}: {e}; describe it with --service FILE") from None
    cost = ModelCost.from_shape(shape, "bfloat16", "bfloat16", n)
    kvpt = cost.kv_bytes_per_token
    kv_memory = _flag(pool, "--kv-cache-memory")
    if kv_memory is not None:
        kv_tokens = kv_memory // kvpt
    peaks = DevicePeaks.from_spec(dev, "bfloat16")
    bandwidth = peaks.bandwidth * EFFICIENCY
    flops = peaks.flops * EFFICIENCY
    attention = cost.attention_flops_per_position  # per context token
    dense = cost.flops_per_token(0)
    link = dev.interconnect_bandwidth * EFFICIENCY
    allreduce = allreduce_bytes(shape, 1, n) / link if n > 1 else 0.0
    return ServiceModel(
        max_num_seqs=_flag(pool, "--max-num-seqs") or DEFAULT_MAX_NUM_SEQS,
        kv_tokens=kv_tokens,
        step_s=cost.weight_bytes / bandwidth,
        mem_s_per_ctx=kvpt / bandwidth,
        flop_s_per_seq=dense / flops,
        flop_s_per_ctx=attention / flops,
        prefill_s_per_token=dense / flops,
        prefill_s_per_token_sq=attention / 2 / flops,  # mean context p/2 over the prompt
        allreduce_s_per_token=allreduce,
        source=f"planner roofline: {shape.name} on {f'{n} x ' if n > 1 else ''}{dev.name}",
    )


def _number(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
        raise ValueError(f"{where}: needs a number > 0, got {v!r}")
    return float(v)


def fit_service(spec: Any, pool: PoolConfig, where: str) -> ServiceModel:
    """A measured curve {"tokens_per_s": {batch: output tokens/s}} -> step time = step_s +
    batch x mem_s_per_seq (least squares on batch / tokens_per_s)."""
    known = {"tokens_per_s", "max_num_seqs", "kv_tokens", "prefill_tokens_per_s"}
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: needs an object with {sorted(known)}")
    unknown = set(spec) - known
    if unknown:
        raise ValueError(f"{where}: unknown fields {sorted(unknown)}; known: {sorted(known)}")
    curve = spec.get("tokens_per_s")
    if not isinstance(curve, dict) or len(curve) < 2:
        raise ValueError(f'{where}.tokens_per_s: needs {{"batch": tokens/s}} at >= 2 batch sizes')
    points = []
    for b, tps in curve.items():
        if not str(b).isdigit() or int(b) < 1:
            raise ValueError(f"{where}.tokens_per_s: batch sizes are integers >= 1, got {b!r}")
        points.append((int(b), int(b) / _number(tps, f"{where}.tokens_per_s.{b}")))
    n = len(points)
    mb, mt = sum(b for b, _ in points) / n, sum(t for _, t in points) / n
    slope = sum((b - mb) * (t - mt) for b, t in points) / sum((b - mb) ** 2 for b, _ in points)
    step = mt - slope * mb
    if step <= 0:
        raise ValueError(f"{where}.tokens_per_s: throughput grows too fast with batch to fit")
    if "kv_tokens" in spec:
        kv = int(_number(spec["kv_tokens"], f"{where}.kv_tokens"))
    else:
        kv = roofline_model(pool).kv_tokens
    seqs = spec.get("max_num_seqs", _flag(pool, "--max-num-seqs") or DEFAULT_MAX_NUM_SEQS)
    prefill = spec.get("prefill_tokens_per_s")
    return ServiceModel(
        max_num_seqs=int(_number(seqs, f"{where}.max_num_seqs")),
        kv_tokens=kv,
        step_s=step,
        mem_s_per_seq=max(slope, 0.0),
        prefill_s_per_token=1 / _number(prefill, f"{where}.prefill_tokens_per_s") if prefill else 0,
        source=f"measured curve ({n} points)",
    )


def service_models(fleet: FleetConfig, path: str | Path | None = None) -> dict[str, ServiceModel]:
    """Per pool: the measured curve in the service file if it names the pool, else the roofline."""
    specs: Any = {}
    if path is not None:
        try:
            data = json.loads(Path(path).read_text())
        except OSError as e:
            raise ValueError(f"service file {path}: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"service file {path}: not valid JSON ({e.msg})") from None
        specs = data.get("pools") if isinstance(data, dict) else None
        if not isinstance(specs, dict):
            raise ValueError(f'service file {path}: needs {{"pools": {{"<pool>": {{...}}}}}}')
        for name in specs:
            if name not in fleet.pools:
                raise ValueError(f"service file {path}: pools.{name} is not in the fleet")
    return {
        name: fit_service(specs[name], pool, f"{path}: pools.{name}")
        if name in specs
        else roofline_model(pool)
        for name, pool in fleet.pools.items()
    }
