"""Every policy over the same trace, static_peak raised until it meets its SLOs: what
``tide simulate`` reports."""

from __future__ import annotations

from tide_fleet.infra.fleet.fleet_config import FleetConfig
from tide_fleet.infra.sim.policies import (
    DEFAULT_POLICIES,
    POLICIES,
    KedaConfig,
    ListLengthPolicy,
    StaticPolicy,
    TidePolicy,
    peak_hour_counts,
)
from tide_fleet.infra.sim.results import PolicyResult
from tide_fleet.infra.sim.service_model import ServiceModel, service_models
from tide_fleet.infra.sim.simulation import Policy, SimConfig, Simulation
from tide_fleet.infra.sim.traces import Job


def simulate(
    fleet: FleetConfig,
    jobs: list[Job],
    duration_s: float,
    models: dict[str, ServiceModel] | None = None,
    policies: tuple[str, ...] = DEFAULT_POLICIES,
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

        if name in ("tide", "tide_size_only"):
            out[name] = run(TidePolicy(fleet, config, deadlines=name == "tide"))
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
