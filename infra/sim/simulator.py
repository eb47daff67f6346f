"""Discrete-event simulator of a Tide fleet: traces of jobs, pools of continuous-batching
workers with cold starts, and scaling policies, so a policy is judged on GPU-hours and
queue wait before it runs for real (`tide simulate`, docs/simulator.md).

Tide's policy here *is* `infra.fleet.autoscale.decide`, fed the observation
infra/fleet/controller.py
builds (backlog tokens = prompt + max tokens of queued work per home bucket, the oldest job's
age, the smoothed arrival rate, the per-worker rate it learns from heartbeats). The
baselines are a KEDA-style list-length target and static provisioning at peak.

The model, in short (docs/simulator.md has it all):
- a worker holds up to max_num_seqs jobs and KV room for their prompt + max_tokens; every
  running job gains one output token per step; a step takes the planner's decode roofline
  over the running jobs plus their prefill spread over their decode steps, so per-job speed
  falls while worker throughput rises and saturates with the batch;
- a worker takes the head of the first non-empty bucket in its pool's preference order, one
  job per free slot (FCFS within a bucket); a head it cannot fit waits for room;
- workers are ready cold_start_s after launch, billed from launch until removed; scale-in
  drains (no new jobs; removed when the last one finishes).
Event order at one instant: completions and ready workers, then arrivals, then the policy.
"""

from __future__ import annotations

import heapq
import json
import math
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from infra.fleet.autoscale import PoolObservation, PoolState, RateTracker, WorkerView, decide
from infra.fleet.fleet_config import FleetConfig, PoolConfig
from infra.plan.devices import get_device
from infra.wire.protocol import BUCKETS, bucket_for

_FINISH, _READY = 0, 1

# ==== jobs and the service model ===========================================================


class Job:
    __slots__ = ("arrival", "bucket", "idx", "max_tokens", "output_tokens", "prompt_tokens", "work")

    def __init__(
        self, idx: int, arrival: float, prompt_tokens: int, max_tokens: int,
        output_tokens: int, bucket: str,
    ) -> None:  # fmt: skip
        self.idx, self.arrival, self.bucket = idx, arrival, bucket
        self.prompt_tokens, self.max_tokens = prompt_tokens, max_tokens
        self.output_tokens = output_tokens  # what it really generates (<= max_tokens)
        self.work = prompt_tokens + max_tokens  # what the queues count as backlog


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
    source: str = "roofline"

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "kv_tokens", "step_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"service model: {name} must be > 0, got {getattr(self, name)}")

    def job_costs(self, job: Job) -> tuple[float, float, float]:
        """(memory, compute, prefill) seconds the job adds to each step while it runs."""
        ctx = job.prompt_tokens + job.output_tokens / 2
        p = job.prompt_tokens
        prefill = (self.prefill_s_per_token * p + self.prefill_s_per_token_sq * p * p) / (
            job.output_tokens
        )
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
    device: the planner's KV budget and decode roofline at EFFICIENCY, bf16 weights and KV."""
    from infra.plan.planner import PlanError, load_shape, peak_flops, plan

    dev = get_device(pool.device)
    try:
        shape = load_shape(pool.model or DEFAULT_MODEL)
        kv_tokens = plan(shape, device=dev).kv_budget_tokens
    except PlanError as e:
        raise ValueError(f"pools.{pool.name}: {e}; describe it with --service FILE") from None
    kvpt = shape.kv_bytes_per_token("bfloat16")
    kv_memory = _flag(pool, "--kv-cache-memory")
    if kv_memory is not None:
        kv_tokens = kv_memory // kvpt
    bandwidth = dev.mem_bandwidth * EFFICIENCY
    flops = peak_flops(dev, "bfloat16") * EFFICIENCY
    attention = shape.flops_per_token(1) - shape.flops_per_token(0)  # per context token
    dense = shape.flops_per_token(0)
    return ServiceModel(
        max_num_seqs=_flag(pool, "--max-num-seqs") or DEFAULT_MAX_NUM_SEQS,
        kv_tokens=kv_tokens,
        step_s=shape.streamed_parameters() * 2 / bandwidth,
        mem_s_per_ctx=kvpt / bandwidth,
        flop_s_per_seq=dense / flops,
        flop_s_per_ctx=attention / flops,
        prefill_s_per_token=dense / flops,
        prefill_s_per_token_sq=attention / 2 / flops,  # mean context p/2 over the prompt
        source=f"planner roofline: {shape.name} on {dev.name}",
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


# ==== traces ================================================================================

TRACES = ("diurnal", "mixed")
TRACE_FIELDS = {"arrival_s", "prompt_tokens", "max_tokens", "output_tokens", "id"}


def _thresholds() -> tuple[int, int]:
    from infra.settings import get_settings

    s = get_settings()
    return s.bucket_short_max, s.bucket_medium_max


def make_jobs(rows: list[tuple[float, int, int, int]]) -> list[Job]:
    """(arrival, prompt, max_tokens, output) rows -> jobs in arrival order, bucketed."""
    short_max, medium_max = _thresholds()
    rows = sorted(rows, key=lambda r: r[0])
    return [
        Job(i, t, p, m, o, bucket_for(p + m, short_max, medium_max))
        for i, (t, p, m, o) in enumerate(rows)
    ]


def builtin_trace(name: str, seed: int, hours: float | None = None) -> tuple[list[Job], float]:
    """A seeded built-in trace and its length in seconds (docs/simulator.md describes both)."""
    import numpy as np

    if name not in TRACES:
        raise ValueError(f"unknown trace {name!r}; built in: {', '.join(TRACES)} (or FILE.jsonl)")
    hours = hours if hours is not None else (24.0 if name == "diurnal" else 6.0)
    if not hours > 0:
        raise ValueError(f"--hours must be > 0, got {hours}")
    rng = np.random.default_rng(seed)
    span = hours * 3600.0
    if name == "diurnal":
        trough, peak = DIURNAL_TROUGH_PER_S, DIURNAL_PEAK_PER_S

        def rate(t: Any) -> Any:
            s = (1 - np.cos(2 * np.pi * (t - 4 * 3600) / 86400)) / 2  # trough at 04:00
            return trough + (peak - trough) * s**2

        bursts = [(float(rng.uniform(8, 20) * 3600 + 86400 * d), float(rng.uniform(300, 600)))
                  for d in range(math.ceil(hours / 24)) for _ in range(DIURNAL_BURSTS)]  # fmt: skip
    else:
        base = MIXED_RATE_PER_S

        def rate(t: Any) -> Any:  # a half-hour ramp, then a slow swell
            ramp = np.minimum(1.0, 0.1 + 0.9 * t / 1800)
            return base * ramp * (1 + 0.3 * np.sin(2 * np.pi * t / (3 * 3600)))

        bursts = [(float(rng.uniform(0.1, 0.9) * span), float(rng.uniform(300, 600)))
                  for _ in range(MIXED_BURSTS)]  # fmt: skip
    bound = float(np.max(rate(np.linspace(0, span, 4096)))) * BURST_FACTOR * 1.01
    times = np.sort(rng.uniform(0, span, rng.poisson(bound * span)))
    lam = rate(times)
    for start, length in bursts:
        lam = np.where((times >= start) & (times < start + length), lam * BURST_FACTOR, lam)
    times = times[rng.uniform(0, bound, len(times)) < lam]
    n = len(times)
    if name == "diurnal":
        prompt = _lognormal(rng, n, 500, 0.9, 8, 60000)
        out = _lognormal(rng, n, 400, 0.6, 16, 2048)
    else:
        is_long = rng.uniform(size=n) < MIXED_LONG_FRACTION
        prompt = np.where(
            is_long,
            _lognormal(rng, n, 24000, 0.4, 9000, 100000),
            _lognormal(rng, n, 400, 0.8, 8, 1500),
        )
        out = np.where(
            is_long, _lognormal(rng, n, 800, 0.4, 200, 2000), _lognormal(rng, n, 200, 0.5, 16, 540)
        )
    rows = [(float(t), int(p), int(o), int(o)) for t, p, o in zip(times, prompt, out, strict=True)]
    return make_jobs(rows), span


def _lognormal(rng: Any, n: int, median: float, sigma: float, low: int, high: int) -> Any:
    import numpy as np

    return np.clip(np.round(median * np.exp(sigma * rng.standard_normal(n))), low, high)


def load_trace(path: str | Path, hours: float | None = None) -> tuple[list[Job], float]:
    """A JSONL trace: one job a line, {"arrival_s", "prompt_tokens", "max_tokens",
    "output_tokens"?, "id"?}; output_tokens defaults to max_tokens. Errors name line and field."""
    from infra.jsonl import iter_objects

    p = Path(path)
    rows = []
    for n, item in iter_objects(p, TRACE_FIELDS):
        t = item.get("arrival_s")
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t < math.inf:
            raise ValueError(f"{p}:{n}: field arrival_s must be a number >= 0, got {t!r}")
        ints = {}
        for key in ("prompt_tokens", "max_tokens", "output_tokens"):
            v = item.get(key, item.get("max_tokens") if key == "output_tokens" else None)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{p}:{n}: field {key} must be an integer >= 1, got {v!r}")
            ints[key] = v
        if ints["output_tokens"] > ints["max_tokens"]:
            raise ValueError(
                f"{p}:{n}: field output_tokens ({ints['output_tokens']}) exceeds max_tokens "
                f"({ints['max_tokens']})"
            )
        if hours is None or t <= hours * 3600:
            rows.append(
                (float(t), ints["prompt_tokens"], ints["max_tokens"], ints["output_tokens"])
            )
    if not rows:
        raise ValueError(f"trace {p}: no jobs" + (f" in the first {hours:g} h" if hours else ""))
    jobs = make_jobs(rows)
    return jobs, hours * 3600 if hours is not None else jobs[-1].arrival


# Built-in trace rates, sized for fleet.example.toml (docs/simulator.md).
DIURNAL_TROUGH_PER_S = 0.35
DIURNAL_PEAK_PER_S = 3.5
DIURNAL_BURSTS = 3
MIXED_RATE_PER_S = 0.6
MIXED_LONG_FRACTION = 0.2
MIXED_BURSTS = 2
BURST_FACTOR = 1.5


class SimWorker:
    """One worker: processor sharing over its running jobs, tracked in virtual time (output
    tokens per job so far), so a batch change costs one heap push, not a pass over jobs."""

    __slots__ = (
        "buckets", "flop", "heap", "idle_since", "kv_used", "launched", "mem", "model",
        "pool", "prefill", "ready_at", "removed", "served", "state", "t_last",
        "version", "vt", "wid",
    )  # fmt: skip

    def __init__(self, wid: str, pool: PoolConfig, model: ServiceModel, now: float, cold: float):
        self.wid, self.pool, self.model, self.buckets = wid, pool.name, model, pool.buckets
        self.launched, self.ready_at, self.removed = now, now + cold, math.inf
        self.state = "starting" if cold > 0 else "ready"
        self.heap: list[tuple[float, int, Job, tuple[float, float, float]]] = []
        self.mem = self.flop = self.prefill = 0.0  # sums of the running jobs' costs
        self.kv_used = 0
        self.served = 0  # prompt + max tokens of jobs finished, as its heartbeat reports
        self.vt = 0.0
        self.t_last = now
        self.version = 0
        self.idle_since: float | None = None if cold > 0 else now

    @property
    def running(self) -> int:
        return len(self.heap)

    def can_take(self, job: Job) -> bool:
        m = self.model
        return len(self.heap) < m.max_num_seqs and self.kv_used + job.work <= m.kv_tokens

    def step_time(self) -> float:
        return self.model.step_time(self.mem, self.flop, self.prefill)

    def advance(self, now: float) -> None:
        if self.heap:
            self.vt += (now - self.t_last) / self.step_time()
        self.t_last = now


class Policy(Protocol):
    name: str
    interval_s: float | None  # None: never polled

    def start(self, sim: Simulation) -> None: ...
    def tick(self, sim: Simulation, now: float) -> None: ...


@dataclass(frozen=True)
class SimConfig:
    # Tide's rate per worker: "controller" learns it from heartbeats as infra/fleet/controller.py
    # does; "model" gives it the service model's rate of a full worker on the home jobs so far.
    tide_rate: str = "controller"
    max_extra_s: float = 7 * 86400.0  # give up if work is still unserved this long after

    def __post_init__(self) -> None:
        if self.tide_rate not in ("controller", "model"):
            raise ValueError(f"tide_rate must be controller or model, got {self.tide_rate!r}")


@dataclass
class PolicyResult:
    policy: str
    gpu_hours: float
    p50_wait_s: float
    p99_wait_s: float
    p99_wait_short_s: float
    slo_attainment: float  # jobs with wait <= their home pool's target_wait_s
    peak_workers: int
    p99_wait_by_pool: dict[str, float]
    slo_met: bool  # every pool's home jobs: p99 wait <= its target_wait_s
    end_s: float
    timeline: list[tuple[float, int]] = field(repr=False)  # (time, billed workers) per change
    waits: list[tuple[float, float]] = field(repr=False)  # (arrival, wait) per job
    note: str = ""

    def summary(self) -> dict[str, float | int]:
        """The figures `tide simulate --json` prints per policy."""
        return {
            "gpu_hours": round(self.gpu_hours, 3),
            "p50_wait_s": round(self.p50_wait_s, 3),
            "p99_wait_s": round(self.p99_wait_s, 3),
            "p99_wait_short_s": round(self.p99_wait_short_s, 3),
            "slo_attainment": round(self.slo_attainment, 5),
            "peak_workers": self.peak_workers,
        }


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q of the values at or below it."""
    if not values:
        return 0.0
    xs = sorted(values)
    return xs[max(1, math.ceil(q * len(xs) - 1e-9)) - 1]


class Simulation:
    """One run of one policy over one trace. Policies read backlog, live, served_rate and
    model_rate, and act through launch and drain."""

    def __init__(
        self,
        fleet: FleetConfig,
        jobs: list[Job],
        models: dict[str, ServiceModel],
        duration_s: float,
        config: SimConfig | None = None,
    ):
        self.fleet, self.models, self.cfg = fleet, models, config or SimConfig()
        self.jobs = sorted(jobs, key=lambda j: j.arrival)
        self.duration = max(duration_s, self.jobs[-1].arrival if self.jobs else 0.0)
        self.home = {b: fleet.home_pool(b).name for b in BUCKETS}
        self.servers = {  # pools serving each bucket, most preferring first
            b: sorted((p for p in fleet.pools.values() if b in p.buckets),
                      key=lambda p: p.buckets.index(b))
            for b in BUCKETS
        }  # fmt: skip
        self.queues: dict[str, deque[Job]] = {b: deque() for b in BUCKETS}
        self.queued_tokens = dict.fromkeys(BUCKETS, 0)
        self.pool_workers: dict[str, list[SimWorker]] = {p: [] for p in fleet.pools}
        self.all_workers: list[SimWorker] = []
        self.events: list[tuple[float, int, int, SimWorker, int]] = []
        self.seq = 0
        self.start: dict[int, float] = {}  # job idx -> when a worker took it
        self.unfinished = 0
        self.last_finish = 0.0
        self.timeline: list[tuple[float, int]] = [(0.0, 0)]
        self.arrived_tokens = dict.fromkeys(BUCKETS, 0)  # monotonic, as infra/wire/backlog.py
        self.arrived_sums = {p: [0.0] * 6 for p in fleet.pools}  # per home pool: full_rate_of
        self._check_fits()

    def _check_fits(self) -> None:
        for n, job in enumerate(self.jobs, 1):
            room = max(self.models[p.name].kv_tokens for p in self.servers[job.bucket])
            if job.work > room:
                raise ValueError(
                    f"job {n} (arrival {job.arrival:g}s): prompt + max_tokens = {job.work} "
                    f"exceeds the KV room of every pool serving {job.bucket} (at most {room})"
                )

    # -- what policies see and do ----------------------------------------------------------

    def backlog(self, pool: str, now: float) -> tuple[int, int, float]:
        """Queued jobs, their prompt + max tokens, and the oldest one's age, over home buckets."""
        jobs = tokens = 0
        oldest = 0.0
        for b in self.fleet.home_buckets(pool):
            q = self.queues[b]
            if q:
                jobs += len(q)
                tokens += self.queued_tokens[b]
                oldest = max(oldest, now - q[0].arrival)
        return jobs, tokens, oldest

    def model_rate(self, pool: str) -> float | None:
        """The service model's work tokens/s for a full worker on the pool's home jobs so far."""
        sums = self.arrived_sums[pool]
        return self.models[pool].full_rate_of(sums) if sums[0] else None

    def live(self, pool: str) -> list[SimWorker]:
        return self.pool_workers[pool]

    def launch(self, pool: PoolConfig, count: int, now: float, cold: bool = True) -> None:
        for _ in range(count):
            wid = f"{pool.name}-{len(self.all_workers)}"
            w = SimWorker(wid, pool, self.models[pool.name], now, pool.cold_start_s if cold else 0)
            self.all_workers.append(w)
            self.pool_workers[pool.name].append(w)
            if w.state == "starting":
                self._push(w.ready_at, _READY, w, 0)
            else:
                self._fill(w, now)
                self._reschedule(w, now)
        self._mark(now)

    def drain(self, wid: str, now: float) -> None:
        for w in self.pool_workers[wid.rsplit("-", 1)[0]]:
            if w.wid == wid and w.state != "draining":
                w.state = "draining"
                if not w.heap:
                    self._remove(w, now)
                return

    # -- the event loop --------------------------------------------------------------------

    def run(self, policy: Policy) -> PolicyResult:
        policy.start(self)
        jobs, events = self.jobs, self.events
        i, n = 0, len(jobs)
        interval = policy.interval_s
        next_poll = 0.0 if interval else math.inf
        limit = self.duration + self.cfg.max_extra_s
        now = 0.0
        while True:
            t_arr = jobs[i].arrival if i < n else math.inf
            t_ev = events[0][0] if events else math.inf
            if i == n and self.unfinished == 0:
                end = max(self.duration, self.last_finish)
                if min(t_ev, next_poll) > end:
                    break
            now = min(t_arr, t_ev, next_poll)
            if now > limit:
                raise RuntimeError(
                    f"policy {policy.name}: {self.unfinished + n - i} jobs still unserved "
                    f"{self.cfg.max_extra_s:g}s after the trace ends"
                )
            if t_ev <= now:
                _, _, kind, w, version = heapq.heappop(events)
                if kind == _READY:
                    self._ready(w, now)
                elif version == w.version:
                    self._finish(w, now)
            elif t_arr <= now:
                self._arrive(jobs[i], now)
                i += 1
            else:
                policy.tick(self, now)
                next_poll += interval  # type: ignore[operator]
        return self._result(policy.name, max(self.duration, self.last_finish))

    def _push(self, t: float, kind: int, w: SimWorker, version: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, w, version))

    def _mark(self, now: float) -> None:
        count = sum(len(ws) for ws in self.pool_workers.values())
        if self.timeline[-1][0] == now:
            self.timeline[-1] = (now, count)
        else:
            self.timeline.append((now, count))

    def _arrive(self, job: Job, now: float) -> None:
        self.unfinished += 1
        self.arrived_tokens[job.bucket] += job.work
        home = self.home[job.bucket]
        self.models[home].add_to(self.arrived_sums[home], job)
        if self.queues[job.bucket]:
            self._enqueue(job)  # FCFS: no worker could take the head, so it waits behind
            return
        for pool in self.servers[job.bucket]:
            ahead = pool.buckets[: pool.buckets.index(job.bucket)]
            if any(self.queues[b] for b in ahead):
                continue  # its workers would take those first
            free = [
                w for w in self.pool_workers[pool.name] if w.state == "ready" and w.can_take(job)
            ]
            if free:
                w = min(free, key=lambda w: len(w.heap))
                w.advance(now)
                self._start(w, job, now)
                self._reschedule(w, now)
                return
        self._enqueue(job)

    def _enqueue(self, job: Job) -> None:
        self.queues[job.bucket].append(job)
        self.queued_tokens[job.bucket] += job.work

    def _start(self, w: SimWorker, job: Job, now: float) -> None:
        cost = w.model.job_costs(job)
        heapq.heappush(w.heap, (w.vt + job.output_tokens, job.idx, job, cost))
        w.mem += cost[0]
        w.flop += cost[1]
        w.prefill += cost[2]
        w.kv_used += job.work
        w.idle_since = None
        self.start[job.idx] = now

    def _fill(self, w: SimWorker, now: float) -> None:
        """Take jobs while there is a free slot: the head of the first non-empty bucket."""
        while w.state == "ready" and len(w.heap) < w.model.max_num_seqs:
            for b in w.buckets:
                q = self.queues[b]
                if q:
                    if not w.can_take(q[0]):
                        return  # it waits for room; the worker holds its place
                    job = q.popleft()
                    self.queued_tokens[b] -= job.work
                    self._start(w, job, now)
                    break
            else:
                return

    def _reschedule(self, w: SimWorker, now: float) -> None:
        w.version += 1
        if w.heap:
            dt = (w.heap[0][0] - w.vt) * w.step_time()
            self._push(now + max(dt, 0.0), _FINISH, w, w.version)
        elif w.idle_since is None:
            w.idle_since = now

    def _ready(self, w: SimWorker, now: float) -> None:
        if w.state != "starting":
            return  # drained (removed) before it came up
        w.state = "ready"
        w.idle_since = now
        w.t_last = now
        self._fill(w, now)
        self._reschedule(w, now)

    def _finish(self, w: SimWorker, now: float) -> None:
        w.advance(now)
        while w.heap and w.heap[0][0] <= w.vt + 1e-9:
            _, _, job, cost = heapq.heappop(w.heap)
            w.mem -= cost[0]
            w.flop -= cost[1]
            w.prefill -= cost[2]
            w.kv_used -= job.work
            w.served += job.work
            self.unfinished -= 1
            self.last_finish = now
        if not w.heap:
            w.mem = w.flop = w.prefill = 0.0  # no drift left over
        self._fill(w, now)
        self._reschedule(w, now)
        if w.state == "draining" and not w.heap:
            self._remove(w, now)

    def _remove(self, w: SimWorker, now: float) -> None:
        w.removed = now
        w.version += 1
        self.pool_workers[w.pool].remove(w)
        self._mark(now)

    # -- results ---------------------------------------------------------------------------

    def _result(self, name: str, end: float) -> PolicyResult:
        seconds = sum(min(w.removed, end) - w.launched for w in self.all_workers)
        waits = [self.start[j.idx] - j.arrival for j in self.jobs]
        pools = self.fleet.pools
        by_pool: dict[str, list[float]] = {p: [] for p in pools}
        met = 0
        for job, wait in zip(self.jobs, waits, strict=True):
            home = self.home[job.bucket]
            by_pool[home].append(wait)
            met += wait <= pools[home].target_wait_s
        p99_pool = {p: percentile(ws, 0.99) for p, ws in by_pool.items() if ws}
        short = [w for j, w in zip(self.jobs, waits, strict=True) if j.bucket == "short"]
        return PolicyResult(
            policy=name,
            gpu_hours=seconds / 3600,
            p50_wait_s=percentile(waits, 0.5),
            p99_wait_s=percentile(waits, 0.99),
            p99_wait_short_s=percentile(short, 0.99),
            slo_attainment=met / len(waits) if waits else 1.0,
            peak_workers=max(c for _, c in self.timeline),
            p99_wait_by_pool=p99_pool,
            slo_met=all(v <= pools[p].target_wait_s for p, v in p99_pool.items()),
            end_s=end,
            timeline=self.timeline,
            waits=[(j.arrival, w) for j, w in zip(self.jobs, waits, strict=True)],
        )


# ==== policies ==============================================================================


class TidePolicy:
    """What `tide controller` does each poll (infra/fleet/controller.py), with the simulator for its
    Redis, heartbeats and actuator: the same observation, infra.fleet.autoscale.decide, the same
    actions (launch; drain the chosen workers, removed once drained)."""

    name = "tide"

    def __init__(self, fleet: FleetConfig, config: SimConfig) -> None:
        from infra.fleet.controller import estimated_rate

        self.fleet = fleet
        self.learn = config.tide_rate == "controller"
        self.interval_s: float | None = fleet.controller.poll_interval_s
        self.estimated = {name: estimated_rate(pool) for name, pool in fleet.pools.items()}
        self.states = {p: PoolState() for p in fleet.pools}
        self.rates = RateTracker(list(fleet.pools))

    def start(self, sim: Simulation) -> None:
        for pool in self.fleet.pools.values():
            sim.launch(pool, pool.min_workers, 0.0, cold=False)

    def tick(self, sim: Simulation, now: float) -> None:
        rates = self.rates.bucket_rates(now, dict(sim.arrived_tokens))
        for name, pool in self.fleet.pools.items():
            jobs, tokens, oldest = sim.backlog(name, now)
            arriving = sum(rates.get(b, 0.0) for b in self.fleet.home_buckets(name))
            arrival = self.rates.update_arrival(name, now, arriving)
            live = sim.live(name)
            if self.learn:  # exactly what the controller learns from heartbeats
                served = {w.wid: (w.served, bool(w.heap)) for w in live}
                learnt = self.rates.update_service(name, now, jobs > 0, served)
                rate = pool.tokens_per_s or learnt or self.estimated[name]
            else:
                rate = sim.model_rate(name) or self.estimated[name]
            views = [WorkerView(w.wid, w.state, w.running, w.idle_since) for w in live]
            obs = PoolObservation(now, jobs, tokens, oldest, arrival, rate, views)
            decision = decide(pool, obs, self.states[name], self.fleet.controller)
            if decision.action == "scale_out":
                sim.launch(pool, decision.desired - decision.current, now)
            for wid in decision.drain:
                sim.drain(wid, now)


@dataclass(frozen=True)
class KedaConfig:
    """KEDA's Redis list scaler with its usual defaults, and the HPA it drives."""

    list_length: int = 5  # target queued jobs per worker
    polling_s: float = 30.0
    cooldown_s: float = 300.0  # list empty this long -> scale to zero
    stabilization_s: float = 300.0  # HPA scale-down: the highest recommendation this long


class ListLengthPolicy:
    """desired = ceil(queued jobs / list_length) per pool (its home buckets' lists); at least
    one while active; to min_workers once the lists have been empty for the cooldown."""

    name = "list_length"

    def __init__(self, fleet: FleetConfig, keda: KedaConfig | None = None) -> None:
        self.fleet, self.keda = fleet, keda or KedaConfig()
        self.interval_s: float | None = self.keda.polling_s
        self.last_active = dict.fromkeys(fleet.pools, -math.inf)
        self.recent: dict[str, deque[tuple[float, int]]] = {p: deque() for p in fleet.pools}

    def start(self, sim: Simulation) -> None:
        for pool in self.fleet.pools.values():
            sim.launch(pool, pool.min_workers, 0.0, cold=False)

    def tick(self, sim: Simulation, now: float) -> None:
        k = self.keda
        for pool in self.fleet.pools.values():
            queued = sum(len(sim.queues[b]) for b in self.fleet.home_buckets(pool.name))
            active = [w for w in sim.live(pool.name) if w.state != "draining"]
            current = len(active)
            if queued:
                self.last_active[pool.name] = now
                desired = max(math.ceil(queued / k.list_length), 1)
            elif now - self.last_active[pool.name] >= k.cooldown_s:
                desired = 0  # KEDA scales to zero itself, past the HPA
                self.recent[pool.name].clear()
            else:
                desired = 1 if current else 0  # HPA's floor while KEDA says active
            desired = min(max(desired, pool.min_workers), pool.max_workers)
            recent = self.recent[pool.name]
            if queued or desired:
                recent.append((now, desired))
                while recent and recent[0][0] < now - k.stabilization_s:
                    recent.popleft()
                if desired < current:
                    desired = min(current, max(d for _, d in recent))
            desired = min(desired, max(2 * current, current + 4))  # HPA's scale-up rate
            if desired > current:
                sim.launch(pool, desired - current, now)
            elif desired < current:
                idlest = sorted(active, key=lambda w: (w.running, w.state == "ready"))
                for w in idlest[: current - desired]:
                    sim.drain(w.wid, now)


class StaticPolicy:
    """A fixed number of workers per pool, ready from the start and never removed."""

    name = "static_peak"
    interval_s: float | None = None

    def __init__(self, fleet: FleetConfig, counts: dict[str, int]) -> None:
        self.fleet, self.counts = fleet, counts

    def start(self, sim: Simulation) -> None:
        for name, count in self.counts.items():
            sim.launch(self.fleet.pools[name], count, 0.0, cold=False)

    def tick(self, sim: Simulation, now: float) -> None:
        return None


def peak_hour_counts(
    fleet: FleetConfig, jobs: list[Job], models: dict[str, ServiceModel]
) -> dict[str, int]:
    """Workers per pool for its busiest hour of arrivals (work tokens) at a full worker's rate."""
    counts = {}
    for name, pool in fleet.pools.items():
        homes = set(fleet.home_buckets(name))
        mine = sorted((j for j in jobs if j.bucket in homes), key=lambda j: j.arrival)
        if not mine:
            counts[name] = pool.min_workers
            continue
        peak = window = lo = 0
        for job in mine:
            window += job.work
            while mine[lo].arrival <= job.arrival - 3600:
                window -= mine[lo].work
                lo += 1
            peak = max(peak, window)
        rate = models[name].full_rate(mine)
        need = max(math.ceil(peak / 3600 / rate - 1e-9), 1)
        counts[name] = min(max(need, pool.min_workers), pool.max_workers)
    return counts


POLICIES = ("tide", "list_length", "static_peak")


def simulate(
    fleet: FleetConfig,
    jobs: list[Job],
    duration_s: float,
    models: dict[str, ServiceModel] | None = None,
    policies: tuple[str, ...] = POLICIES,
    config: SimConfig | None = None,
    keda: KedaConfig | None = None,
) -> dict[str, PolicyResult]:
    """Each policy over the same trace. static_peak starts from the peak-hour count per pool
    and adds a worker to each pool that misses its SLO (p99 wait <= target_wait_s), up to
    max_workers, so static is compared at an SLO it meets wherever max_workers allows."""
    models = models or service_models(fleet)
    config = config or SimConfig()
    out: dict[str, PolicyResult] = {}
    for name in policies:
        if name not in POLICIES:
            raise ValueError(f"unknown policy {name!r}; policies are {', '.join(POLICIES)}")

        def run(policy: Policy) -> PolicyResult:
            return Simulation(fleet, jobs, models, duration_s, config).run(policy)

        if name == "tide":
            out[name] = run(TidePolicy(fleet, config))
        elif name == "list_length":
            out[name] = run(ListLengthPolicy(fleet, keda))
        else:
            counts = peak_hour_counts(fleet, jobs, models)
            while True:
                result = run(StaticPolicy(fleet, counts))
                short = [
                    p for p, v in result.p99_wait_by_pool.items()
                    if v > fleet.pools[p].target_wait_s and counts[p] < fleet.pools[p].max_workers
                ]  # fmt: skip
                if not short:
                    break
                for p in short:
                    counts[p] += 1
            result.note = ", ".join(f"{p}={c}" for p, c in counts.items())
            out[name] = result
    return out
