"""One run of one scaling policy over one trace: a discrete-event simulation of the fleet's
pools (docs/simulator.md).

- a worker (infra/sim/worker.py) holds up to max_num_seqs jobs and KV room for their prompt +
  max_tokens; its step time comes from its pool's service model (infra/sim/service_model.py);
- a job waits in its (model, bucket) queue (infra/sim/routing.py); a worker takes the head of
  the first non-empty queue of its model's buckets in its pool's preference order, one job
  per free slot (within a queue jobs without a deadline first, FCFS, then deadline jobs,
  earliest deadline first: infra/sim/queue.py); a head it cannot fit waits for room;
- workers are ready cold_start_s after launch, billed from launch until removed; scale-in
  drains (no new jobs; removed when the last one finishes).
Event order at one instant: completions and ready workers, then arrivals, then the policy.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Protocol

from tide_fleet.infra.fleet.deadlines import merge_deadlines
from tide_fleet.infra.fleet.fleet_config import FleetConfig, PoolConfig
from tide_fleet.infra.sim.queue import SimQueue
from tide_fleet.infra.sim.results import PolicyResult, measure
from tide_fleet.infra.sim.routing import Routing
from tide_fleet.infra.sim.service_model import ServiceModel
from tide_fleet.infra.sim.traces import Job
from tide_fleet.infra.sim.worker import SimWorker

_FINISH, _READY = 0, 1


class Policy(Protocol):
    """A scaling policy as the event loop drives it (infra/sim/policies.py has three): started
    once, then ticked every interval_s; it reads and acts through the Simulation."""

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


class Simulation:
    """One run of one policy over one trace. Policies read backlog, live, model_rate,
    queues and routing (each pool's home queues), and act through launch and drain."""

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
        self.routing = r = Routing(fleet)
        self.home, self.servers = r.home, r.servers  # per queue: home pool, serving pools
        self.queues: dict[str, SimQueue] = {q: SimQueue() for q in r.all_queues}
        self.queued_tokens = dict.fromkeys(r.all_queues, 0)
        self.pool_workers: dict[str, list[SimWorker]] = {p: [] for p in fleet.pools}
        self.all_workers: list[SimWorker] = []
        self.events: list[tuple[float, int, int, SimWorker, int]] = []
        self.seq = 0
        self.start: dict[int, float] = {}  # job idx -> when a worker took it
        self.unfinished = 0
        self.deadlines_met = 0  # deadline jobs finished by their deadline
        self.last_finish = 0.0
        self.timeline: list[tuple[float, int]] = [(0.0, 0)]
        self.arrived_tokens = dict.fromkeys(r.all_queues, 0)  # monotonic, as wire/backlog.py
        self.arrived_sums = {p: [0.0] * 6 for p in fleet.pools}  # per home pool: full_rate_of
        r.check_jobs(self.jobs, {name: m.kv_tokens for name, m in models.items()})
        self.queue_of = {job.idx: r.queue_of(job) for job in self.jobs}

    # -- what policies see and do ----------------------------------------------------------

    def backlog(self, pool: str, now: float) -> tuple[int, int, float]:
        """Queued jobs, their prompt + max tokens, and the oldest one's age, over home queues
        (its model's home buckets)."""
        jobs = tokens = 0
        oldest = 0.0
        for name in self.routing.home_queues[pool]:
            q = self.queues[name]
            if q:
                jobs += len(q)
                tokens += self.queued_tokens[name]
                oldest = max(oldest, now - q.oldest_arrival())
        return jobs, tokens, oldest

    def deadlines(self, pool: str) -> list[tuple[float, int]]:
        """(deadline, work tokens) of the queued deadline jobs of its home queues, by deadline,
        as the controller reads them (infra/wire/backlog.py deadline_backlog)."""
        return merge_deadlines([self.queues[q].deadlines() for q in self.routing.home_queues[pool]])

    def model_rate(self, pool: str) -> float | None:
        """The service model's work tokens/s for a full worker on the pool's home jobs so far."""
        sums = self.arrived_sums[pool]
        return self.models[pool].full_rate_of(sums) if sums[0] else None

    def live(self, pool: str) -> list[SimWorker]:
        return self.pool_workers[pool]

    def launch(self, pool: PoolConfig, count: int, now: float, cold: bool = True) -> None:
        for _ in range(count):
            wid = f"{pool.name}-{len(self.all_workers)}"
            cold_s = pool.cold_start_s if cold else 0
            queues = self.routing.queues[pool.name]
            w = SimWorker(wid, pool, self.models[pool.name], queues, now, cold_s)
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
        queue = self.queue_of[job.idx]
        self.arrived_tokens[queue] += job.work
        home = self.home[queue]
        self.models[home].add_to(self.arrived_sums[home], job)
        if self.queues[queue].ahead_of(job):
            self._enqueue(job, queue)  # no worker could take the head, so it waits behind
            return
        for pool, ahead in self.servers[queue]:
            if any(self.queues[q] for q in ahead):
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
        self._enqueue(job, queue)

    def _enqueue(self, job: Job, queue: str) -> None:
        self.queues[queue].push(job)
        self.queued_tokens[queue] += job.work

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
        """Take jobs while there is a free slot: the head of the first non-empty queue."""
        while w.state == "ready" and len(w.heap) < w.model.max_num_seqs:
            for name in w.queues:
                q = self.queues[name]
                if q:
                    if not w.can_take(q.head()):
                        return  # it waits for room; the worker holds its place
                    job = q.pop()
                    self.queued_tokens[name] -= job.work
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
            if job.deadline is not None and now <= job.deadline:
                self.deadlines_met += 1
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

    def _result(self, name: str, end: float) -> PolicyResult:
        # Waits and SLOs are the interactive jobs'; deadline jobs are judged by their deadline.
        jobs = [j for j in self.jobs if j.deadline is None]
        waits = [self.start[j.idx] - j.arrival for j in jobs]
        result = measure(name, self.routing, jobs, waits, self.all_workers, self.timeline, end)
        result.deadline_jobs = len(self.jobs) - len(jobs)
        if result.deadline_jobs:
            result.deadline_attainment = self.deadlines_met / result.deadline_jobs
        return result
