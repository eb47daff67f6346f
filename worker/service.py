"""The worker process: pull jobs from Redis into the engine, step it, write results.

A consumer loop with a stop flag. It takes messages only for free sequence slots (several
in one round trip, ``infra.wire.queues.Taker``: kombu's Redis format, without kombu's per-call
cost) and admits each only when ``engine.can_admit`` says it fits; at most one message
waits prefetched, the rest go back to the front of their queues. Work it cannot start
stays in Redis, visible to other workers and the controller.

A Redis outage is weather, not death (``worker.outage``): the worker never exits on a
connection error. While Redis is away it takes nothing new, keeps generating what it
holds and records the outputs (``worker.results``); when Redis is back it refreshes its
leases first (a job reaped meanwhile is dropped here), then writes what the outage held
up. That includes start-up: a worker whose Redis is not there yet waits for it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import time
from typing import Any

import redis

from infra.jobs.webhooks import enqueue_webhook
from infra.settings import Settings
from infra.wire import queues
from infra.wire.heartbeats import Heartbeat
from infra.wire.jobstore import JobStore
from infra.wire.protocol import JobMessage, JobStatus, Keys, Priority, consume_order
from worker.engine import LLMEngine, SamplingParams
from worker.engine import Priority as EnginePriority
from worker.metrics import WorkerMetrics
from worker.outage import Outage
from worker.results import HeldJob, PendingWrites, Saved

log = logging.getLogger(__name__)

LEASE_REFRESH_SECONDS = 0.5  # also how fast a cancel reaches a running job
BATCH_EVERY = 8  # at most this many interactive jobs taken in a row while batch work waits
IDLE_WAIT_SECONDS = 0.02  # the longest an idle worker waits for a wake-up per loop turn
# After a poll finds every queue empty, the next poll waits for a wake-up (every enqueue
# and re-queue publishes one) or this long, so a busy engine does not spend each step
# polling six empty queues.
EMPTY_RECHECK_SECONDS = 0.25
TAKE_AT_MOST = 16  # messages taken per round trip (never more than free slots)
OFFLINE_IDLE_SECONDS = 0.05  # an idle worker's sleep per turn while Redis is away
# The wire's priority classes and the engine's (which knows nothing of the wire), one table.
ENGINE_PRIORITY = {
    Priority.INTERACTIVE: EnginePriority.INTERACTIVE,
    Priority.BATCH: EnginePriority.BATCH,
}


class WorkerService:
    def __init__(
        self,
        engine: LLMEngine,
        settings: Settings,
        pool: str,
        buckets: list[str],
        worker_id: str | None = None,
    ) -> None:
        assert settings.redis_url, "the worker needs REDIS_URL"
        self.engine = engine
        self.settings = settings
        self.pool = pool
        self.buckets = buckets
        self.worker_id = worker_id or f"{pool}-{socket.gethostname()}-{os.getpid()}"
        # Nothing here connects: a worker may start before its Redis does.
        self.redis = redis.Redis.from_url(settings.redis_url)
        self.store = JobStore(self.redis)
        self.taker = queues.Taker(self.redis)
        self.queue_names = consume_order(buckets)
        self.held: dict[str, HeldJob] = {}
        self.prefetched: tuple[queues.Delivery, JobMessage] | None = None
        self.draining = False
        self.stopped = False
        self._drain_deadline = float("inf")
        self._next_refresh = 0.0
        self._next_heartbeat = 0.0
        self._last_tokens = (time.monotonic(), 0)
        self.wakeups: redis.client.PubSub | None = None
        self.outage = Outage(self.worker_id)  # starts "down": the first turn connects
        self._interactive_streak = 0
        self._queues_empty_at: float | None = None  # when a poll last found nothing
        self.pending = PendingWrites()  # outputs Redis has not confirmed yet
        self._webhooks: list[tuple[str, str]] = []  # (job id, status) not enqueued yet
        self.metrics = WorkerMetrics.for_engine(engine, pool, settings)
        self.metrics_url = ""  # set when the metrics endpoint starts (run)
        self._served_work = 0  # prompt + max tokens of jobs finished, for the controller
        self._idle_since: float | None = time.time()

    # -- lifecycle -----------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.drain())
        signal.signal(signal.SIGINT, lambda *_: self.drain())

    def drain(self) -> None:
        """Stop taking jobs; finish in-flight work within the drain timeout."""
        if not self.draining:
            log.info("worker %s draining (%d jobs held)", self.worker_id, len(self.held))
            self.draining = True
            self._drain_deadline = time.monotonic() + self.settings.drain_timeout

    def run(self) -> None:
        log.info("worker %s serving %s", self.worker_id, ", ".join(self.queue_names))
        if self.settings.worker_metrics_port >= 0:
            host, port = self.settings.worker_metrics_host, self.settings.worker_metrics_port
            self.metrics_url = self.metrics.serve(host, port)
        try:
            while not self.stopped:
                if self.outage.waiting():
                    if not self._offline_turn():
                        break
                    continue
                try:
                    if self.outage.is_down:
                        self._come_back()
                    if not self._iterate():
                        break
                except (redis.RedisError, OSError) as e:
                    self.outage.failed(e, held=len(self.held))
        finally:
            self._shutdown()

    def _iterate(self) -> bool:
        """One turn of the loop; False when a drain has finished."""
        if self.pending or self._webhooks:
            self._save()  # a Redis error interrupted the last write
        self._periodic()
        if self.draining:
            self._release_prefetched()
            if not self.held or time.monotonic() > self._drain_deadline:
                return False
        else:
            self._fill()
        if self.engine.has_unfinished():
            self._step()
            self._save()
        else:
            # Idle: sleep until the gateway announces a new job (or 20 ms pass).
            assert self.wakeups is not None
            if self.wakeups.get_message(timeout=IDLE_WAIT_SECONDS) is not None:
                self._queues_empty_at = None
        return True

    def _offline_turn(self) -> bool:
        """A turn while Redis is away: generate what is held, write nothing; False when a
        drain has run out of time (what is still unsaved then expires with its lease)."""
        if self.draining and (not self.held or time.monotonic() > self._drain_deadline):
            return False
        if self.engine.has_unfinished():
            self._step()
        else:
            time.sleep(min(OFFLINE_IDLE_SECONDS, self.outage.until_retry()))
        return True

    def _step(self) -> None:
        outputs = self.engine.step()
        self.pending.record(self.held, outputs)
        for job_id, job in self.held.items():  # computed on at least once: charged if lost
            request = self.engine.requests.get(job_id)
            if not job.started and (request is None or request.num_computed_tokens > 0):
                self.pending.mark_started(job)

    def _come_back(self) -> None:
        """Redis answers again: subscribe, refresh leases before anything else, then write
        what was held up (all of which raises, and retries later, if it is still away)."""
        self.redis.ping()
        with contextlib.suppress(Exception):  # the old connection is already broken
            if self.wakeups is not None:
                self.wakeups.close()
        self.wakeups = self.redis.pubsub(ignore_subscribe_messages=True)
        self.wakeups.subscribe(Keys.wakeup)
        self._queues_empty_at = None
        self._next_refresh = self._next_heartbeat = 0.0
        self._periodic()  # leases first: the reaper gives them a grace after an outage
        self._save()
        self.outage.recovered(held=len(self.held))

    def _shutdown(self) -> None:
        try:
            if self.pending or self._webhooks:
                self._save()
            self._release_prefetched()
            for job in list(self.held.values()):
                self.engine.abort(job.job_id)
                if self.store.requeue(job.job_id, job.token):
                    log.info("re-queued %s at shutdown", job.job_id)
                self.taker.ack_now(job.message)
            self.redis.zrem(Keys.workers, self.worker_id)
            self.redis.delete(Keys.worker(self.worker_id), Keys.drain(self.worker_id))
        except (redis.RedisError, OSError) as e:
            # Held jobs keep their leases; the reaper re-queues them when they expire.
            log.warning("Redis unavailable at shutdown (%s); leases will expire instead", e)
        self.held.clear()
        self.metrics.close()

    # -- taking work -------------------------------------------------------------------

    def _poll(self, limit: int) -> list[tuple[queues.Delivery, JobMessage]]:
        """Take up to `limit` messages in one round trip, in consume order."""
        # Interactive before batch, but batch work ages: after BATCH_EVERY interactive
        # takes in a row, batch queues go first once, so they are never starved.
        order = self.queue_names
        aged = self._interactive_streak >= BATCH_EVERY
        if aged:
            order = sorted(order, key=lambda q: not q.endswith(".batch"))
            limit = 1
        else:  # never take past the point where batch work is due
            limit = min(limit, BATCH_EVERY - self._interactive_streak)
        taken = []
        for d in self.taker.take(order, limit):
            is_batch = d.queue.endswith(".batch")
            reset = is_batch or aged  # aged: batch work had its turn (or there was none)
            self._interactive_streak = 0 if reset else self._interactive_streak + 1
            try:
                taken.append((d, d.job()))
            except (ValueError, TypeError, KeyError) as e:
                log.error("dropping undecodable message on %s: %s", d.queue, e)
                self.taker.ack_now(d)
        return taken

    def _fill(self) -> None:
        """Start queued jobs while the engine has free slots and can admit them. Takes as
        many messages as there are free slots; the first that does not fit waits
        (prefetched, at most one), the rest go back to the front of their queues."""
        max_seqs = self.engine.config.max_num_seqs
        while True:
            if self.prefetched is None:
                free = max_seqs - self.engine.scheduler.num_unfinished
                if free <= 0 or not self._worth_polling():
                    return
                taken = self._poll(min(free, TAKE_AT_MOST))
                if not taken:
                    self._queues_empty_at = time.monotonic()
                    return
                self._queues_empty_at = None
            else:
                taken = [self.prefetched]
                self.prefetched = None
            for i, (message, job) in enumerate(taken):
                if not self.engine.can_admit(job.prompt_tokens, job.max_tokens):
                    self.prefetched = (message, job)
                    self.taker.give_back([d for d, _ in taken[i + 1 :]])
                    return
                self._start(message, job)

    def _worth_polling(self) -> bool:
        """Poll again only after a wake-up, or EMPTY_RECHECK_SECONDS after an empty poll."""
        if self._queues_empty_at is None:
            return True
        woken = False
        while self.wakeups.get_message(timeout=0) is not None:  # drain pending wake-ups
            woken = True
        if woken or time.monotonic() - self._queues_empty_at >= EMPTY_RECHECK_SECONDS:
            self._queues_empty_at = None
            return True
        return False

    def _release_prefetched(self) -> None:
        if self.prefetched is None:
            return
        message, _job = self.prefetched
        self.prefetched = None
        self.taker.give_back([message])  # back to the front of its queue

    def _start(self, message: queues.Delivery, job: JobMessage) -> None:
        lease = self.settings.lease_seconds
        status, token, record = self.store.acquire(job.job_id, self.worker_id, lease)
        if status != "acquired":
            log.info("skipping %s: %s", job.job_id, status)  # cancelled or a duplicate
            self.taker.ack_now(message)
            return
        held = HeldJob(
            job.job_id, token, record.get("tenant", ""), message, bool(record.get("webhook_url")),
            streams=record.get("priority") != Priority.BATCH,
        )  # fmt: skip
        held.work = job.prompt_tokens + job.max_tokens
        self.held[job.job_id] = held
        self._idle_since = None
        try:
            params = SamplingParams(**_sampling(record))
            prio = ENGINE_PRIORITY[Priority(record.get("priority") or Priority.INTERACTIVE)]
            self.engine.add_request(job.job_id, _ids(record), params, prio)
            self.metrics.track(job.job_id, float(record.get("created_at") or 0))
        except (ValueError, TypeError, KeyError) as e:
            self.pending.finish(held, JobStatus.FAILED, error=f"rejected by the worker: {e}")
            self._save()

    # -- results -----------------------------------------------------------------------

    def _save(self) -> None:
        """Write what is pending (one pipeline), then let go of the jobs it finished; a
        job leaves `held` (its lease stops being refreshed) only once that succeeded."""
        if self.pending:
            saved = self.pending.flush(
                self.store, self.redis.pipeline(transaction=False),
                self.settings.events_ttl_seconds,
            )  # fmt: skip
            self._settle(saved)
        self._send_webhooks()

    def _settle(self, saved: list[Saved]) -> None:
        for s in saved:
            self.held.pop(s.held.job_id, None)
            self._served_work += s.held.work
            if not s.won:
                log.warning("dropping result of %s: the lease moved on", s.held.job_id)
            elif s.held.has_webhook and s.status in (JobStatus.COMPLETED, JobStatus.FAILED):
                self._webhooks.append((s.held.job_id, s.status.value))
        if saved and not self.held:
            self._idle_since = time.time()

    def _send_webhooks(self) -> None:
        while self._webhooks:
            job_id, status = self._webhooks[0]
            enqueue_webhook(job_id, status)  # raises while the broker is away: kept
            self._webhooks.pop(0)

    # -- leases, cancellation, heartbeat ----------------------------------------------------

    def _periodic(self) -> None:
        now = time.monotonic()
        if now >= self._next_refresh:
            self._next_refresh = now + LEASE_REFRESH_SECONDS
            if self.held:
                leases = {j: h.token for j, h in self.held.items()}
                for job_id, state in self.store.refresh(
                    leases, self.settings.lease_seconds
                ).items():
                    if state == "lost":  # reaped: another worker owns it now
                        log.warning("lost the lease on %s; dropping it here", job_id)
                        self.engine.abort(job_id)
                        self.pending.forget(job_id)
                        held = self.held.pop(job_id)
                        self.taker.ack_now(held.message)
                    elif state == "1":
                        self.engine.abort(job_id)  # finishes as cancelled next step
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.settings.worker_heartbeat_seconds
            self._heartbeat(now)

    def _heartbeat(self, now: float) -> None:
        stats = self.engine.stats()
        self.metrics.sync(stats)
        then, tokens = self._last_tokens
        produced = stats["generation_tokens"] - tokens
        rate = produced / (now - then) if now > then else 0.0
        self._last_tokens = (now, stats["generation_tokens"])
        beat = Heartbeat(
            worker_id=self.worker_id,
            pool=self.pool,
            buckets=tuple(self.buckets),
            pid=os.getpid(),
            host=socket.gethostname(),
            running=stats["num_running"],
            waiting=stats["num_waiting"],
            held=len(self.held),
            free_slots=self.engine.config.max_num_seqs - len(self.held),
            kv_cache_usage=round(stats["kv_cache_usage"], 4),
            tokens_per_s=round(rate, 2),
            draining=self.draining,
            served_work_total=self._served_work,
            idle_since=self._idle_since,
            instance_id=self.settings.instance_id,
            metrics_url=self.metrics_url,
            at=time.time(),
        )
        ttl = max(int(3 * self.settings.worker_heartbeat_seconds), 2)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(Keys.worker(self.worker_id), mapping=beat.to_hash())
        pipe.expire(Keys.worker(self.worker_id), ttl)
        pipe.zadd(Keys.workers, {self.worker_id: time.time()})
        pipe.exists(Keys.drain(self.worker_id))
        if pipe.execute()[-1] and not self.draining:
            log.info("worker %s: drain requested by the controller", self.worker_id)
            self.drain()


def _sampling(record: dict[str, str]) -> dict[str, Any]:
    return dict(json.loads(record["sampling"]))


def _ids(record: dict[str, str]) -> list[int]:
    return list(json.loads(record["token_ids"]))
