"""The simulator's jobs: the seeded built-in traces (diurnal, mixed) and job trace files
(read by infra/traces.py), bucketed as the gateway buckets them (docs/simulator.md)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from infra.settings import get_settings
from infra.traces import TraceError, read_job_trace
from infra.wire.protocol import bucket_for

TRACES = ("diurnal", "mixed")

# Built-in trace rates, sized for fleet.example.toml (docs/simulator.md).
DIURNAL_TROUGH_PER_S = 0.35
DIURNAL_PEAK_PER_S = 3.5
DIURNAL_BURSTS = 3
MIXED_RATE_PER_S = 0.6
MIXED_LONG_FRACTION = 0.2
MIXED_BURSTS = 2
BURST_FACTOR = 1.5


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


def make_jobs(rows: list[tuple[float, int, int, int]]) -> list[Job]:
    """(arrival, prompt, max_tokens, output) rows -> jobs in arrival order, bucketed."""
    s = get_settings()
    short_max, medium_max = s.bucket_short_max, s.bucket_medium_max
    rows = sorted(rows, key=lambda r: r[0])
    return [
        Job(i, t, p, m, o, bucket_for(p + m, short_max, medium_max))
        for i, (t, p, m, o) in enumerate(rows)
    ]


def load_trace(path: str | Path, hours: float | None = None) -> tuple[list[Job], float]:
    """A job trace file's jobs (those in the first `hours`, when given) and its length in
    seconds: `hours`, else the last arrival."""
    p = Path(path)
    rows = [
        (r.arrival_s, r.prompt_tokens, r.max_tokens, r.output_tokens)
        for r in read_job_trace(p)
        if hours is None or r.arrival_s <= hours * 3600
    ]
    if not rows:
        raise TraceError(f"trace {p}: no jobs" + (f" in the first {hours:g} h" if hours else ""))
    jobs = make_jobs(rows)
    return jobs, hours * 3600 if hours is not None else jobs[-1].arrival


def builtin_trace(name: str, seed: int, hours: float | None = None) -> tuple[list[Job], float]:
    """A seeded built-in trace and its length in seconds (docs/simulator.md describes both)."""
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
    return np.clip(np.round(median * np.exp(sigma * rng.standard_normal(n))), low, high)
