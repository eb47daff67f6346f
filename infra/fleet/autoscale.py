"""The scaling policy: pure functions over observations, shared by the controller and the
simulator (so what the simulator measures is the policy that runs).

Units: a job's *work* is prompt_tokens + max_tokens, what the queues count as backlog; a
worker's service rate is work tokens finished per second (heartbeats measure it; the
planner estimates it before there is history).

Per pool, per decision:

- demand (workers) = arrival_rate / rate                  # keep up with arrivals
                   + backlog / (rate x drain_window)      # and drain the queue within the SLO
  where drain_window = target_wait - age of the oldest job (at least 10% of the target), so
  a queue that has already waited long is drained faster;
- no backlog and nothing running means zero demand, whatever the smoothed arrival rate
  says: rates decide how many workers a busy pool needs, never whether an idle one needs
  any (so a pool at zero leaves it only for a queued job, and scale to zero settles);
- from zero: any queued job asks for at least one worker, in the first poll;
- scale out at once (optional cooldown between scale-outs), capped so that every live
  worker, starting, ready or draining, counts against max_workers;
- scale in only when demand < hysteresis x (workers - 1), after a cooldown since the last
  change, one worker per decision, choosing the idlest, which drains first (never a busy
  worker removed: the actuator removes it once it has drained);
- scale to min_workers (zero by default) after the pool has been idle for idle_s.

The window is floored at the pool's cold start (and at 10% of the target): workers
launched now serve nothing before they are ready, so a queue that is already late is
drained over the time new capacity needs to arrive, instead of asking for max_workers at
every poll. Rates are smoothed with time constants, not per-poll weights (RateTracker),
so the poll interval does not change how jumpy the controller is.

With a deadline backlog in the observation (`deadlines`, not None), queued jobs that carry
a deadline leave the size rule above and are sized by their deadlines instead
(infra/fleet/deadlines.py): target = max(size target, deadline target). A far deadline
does not wake a pool from zero; a near one does. Without it, nothing changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from tide_fleet.infra.fleet.deadlines import deadline_demand, deadline_target
from tide_fleet.infra.fleet.fleet_config import ControllerConfig, PoolConfig

ARRIVAL_TAU_S = 60.0  # time constant of the smoothed arrival rate
SERVICE_TAU_S = 120.0  # ... and of the learnt per-worker service rate
MIN_SAMPLE_S = 30.0  # a service-rate sample spans at least this long
MIN_SAMPLES = 6  # samples before the learnt rate replaces the configured estimate


@dataclass(frozen=True)
class WorkerView:
    """What the controller knows of one worker (from heartbeats and the actuator)."""

    worker_id: str
    state: str  # starting | ready | draining
    running: int = 0  # jobs held (running or admitted)
    idle_since: float | None = None  # when it last became idle; None while busy


@dataclass(frozen=True)
class PoolObservation:
    now: float
    backlog_jobs: int  # queued jobs in the pool's home buckets
    backlog_tokens: int
    oldest_age_s: float
    arrival_tokens_per_s: float  # smoothed
    rate_per_worker: float  # work tokens/s one worker finishes (measured or estimated)
    workers: list[WorkerView]
    # (deadline, work tokens) of the queued jobs that carry one, by deadline, counted in
    # backlog_jobs/backlog_tokens too; None: not observed (sized by backlog and wait alone).
    deadlines: list[tuple[float, int]] | None = None


@dataclass
class PoolState:
    """What the policy remembers between decisions for one pool."""

    last_change: float = -math.inf
    last_scale_out: float = -math.inf
    idle_since: float | None = None  # pool idle (no backlog, nothing running) since


@dataclass
class Decision:
    pool: str
    action: str  # hold | scale_out | scale_in | scale_to_min
    current: int  # workers not draining (starting + ready)
    desired: int
    demand: float
    reason: str
    drain: list[str] = field(default_factory=list)  # worker ids to drain now


def demand_workers(obs: PoolObservation, pool: PoolConfig) -> float:
    """Workers needed for the arrival rate plus those to drain the backlog within the SLO."""
    rate = max(obs.rate_per_worker, 1e-9)
    floor = max(0.1 * pool.target_wait_s, pool.cold_start_s)
    window = max(pool.target_wait_s - obs.oldest_age_s, floor)
    return obs.arrival_tokens_per_s / rate + obs.backlog_tokens / (rate * window)


def decide(
    pool: PoolConfig, obs: PoolObservation, state: PoolState, controller: ControllerConfig
) -> Decision:
    """One decision for one pool; updates state."""
    active = [w for w in obs.workers if w.state != "draining"]
    current = len(active)
    draining = len(obs.workers) - current
    running = any(w.running > 0 for w in obs.workers)
    busy = obs.backlog_jobs > 0 or running
    if busy:
        state.idle_since = None
    elif state.idle_since is None:
        state.idle_since = obs.now
    sized = _without_deadlines(obs)  # what the size rule sizes for
    # Rates decide how many, not whether: with nothing queued and nothing in flight the
    # demand is zero, whatever the smoothed arrival rate still remembers.
    demand = demand_workers(sized, pool) if sized.backlog_jobs > 0 or running else 0.0
    need = math.ceil(demand - 1e-9)
    if sized.backlog_jobs > 0:
        need = max(need, 1)  # from zero on the first job
    by_deadline = 0
    if obs.deadlines:
        due = deadline_demand(obs.deadlines, obs.now, obs.rate_per_worker, pool.cold_start_s)
        by_deadline = deadline_target(due)
        need = max(need, by_deadline)
        demand = max(demand, due)
    need = min(max(need, pool.min_workers), pool.max_workers)
    # The cap counts every live worker: draining ones still hold a process (or an instance).
    room = pool.max_workers - draining

    def done(action: str, desired: int, reason: str, drain: list[str] | None = None) -> Decision:
        if action != "hold":
            state.last_change = obs.now
            if action == "scale_out":
                state.last_scale_out = obs.now
        return Decision(pool.name, action, current, desired, demand, reason, drain or [])

    if need > current:
        if room <= current:
            return done(
                "hold", current,
                f"at max_workers {pool.max_workers} with {draining} draining ({need} wanted)",
            )  # fmt: skip
        if obs.now - state.last_scale_out < controller.scale_out_cooldown_s:
            return done("hold", current, f"scale-out cooldown ({need} wanted)")
        return done(
            "scale_out", min(need, room),
            f"demand {demand:.2f} workers: backlog {obs.backlog_tokens} tok "
            f"({obs.backlog_jobs} jobs, oldest {obs.oldest_age_s:.1f}s), "
            f"arrivals {obs.arrival_tokens_per_s:.0f} tok/s, "
            f"{obs.rate_per_worker:.0f} tok/s per worker, target wait {pool.target_wait_s:g}s"
            + (f", {by_deadline} for deadlines" if by_deadline else ""),
        )  # fmt: skip
    if current <= pool.min_workers:
        return done("hold", current, "at min_workers")
    idle_for = obs.now - state.idle_since if state.idle_since is not None else 0.0
    if not busy and idle_for >= pool.idle_s:
        victims = _idlest(active, current - pool.min_workers)
        return done(
            "scale_to_min", pool.min_workers,
            f"idle for {idle_for:.0f}s >= idle_s {pool.idle_s:g}s", victims,
        )  # fmt: skip
    if not busy:
        return done("hold", current, f"idle for {idle_for:.0f}s of {pool.idle_s:g}s")
    if demand >= controller.scale_in_hysteresis * (current - 1):
        return done("hold", current, f"demand {demand:.2f} keeps {current} workers")
    since = obs.now - state.last_change
    if since < controller.scale_in_cooldown_s:
        return done(
            "hold", current,
            f"scale-in cooldown ({since:.0f}s of {controller.scale_in_cooldown_s:g}s)",
        )  # fmt: skip
    victims = _idlest(active, 1)
    return done(
        "scale_in", current - 1,
        f"demand {demand:.2f} < {controller.scale_in_hysteresis:g} x {current - 1}", victims,
    )  # fmt: skip


def _without_deadlines(obs: PoolObservation) -> PoolObservation:
    """The observation the size rule sees: the backlog less the jobs that carry a deadline
    (the oldest age stays the queue's: the backlog keys keep one per bucket)."""
    if not obs.deadlines:
        return obs
    jobs = max(obs.backlog_jobs - len(obs.deadlines), 0)
    tokens = max(obs.backlog_tokens - sum(t for _, t in obs.deadlines), 0) if jobs else 0
    return replace(obs, backlog_jobs=jobs, backlog_tokens=tokens, deadlines=None)


def _idlest(workers: list[WorkerView], n: int) -> list[str]:
    """The n idlest workers: fewest jobs, then idle longest, then still starting."""

    def key(w: WorkerView) -> tuple[int, float, str]:
        return (w.running, w.idle_since if w.idle_since is not None else math.inf, w.worker_id)

    return [w.worker_id for w in sorted(workers, key=key)[: max(n, 0)]]


def _blend(old: float | None, new: float, dt: float, tau: float) -> float:
    if old is None:
        return new
    a = 1.0 - math.exp(-max(dt, 0.0) / tau)
    return a * new + (1.0 - a) * old


class RateTracker:
    """The controller's two learnt quantities, shared with the simulator.

    Arrivals: work tokens enqueued per second per pool (from the monotonic per-bucket
    counters), smoothed with ARRIVAL_TAU_S. Service: work tokens one worker finishes per
    second, learnt only from workers that were busy, while their pool had a queue, over at
    least MIN_SAMPLE_S (from each worker's cumulative served total): then what a worker
    serves is what it can serve. A sample of zero counts (long jobs finish rarely); an
    idle or unsaturated worker says nothing about capacity, so it is skipped. The learnt
    rate is used only once it rests on MIN_SAMPLES samples.
    """

    def __init__(self, pools: list[str]) -> None:
        self.arrival: dict[str, float] = dict.fromkeys(pools, 0.0)
        self.service: dict[str, float | None] = dict.fromkeys(pools)
        self._last_counts: tuple[float, dict[str, int]] | None = None
        self._last_arrival_t: dict[str, float] = {}
        # pool -> worker -> (since, served total): per pool, as each update sees one pool
        self._marks: dict[str, dict[str, tuple[float, int]]] = {p: {} for p in pools}
        self._last_service_t: dict[str, float] = {}
        self.samples: dict[str, int] = dict.fromkeys(pools, 0)

    def bucket_rates(self, now: float, counts: dict[str, int]) -> dict[str, float]:
        """Per-bucket arrival rates since the previous reading of the counters."""
        last, self._last_counts = self._last_counts, (now, dict(counts))
        if last is None or now <= last[0]:
            return {}
        dt = now - last[0]
        return {b: max(0, n - last[1].get(b, 0)) / dt for b, n in counts.items()}

    def update_arrival(self, pool: str, now: float, rate_now: float) -> float:
        t = self._last_arrival_t.get(pool)
        self._last_arrival_t[pool] = now
        if t is None:
            self.arrival[pool] = rate_now
        else:
            self.arrival[pool] = _blend(self.arrival[pool], rate_now, now - t, ARRIVAL_TAU_S)
        return self.arrival[pool]

    def update_service(
        self, pool: str, now: float, queued: bool, workers: dict[str, tuple[int, bool]]
    ) -> float | None:
        """workers: worker id -> (cumulative work tokens served, holds jobs now)."""
        samples = []
        marks = self._marks.setdefault(pool, {})
        for wid, (served, busy) in workers.items():
            mark = marks.get(wid)
            if not (queued and busy):
                marks.pop(wid, None)  # the saturated stretch ended: start over
                continue
            if mark is None or served < mark[1]:
                marks[wid] = (now, served)  # first busy reading, or a restarted worker
                continue
            since, base = mark
            if now - since >= MIN_SAMPLE_S:
                samples.append((served - base) / (now - since))
                marks[wid] = (now, served)
        for wid in list(marks):
            if wid not in workers:
                del marks[wid]
        if samples:
            mean = sum(samples) / len(samples)
            t = self._last_service_t.get(pool, now)
            self._last_service_t[pool] = now
            old = self.service[pool]
            self.service[pool] = _blend(old, mean, max(now - t, MIN_SAMPLE_S), SERVICE_TAU_S)
            self.samples[pool] = self.samples.get(pool, 0) + 1
        # A few samples are noise (a worker ramping up finishes nothing for a while): until
        # there are MIN_SAMPLES, the caller keeps its estimate.
        return self.service[pool] if self.samples.get(pool, 0) >= MIN_SAMPLES else None
