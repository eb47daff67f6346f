"""What one policy's run over a trace comes to: GPU-hours, queue waits, SLOs."""

from __future__ import annotations

from dataclasses import dataclass, field

from infra.fleet.fleet_config import FleetConfig
from infra.sim.traces import Job
from infra.stats import percentile


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


def measure(
    policy: str,
    fleet: FleetConfig,
    jobs: list[Job],
    waits: list[float],
    billed_s: float,
    timeline: list[tuple[float, int]],
    end: float,
) -> PolicyResult:
    """The figures of a finished run: each job's wait (in job order) is judged against its
    home pool's target_wait_s; billed_s is the workers' seconds from launch to removal."""
    pools = fleet.pools
    homes = {b: fleet.home_pool(b).name for b in {j.bucket for j in jobs}}
    by_pool: dict[str, list[float]] = {p: [] for p in pools}
    met = 0
    for job, wait in zip(jobs, waits, strict=True):
        home = homes[job.bucket]
        by_pool[home].append(wait)
        met += wait <= pools[home].target_wait_s
    p99_pool = {p: percentile(ws, 99) for p, ws in by_pool.items() if ws}
    short = [w for j, w in zip(jobs, waits, strict=True) if j.bucket == "short"]
    return PolicyResult(
        policy=policy,
        gpu_hours=billed_s / 3600,
        p50_wait_s=_percentile_or_zero(waits, 50),
        p99_wait_s=_percentile_or_zero(waits, 99),
        p99_wait_short_s=_percentile_or_zero(short, 99),
        slo_attainment=met / len(waits) if waits else 1.0,
        peak_workers=max(c for _, c in timeline),
        p99_wait_by_pool=p99_pool,
        slo_met=all(v <= pools[p].target_wait_s for p, v in p99_pool.items()),
        end_s=end,
        timeline=timeline,
        waits=[(j.arrival, w) for j, w in zip(jobs, waits, strict=True)],
    )


def _percentile_or_zero(values: list[float], q: float) -> float:
    return percentile(values, q) if values else 0.0  # no jobs (of a kind) waited at all
