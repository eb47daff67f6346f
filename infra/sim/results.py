"""What one policy's run over a trace comes to: GPU-hours, queue waits, SLOs, in total and
per model, and the share of deadline jobs finished by their deadline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tide_fleet.infra.sim.routing import Routing
from tide_fleet.infra.sim.traces import Job
from tide_fleet.infra.sim.worker import SimWorker
from tide_fleet.infra.stats import percentile


@dataclass(frozen=True)
class ModelResult:
    """One model's share of a run: its jobs' waits, its pools' workers."""

    jobs: int
    p50_wait_s: float
    p99_wait_s: float
    gpu_hours: float  # its pools' workers, launch to removal, times their gpus_per_worker

    def summary(self) -> dict[str, float | int]:
        return {
            "jobs": self.jobs,
            "p50_wait_s": round(self.p50_wait_s, 3),
            "p99_wait_s": round(self.p99_wait_s, 3),
            "gpu_hours": round(self.gpu_hours, 3),
        }


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
    by_model: dict[str, ModelResult]  # by the model's name (infra/sim/models.py)
    timeline: list[tuple[float, int]] = field(repr=False)  # (time, billed workers) per change
    waits: list[tuple[float, float]] = field(repr=False)  # (arrival, wait) per job
    note: str = ""
    deadline_jobs: int = 0  # jobs with a deadline (not in the waits and SLOs above)
    deadline_attainment: float = 1.0  # their share finished by their deadline

    def summary(self) -> dict[str, Any]:
        """The figures `tide simulate --json` prints per policy."""
        return {
            "gpu_hours": round(self.gpu_hours, 3),
            "p50_wait_s": round(self.p50_wait_s, 3),
            "p99_wait_s": round(self.p99_wait_s, 3),
            "p99_wait_short_s": round(self.p99_wait_short_s, 3),
            "slo_attainment": round(self.slo_attainment, 5),
            "peak_workers": self.peak_workers,
            "models": {name: m.summary() for name, m in self.by_model.items()},
            **(
                {"deadline_jobs": self.deadline_jobs,
                 "deadline_attainment": round(self.deadline_attainment, 5)}
                if self.deadline_jobs else {}
            ),
        }  # fmt: skip


def measure(
    policy: str,
    routing: Routing,
    jobs: list[Job],
    waits: list[float],
    workers: list[SimWorker],
    timeline: list[tuple[float, int]],
    end: float,
) -> PolicyResult:
    """The figures of a finished run: each job's wait (in job order) is judged against its
    home pool's target_wait_s; workers are billed from launch to removal (or the end), one
    GPU-hour per hour for each GPU a worker takes (its pool's gpus_per_worker)."""
    pools = routing.fleet.pools
    by_pool: dict[str, list[float]] = {p: [] for p in pools}
    by_model: dict[str, list[float]] = {key: [] for key in routing.models.by_key}
    met = 0
    for job, wait in zip(jobs, waits, strict=True):
        home = routing.home[routing.queue_of(job)]
        by_pool[home].append(wait)
        by_model[routing.key_of(job)].append(wait)
        met += wait <= pools[home].target_wait_s
    billed = dict.fromkeys(routing.models.by_key, 0.0)
    for w in workers:
        billed[routing.pool_model[w.pool]] += w.gpu_seconds(end)
    models = {
        routing.name_of(key): ModelResult(
            len(ws), _percentile_or_zero(ws, 50), _percentile_or_zero(ws, 99), billed[key] / 3600
        )
        for key, ws in by_model.items()
    }
    p99_pool = {p: percentile(ws, 99) for p, ws in by_pool.items() if ws}
    short = [w for j, w in zip(jobs, waits, strict=True) if j.bucket == "short"]
    return PolicyResult(
        policy=policy,
        gpu_hours=sum(w.gpu_seconds(end) for w in workers) / 3600,
        p50_wait_s=_percentile_or_zero(waits, 50),
        p99_wait_s=_percentile_or_zero(waits, 99),
        p99_wait_short_s=_percentile_or_zero(short, 99),
        slo_attainment=met / len(waits) if waits else 1.0,
        peak_workers=max(c for _, c in timeline),
        p99_wait_by_pool=p99_pool,
        slo_met=all(v <= pools[p].target_wait_s for p, v in p99_pool.items()),
        end_s=end,
        by_model=models,
        timeline=timeline,
        waits=[(j.arrival, w) for j, w in zip(jobs, waits, strict=True)],
    )


def _percentile_or_zero(values: list[float], q: float) -> float:
    return percentile(values, q) if values else 0.0  # no jobs (of a kind) waited at all
