"""The simulator's jobs: the seeded built-in traces (diurnal, mixed, batch-windows) and job
trace files (read by infra/traces.py), each job of one of the fleet's models
(infra/sim/models.py) and bucketed as the gateway buckets it, with its model's thresholds
(docs/simulator.md); a job with a deadline is of the batch class."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tide_fleet.infra.settings import get_settings
from tide_fleet.infra.sim.models import FleetModels, SimModel
from tide_fleet.infra.traces import TraceError, read_job_trace
from tide_fleet.infra.wire.protocol import bucket_for

TRACES = ("diurnal", "mixed", "batch-windows")

# Built-in trace rates, sized for fleet.example.toml (docs/simulator.md).
DIURNAL_TROUGH_PER_S = 0.35
DIURNAL_PEAK_PER_S = 3.5
DIURNAL_BURSTS = 3
MIXED_RATE_PER_S = 0.6
MIXED_LONG_FRACTION = 0.2
MIXED_BURSTS = 2
BURST_FACTOR = 1.5
# batch-windows: diurnal plus nightly batches, (submitted at, completion window, jobs) each
BATCHES = ((1 * 3600.0, 24 * 3600.0, 2000), (2 * 3600.0, 6 * 3600.0, 1500))


class Job:
    __slots__ = (
        "arrival", "bucket", "deadline", "idx", "max_tokens", "model", "output_tokens",
        "prompt_tokens", "work",
    )  # fmt: skip

    def __init__(
        self, idx: int, arrival: float, prompt_tokens: int, max_tokens: int,
        output_tokens: int, bucket: str, model: str | None = None,
        deadline: float | None = None,
    ) -> None:  # fmt: skip
        self.idx, self.arrival, self.bucket = idx, arrival, bucket
        self.deadline = deadline  # finish by (seconds from the start); None: interactive
        self.model = model  # its pools' model key (SimModel.key); None: the fleet's default
        self.prompt_tokens, self.max_tokens = prompt_tokens, max_tokens
        self.output_tokens = output_tokens  # what it really generates (<= max_tokens)
        self.work = prompt_tokens + max_tokens  # what the queues count as backlog


def make_jobs(
    rows: Sequence[tuple[float, int, int, int]],
    models: Sequence[SimModel] | None = None,
    deadlines: Sequence[float | None] | None = None,
) -> list[Job]:
    """(arrival, prompt, max_tokens, output) rows -> jobs in arrival order, bucketed; with
    `models` (one per row), of those models with their thresholds, else of the fleet's
    default model with the settings' thresholds; with `deadlines` (one per row), those."""
    s = get_settings()
    short_max, medium_max = s.bucket_short_max, s.bucket_medium_max
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])
    jobs = []
    for n, i in enumerate(order):
        t, p, m, o = rows[i]
        due = deadlines[i] if deadlines is not None else None
        if models is None:
            jobs.append(Job(n, t, p, m, o, bucket_for(p + m, short_max, medium_max), None, due))
        else:
            model = models[i]
            jobs.append(Job(n, t, p, m, o, model.bucket(p + m), model.key, due))
    return jobs


def load_trace(
    path: str | Path, hours: float | None = None, models: FleetModels | None = None
) -> tuple[list[Job], float]:
    """A job trace file's jobs (those in the first `hours`, when given) and its length in
    seconds: `hours`, else the last arrival. Each line's `model` is resolved among the
    fleet's `models` (absent: the default); without them, a line may name none. A line's
    `deadline` or `completion_window` makes it a deadline job (infra/traces.py)."""
    p = Path(path)
    rows, of, due = [], [], []
    for r in read_job_trace(p):
        model = None
        if models is not None:  # every line, those past `hours` too: a typo is an error
            model = models.resolve(r.model)
            if model is None:
                raise TraceError(f"{p}:{r.line}: {models.not_served(r.model)}")
        elif r.model is not None:
            raise TraceError(f"{p}:{r.line}: model {r.model!r}: no fleet's models to resolve it")
        if hours is None or r.arrival_s <= hours * 3600:
            rows.append((r.arrival_s, r.prompt_tokens, r.max_tokens, r.output_tokens))
            due.append(r.deadline)
            if model is not None:
                of.append(model)
    if not rows:
        raise TraceError(f"trace {p}: no jobs" + (f" in the first {hours:g} h" if hours else ""))
    jobs = make_jobs(rows, of if models is not None else None, due)
    return jobs, hours * 3600 if hours is not None else jobs[-1].arrival


def builtin_trace(
    name: str,
    seed: int,
    hours: float | None = None,
    mix: dict[str, float] | None = None,
    models: FleetModels | None = None,
) -> tuple[list[Job], float]:
    """A seeded built-in trace and its length in seconds (docs/simulator.md describes both).
    With the fleet's `models`, each job is the default model's, or drawn from `mix` (model
    name -> share, `--models a:0.7,b:0.3`) with a generator of its own, so the arrivals and
    lengths are the same whatever the mix."""
    if name not in TRACES:
        raise ValueError(f"unknown trace {name!r}; built in: {', '.join(TRACES)} (or FILE.jsonl)")
    if name == "batch-windows":
        return _with_batches(seed, hours, mix, models)
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
    if models is None:
        if mix:
            raise ValueError("--models needs the fleet's models")
        return make_jobs(rows), span
    return make_jobs(rows, draw_models(models, mix, seed, n)), span


def _with_batches(
    seed: int, hours: float | None, mix: dict[str, float] | None, models: FleetModels | None
) -> tuple[list[Job], float]:
    """The diurnal trace's jobs (the same ones) plus BATCHES submitted within the span: long
    documents (prompt median 12,000 tokens, output median 600) of the default model, each
    due its batch's window after submission, drawn from a generator of their own."""
    jobs, span = builtin_trace("diurnal", seed, hours, mix, models)
    rows = [(j.arrival, j.prompt_tokens, j.max_tokens, j.output_tokens) for j in jobs]
    due: list[float | None] = [None] * len(jobs)
    rng = np.random.default_rng([seed, 2])
    for submitted, window, n in BATCHES:
        if submitted >= span:
            continue
        prompt = _lognormal(rng, n, 12000, 0.3, 9000, 30000)
        out = _lognormal(rng, n, 600, 0.3, 100, 1500)
        rows += [(submitted, int(p), int(o), int(o)) for p, o in zip(prompt, out, strict=True)]
        due += [submitted + window] * n
    if models is None:
        return make_jobs(rows, None, due), span
    of = [models.by_key[j.model] if j.model is not None else models.default for j in jobs]
    return make_jobs(rows, of + [models.default] * (len(rows) - len(jobs)), due), span


def draw_models(
    models: FleetModels, mix: dict[str, float] | None, seed: int, n: int
) -> list[SimModel]:
    """n jobs' models: each drawn from the mix's shares (seeded), or all the default."""
    if not mix:
        return [models.default] * n
    chosen = []
    for name, share in mix.items():
        model = models.resolve(name)
        if model is None:
            raise ValueError(f"--models: {models.not_served(name)}")
        if isinstance(share, bool) or not 0 < share < math.inf:
            raise ValueError(f"--models: shares must be > 0, got {name}={share}")
        chosen.append(model)
    shares = np.array(list(mix.values()), dtype=float)
    picks = np.random.default_rng([seed, 1]).choice(len(chosen), size=n, p=shares / shares.sum())
    return [chosen[i] for i in picks]


def _lognormal(rng: Any, n: int, median: float, sigma: float, low: int, high: int) -> Any:
    return np.clip(np.round(median * np.exp(sigma * rng.standard_normal(n))), low, high)
