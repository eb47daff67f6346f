"""``tide controller``: scales each worker pool with its queue, down to zero.

Every poll interval it reads the per-(model, bucket) backlog (infra/wire/backlog.py) and the
workers' heartbeats, builds one observation per pool (from its own model's backlog), asks
the policy (infra/fleet/autoscale.py) for a decision, and hands it to an actuator
(infra/fleet/actuator.py: local processes or an AWS Auto Scaling group). It never removes a
busy worker: it asks the idlest to drain (a Redis key the worker checks with its heartbeat)
and removes it once it has drained. It also hosts the lease reaper and the batch supervisor,
logs every decision with its reason, and exports its view as metrics
(infra/fleet/controller_metrics.py). Torch-free.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis

from tide_fleet.infra.fleet import controller_metrics as m
from tide_fleet.infra.fleet.actuator import Actuator
from tide_fleet.infra.fleet.autoscale import (
    Decision,
    PoolObservation,
    PoolState,
    RateTracker,
    WorkerView,
    decide,
)
from tide_fleet.infra.fleet.deadlines import merge_deadlines
from tide_fleet.infra.fleet.fleet_config import FleetConfig, PoolConfig
from tide_fleet.infra.fleet.reaper import run_reaper
from tide_fleet.infra.plan.planner import estimate_pool_tokens_per_s
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire import fleet_status
from tide_fleet.infra.wire.backlog import read_lanes
from tide_fleet.infra.wire.heartbeats import Heartbeat, read_heartbeats
from tide_fleet.infra.wire.protocol import BUCKETS, Keys, backlog_field

try:  # queued jobs' deadlines per backlog field; a wire without it: sized by backlog alone
    from tide_fleet.infra.wire.backlog import deadline_backlog
except ImportError:  # pragma: no cover - depends on the wire's version
    deadline_backlog = None

log = logging.getLogger("tide.controller")

DEFAULT_TOKENS_PER_S = 2000.0  # a worker's service rate when nothing better is known


def estimated_rate(pool: PoolConfig) -> float:
    """A worker's service rate before any measurement: the pool's setting, else the planner."""
    if pool.tokens_per_s:
        return pool.tokens_per_s
    try:  # the pool may name no model, or one the planner cannot read: a constant then
        return float(estimate_pool_tokens_per_s(pool))
    except Exception:
        return DEFAULT_TOKENS_PER_S


class Controller:
    def __init__(
        self,
        fleet: FleetConfig,
        settings: Settings,
        actuator: Actuator,
        client: redis.Redis | None = None,
        clock: Any = time.time,
    ) -> None:
        self.fleet = fleet
        self.settings = settings
        self.actuator = actuator
        assert client is not None or settings.redis_url, "the controller needs REDIS_URL"
        self.r = client or redis.Redis.from_url(settings.redis_url or "")
        self.clock = clock
        self.states = {name: PoolState() for name in fleet.pools}
        self.lanes = fleet.pool_lanes(settings.model)  # pool -> its model's lane
        self.metric_models = m.model_names(fleet, settings.model)  # lane -> its `model` label
        self.rates = RateTracker(list(fleet.pools))
        self.estimates = {name: estimated_rate(pool) for name, pool in fleet.pools.items()}
        self.last_decisions: list[Decision] = []
        self.last_beats: dict[str, Heartbeat] = {}

    # -- observing ---------------------------------------------------------------------

    def observe(self) -> dict[str, PoolObservation]:
        now = self.clock()
        lanes = sorted(set(self.lanes.values()))
        backlogs = read_lanes(self.r, lanes, now)
        beats = self.last_beats = read_heartbeats(self.r)
        counts = {backlog_field(b, lane): backlogs[lane][b].arrived_tokens
                  for lane in lanes for b in BUCKETS}  # fmt: skip
        arrivals = self.rates.bucket_rates(now, counts)
        for lane, by_bucket in backlogs.items():
            model = self.metric_models[lane]
            for b, bl in by_bucket.items():
                m.BACKLOG_TOKENS.labels(model, b).set(bl.tokens)
                m.QUEUE_JOBS.labels(model, b).set(bl.jobs)
                m.OLDEST_AGE.labels(model, b).set(bl.oldest_age_s)
        out = {}
        for name, pool in self.fleet.pools.items():
            lane = self.lanes[name]
            backlog = backlogs[lane]
            home = self.fleet.home_buckets(name)
            jobs = sum(backlog[b].jobs for b in home)
            tokens = sum(backlog[b].tokens for b in home)
            oldest = max((backlog[b].oldest_age_s for b in home if backlog[b].jobs), default=0.0)
            now_rate = sum(arrivals.get(backlog_field(b, lane), 0.0) for b in home)
            arrival = self.rates.update_arrival(name, now, now_rate)
            workers = self._worker_views(pool, beats)
            served = {
                w: (b.served_work_total, b.is_busy) for w, b in beats.items() if b.pool == name
            }
            learnt = self.rates.update_service(name, now, jobs > 0, served)
            # A configured rate wins: a bench run on the pool's hardware beats a measurement
            # from partly saturated workers; the learnt rate replaces only the generic guess.
            rate = pool.tokens_per_s or learnt or self.estimates[name]
            m.ARRIVAL_RATE.labels(name, self.metric_models[lane]).set(arrival)
            m.SERVICE_RATE.labels(name, self.metric_models[lane]).set(rate)
            deadlines = self._deadlines(lane, home, jobs)
            out[name] = PoolObservation(
                now, jobs, tokens, oldest, arrival, rate, workers, deadlines
            )
        return out

    def _deadlines(self, lane: str, home: list[str], jobs: int) -> list[tuple[float, int]] | None:
        """The pool's queued jobs that carry a deadline, by deadline (None: the wire cannot
        say, and the pool is sized by backlog and wait alone)."""
        if deadline_backlog is None:
            return None
        if not jobs:
            return []  # nothing queued: no round trip
        fields = [backlog_field(b, lane) for b in home]
        return merge_deadlines([deadline_backlog(self.r, f) for f in fields])

    def _worker_views(self, pool: PoolConfig, beats: dict[str, Heartbeat]) -> list[WorkerView]:
        views = []
        for w in self.actuator.list_workers(pool):
            beat = beats.get(w.worker_id)
            state = w.state
            if state != "draining" and beat is not None:
                state = "draining" if beat.draining else "ready"
            running = beat.held if beat else 0
            idle = beat.idle_since if beat else None
            views.append(WorkerView(w.worker_id, state, running, idle))
        by_state: dict[str, int] = {"starting": 0, "ready": 0, "draining": 0}
        for v in views:
            by_state[v.state] = by_state.get(v.state, 0) + 1
        for st, n in by_state.items():
            m.WORKERS.labels(pool.name, self.metric_models[self.lanes[pool.name]], st).set(n)
        return views

    # -- deciding and acting -----------------------------------------------------------

    def step(self) -> list[Decision]:
        observations = self.observe()
        decisions = []
        for name, pool in self.fleet.pools.items():
            obs = observations[name]
            self.actuator.publish(pool, obs.backlog_jobs, len(obs.workers))
            d = decide(pool, obs, self.states[name], self.fleet.controller)
            try:
                self._act(pool, d)
            except Exception:  # one pool's cloud error must not stop the others
                log.exception("pool %s: acting on %s failed; next poll retries", name, d.action)
            model = self.metric_models[self.lanes[name]]
            m.DESIRED.labels(name, model).set(d.desired)
            m.DECISIONS.labels(name, model, d.action).inc()
            level = logging.INFO if d.action != "hold" else logging.DEBUG
            log.log(
                level, "pool %s: %s %d -> %d (%s)", name, d.action, d.current, d.desired, d.reason
            )
            decisions.append(d)
        for pool in self.fleet.pools.values():
            try:
                for worker_id in self.actuator.remove_drained(pool):
                    log.info("pool %s: removed drained worker %s", pool.name, worker_id)
                    self._forget(worker_id)
            except Exception:
                log.exception("pool %s: removing drained workers failed", pool.name)
        self.last_decisions = decisions
        self._record(observations, decisions)
        return decisions

    def _record(self, observations: dict[str, PoolObservation], decisions: list[Decision]) -> None:
        """The decisions for the web console (infra/wire/fleet_status.py), in one pipeline."""
        now = self.clock()
        statuses = []
        for d in decisions:
            obs = observations[d.pool]
            by_state: dict[str, int] = {}
            for w in obs.workers:
                by_state[w.state] = by_state.get(w.state, 0) + 1
            statuses.append(fleet_status.PoolStatus(
                d.pool, d.action, d.current, d.desired, d.reason, now, by_state,
                obs.backlog_jobs, obs.arrival_tokens_per_s, obs.rate_per_worker,
            ))  # fmt: skip
        sample = fleet_status.FleetSample(
            t=now,
            workers=sum(len(o.workers) for o in observations.values()),
            desired=sum(d.desired for d in decisions),
            queued=sum(o.backlog_jobs for o in observations.values()),
            tokens_per_s=sum(b.tokens_per_s for b in self.last_beats.values()),
        )
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(Keys.controller, mapping={"last_decision_at": now})
        fleet_status.record(pipe, statuses, sample)
        pipe.execute()

    def _forget(self, worker_id: str) -> None:
        """A removed worker leaves no trace: its registration, heartbeat and drain flag
        (one killed with -9 could not delete them itself)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.zrem(Keys.workers, worker_id)
        pipe.delete(Keys.worker(worker_id), Keys.drain(worker_id))
        pipe.execute()

    def _act(self, pool: PoolConfig, d: Decision) -> None:
        if d.action == "scale_out":
            self.actuator.launch(pool, d.desired - d.current)
        for worker_id in d.drain:
            self.r.set(Keys.drain(worker_id), "1", ex=int(pool.drain_timeout_s) + 3600)
            self.actuator.drain(pool, worker_id)

    def run(
        self,
        stop: threading.Event,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        close: bool = True,
    ) -> None:
        """The loop: reaper thread, metrics endpoint, a decision every poll interval. With
        close, the actuator is closed (its workers drained) when the loop stops."""
        reaper = threading.Thread(target=run_reaper, args=(self.settings, stop), daemon=True)
        reaper.start()
        if metrics_port is not None:
            url = m.start_metrics_server(metrics_port, metrics_host)
            self.r.hset(Keys.controller, mapping={"metrics_url": url})
            log.info("controller metrics at %s", url)
        interval = self.fleet.controller.poll_interval_s
        while not stop.is_set():
            try:
                self.step()
            except redis.RedisError as e:
                log.warning("controller: Redis unavailable (%s); retrying", e)
            except Exception:  # one bad pass must not stop scaling
                log.exception("controller: decision pass failed; retrying")
            stop.wait(interval)
        if close:
            self.actuator.close()
