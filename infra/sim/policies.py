"""The scaling policies the simulator compares: Tide's own (infra.fleet.autoscale.decide, fed
what the controller observes: `tide` with the queued jobs' deadlines, `tide_size_only`
without them, as a controller before deadlines sized pools), a KEDA-style list-length
target, and static provisioning at the peak hour. Each is started once and then ticked
every interval_s (infra/sim/simulation.py).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from tide_fleet.infra.fleet.autoscale import (
    PoolObservation,
    PoolState,
    RateTracker,
    WorkerView,
    decide,
)
from tide_fleet.infra.fleet.controller import estimated_rate
from tide_fleet.infra.fleet.fleet_config import FleetConfig
from tide_fleet.infra.sim.routing import Routing
from tide_fleet.infra.sim.service_model import ServiceModel
from tide_fleet.infra.sim.simulation import SimConfig, Simulation
from tide_fleet.infra.sim.traces import Job

POLICIES = ("tide", "tide_size_only", "list_length", "static_peak")
DEFAULT_POLICIES = ("tide", "list_length", "static_peak")


class TidePolicy:
    """What `tide controller` does each poll (infra/fleet/controller.py), with the simulator for its
    Redis, heartbeats and actuator: the same observation (each pool from its own model's
    queues), infra.fleet.autoscale.decide, the same actions (launch; drain the chosen workers,
    removed once drained)."""

    def __init__(self, fleet: FleetConfig, config: SimConfig, deadlines: bool = True) -> None:
        self.name = "tide" if deadlines else "tide_size_only"
        self.deadlines = deadlines  # observe the queued jobs' deadlines (the controller does)
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
            arriving = sum(rates.get(q, 0.0) for q in sim.routing.home_queues[name])
            arrival = self.rates.update_arrival(name, now, arriving)
            live = sim.live(name)
            if self.learn:  # exactly what the controller learns from heartbeats
                served = {w.wid: (w.served, bool(w.heap)) for w in live}
                learnt = self.rates.update_service(name, now, jobs > 0, served)
                rate = pool.tokens_per_s or learnt or self.estimated[name]
            else:
                rate = sim.model_rate(name) or self.estimated[name]
            views = [WorkerView(w.wid, w.state, w.running, w.idle_since) for w in live]
            due = sim.deadlines(name) if self.deadlines else None
            obs = PoolObservation(now, jobs, tokens, oldest, arrival, rate, views, due)
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
    """desired = ceil(queued jobs / list_length) per pool (its home queues' lists); at least
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
            queued = sum(len(sim.queues[q]) for q in sim.routing.home_queues[pool.name])
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
    """Workers per pool for its busiest hour of arrivals (work tokens) at a full worker's rate,
    over the jobs of its home queues (its model's home buckets)."""
    routing = Routing(fleet)
    home = [routing.home.get(routing.queue_of(j)) for j in jobs]  # None: a model none serves
    counts = {}
    for name, pool in fleet.pools.items():
        mine = sorted((j for j, h in zip(jobs, home, strict=True) if h == name),
                      key=lambda j: j.arrival)  # fmt: skip
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
