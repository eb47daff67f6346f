"""The lease reaper: re-queues in-progress jobs whose worker stopped refreshing its lease.

A small loop; ``tide up`` runs it, and the controller hosts it. Each pass also puts back
stranded messages, expires queued jobs whose deadline or ttl passed, and forgets dead
worker ids; every ``batch_poll_interval`` it runs the
batch supervisor (``infra.batches.supervise.supervise_batches``). After a Redis outage it reaps no
lease for a while (``OutageGrace``): a worker alive behind the outage could not refresh
its leases, and gets the time to do so once Redis is back.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

import redis

from tide_fleet.infra.batches.supervise import supervise_batches
from tide_fleet.infra.jobs.webhooks import enqueue_webhook
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.protocol import Keys

log = logging.getLogger(__name__)


STRANDED_SECONDS = 10.0  # a message taken but not started for this long goes back
# A worker id whose heartbeat hash expired and whose last beat is older than this is dead.
DEAD_WORKER_SECONDS = 60.0
# Beyond one lease: a reconnecting worker's back-off (0.5 s) and refresh period (0.5 s),
# and one reaper interval, with room to spare.
OUTAGE_MARGIN_SECONDS = 2.0

# KEYS: the workers zset, the worker's heartbeat hash, its drain flag. ARGV: id, cutoff.
_FORGET_WORKER = """
local beat = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not beat or tonumber(beat) > tonumber(ARGV[2]) then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[3])
return 1
"""


class OutageGrace:
    """When leases may be reaped: once Redis has been reachable, both from this reaper
    (since its last Redis error, or its start) and since Redis' own restart, for a lease
    plus a margin. Until then an expired lease may belong to a live worker that could not
    refresh it."""

    def __init__(
        self,
        lease_seconds: float,
        margin: float = OUTAGE_MARGIN_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settle_seconds = lease_seconds + margin
        self.clock = clock
        self._reachable_since = clock()

    def note_error(self) -> None:
        self._reachable_since = self.clock()

    def remaining(self, redis_uptime: float) -> float:
        """Seconds until leases may be reaped; 0: now."""
        reachable = min(self.clock() - self._reachable_since, redis_uptime)
        return max(0.0, self.settle_seconds - reachable)


class Reaper:
    """One reaper's state across passes: its Redis client, the job store, the grace."""

    def __init__(
        self, client: redis.Redis, settings: Settings, grace: OutageGrace | None = None
    ) -> None:
        self.r = client
        self.store = JobStore(client)
        self.settings = settings
        self.grace = grace or OutageGrace(settings.lease_seconds)
        self._forget_worker = client.register_script(_FORGET_WORKER)
        self._holding = False

    def reap_once(self) -> dict[str, str]:
        """One pass: job id -> outcome for each expired lease (nothing while the grace
        holds). A Redis error is raised, and starts the grace again."""
        try:
            return self._pass()
        except redis.RedisError:
            self.grace.note_error()
            raise

    def _pass(self) -> dict[str, str]:
        store, settings = self.store, self.settings
        for job_id in store.prune_backlog(settings.job_ttl_seconds):
            log.warning("queued job %s expired before it ran: dropped from the backlog", job_id)
        for job_id in store.restore_stranded(STRANDED_SECONDS):
            log.warning("message of %s was taken but never started: back in its queue", job_id)
        for job_id in store.expire_due(events_ttl=settings.events_ttl_seconds):
            log.info("queued job %s expired: its deadline or ttl passed before it started", job_id)
        wait = self.grace.remaining(self._redis_uptime())
        if wait > 0:
            if not self._holding:
                log.warning("Redis was unreachable or restarted: no lease reaped for %.1f s", wait)
            self._holding = True
            return {}
        self._holding = False
        for worker_id in self.prune_workers():
            log.info("forgot dead worker %s", worker_id)
        results = store.reap(settings.max_attempts, events_ttl=settings.events_ttl_seconds)
        for job_id, outcome in results.items():
            if outcome in ("requeued", "failed", "cancelled"):
                log.warning("lease expired on %s: %s", job_id, outcome)
            if outcome == "failed":
                record = store.get(job_id) or {}
                if record.get("webhook_url"):
                    enqueue_webhook(job_id, "failed")
        return results

    def _redis_uptime(self) -> float:
        """Seconds Redis has surely been up: its integer uptime can be up to 1 s ahead."""
        try:
            return float(self.r.info("server").get("uptime_in_seconds", math.inf)) - 1
        except redis.ResponseError:  # INFO disabled by the provider: only our own errors count
            return math.inf

    def prune_workers(self, now: float | None = None) -> list[str]:
        """Drop ids from the workers zset whose heartbeat hash expired and whose last beat
        is older than DEAD_WORKER_SECONDS, with their drain flags."""
        now = time.time() if now is None else now
        cutoff = now - DEAD_WORKER_SECONDS
        forgotten = []
        for raw in self.r.zrangebyscore(Keys.workers, "-inf", cutoff):
            worker_id = raw.decode()
            keys = [Keys.workers, Keys.worker(worker_id), Keys.drain(worker_id)]
            if self._forget_worker(keys=keys, args=[worker_id, cutoff]):
                forgotten.append(worker_id)
        return forgotten


def run_reaper(settings: Settings, stop: threading.Event) -> None:
    assert settings.redis_url, "the reaper needs REDIS_URL"
    reaper = Reaper(redis.Redis.from_url(settings.redis_url), settings)
    next_batches = 0.0
    while not stop.wait(settings.reaper_interval):
        try:
            reaper.reap_once()
            if time.monotonic() >= next_batches:
                next_batches = time.monotonic() + settings.batch_poll_interval
                supervise_batches()
        except redis.RedisError as e:
            reaper.grace.note_error()
            log.warning("reaper: Redis unavailable (%s); retrying", e)
        except Exception:  # the loop must outlive any one bad record
            log.exception("reaper: pass failed; retrying")
