"""The worker process: pull jobs from Redis into the engine, step it, write results.

A consumer loop with a stop flag. It takes messages only for free sequence slots
(``tide_fleet.worker.intake``) and admits each only when ``engine.can_admit`` says it fits; work it
cannot start stays in Redis, visible to other workers and the controller. A job runs as
its n choices (``tide_fleet.worker.choices``), one engine request each, and is held (one lease)
until all have ended (``tide_fleet.worker.held``). A job on a LoRA adapter has it loaded
first (``tide_fleet.worker.adapters``), and fails alone when it cannot be.

A Redis outage is weather, not death (``tide_fleet.worker.outage``): the worker never exits on a
connection error. While Redis is away it takes nothing new, keeps generating what it
holds and records the outputs (``tide_fleet.worker.results``); when Redis is back it refreshes its
leases first (a job reaped meanwhile is dropped here), then writes what the outage held
up. That includes start-up: a worker whose Redis is not there yet waits for it. Results
are written on a writer thread while the engine goes on stepping (``tide_fleet.worker.writer``).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time

import redis

from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.models import catalog
from tide_fleet.infra.wire.protocol import JobMessage, Keys, Priority, consume_order
from tide_fleet.worker.adapters import AdapterRefused, WorkerAdapters
from tide_fleet.worker.boot import Boot
from tide_fleet.worker.choices import ChoiceRunner, JobSpec, request_id
from tide_fleet.worker.engine import LLMEngine
from tide_fleet.worker.heartbeat import HeartbeatWriter
from tide_fleet.worker.held import Choice, Held, HeldJob
from tide_fleet.worker.intake import Intake
from tide_fleet.worker.logprobs import LogprobEntries
from tide_fleet.worker.metrics import WorkerMetrics
from tide_fleet.worker.outage import Outage
from tide_fleet.worker.results import PendingWrites
from tide_fleet.worker.resume import may_have_output, resume
from tide_fleet.worker.writer import ResultWriter

log = logging.getLogger(__name__)

LEASE_REFRESH_SECONDS = 0.5  # also how fast a cancel reaches a running job
IDLE_WAIT_SECONDS = 0.02  # the longest an idle worker waits for a wake-up per loop turn
OFFLINE_IDLE_SECONDS = 0.05  # an idle worker's sleep per turn while Redis is away


class WorkerService:
    def __init__(
        self,
        engine: LLMEngine,
        settings: Settings,
        pool: str,
        buckets: list[str],
        worker_id: str | None = None,
        model: str = "",
        lane: str = "",
        write_inline: bool = False,
    ) -> None:
        """`model`: the served name it runs (in its heartbeat); `lane`: that model's part of
        the queue names ('' for the fleet's default model, infra/wire/models.py);
        `write_inline`: write results between steps, not beside them (a benchmark's baseline)."""
        assert settings.redis_url, "the worker needs REDIS_URL"
        self.engine = engine
        self.boot = Boot()
        self.settings = settings
        self.pool = pool
        self.buckets = buckets
        self.worker_id = worker_id or f"{pool}-{socket.gethostname()}-{os.getpid()}"
        # Nothing here connects: a worker may start before its Redis does.
        self.redis = redis.Redis.from_url(settings.redis_url)
        self.store = JobStore(self.redis)
        self.taker = queues.Taker(self.redis)
        self.model = model
        self.queue_names = consume_order(buckets, lane)
        self.intake = Intake(self.taker, self.queue_names)
        self.held = Held()
        self.draining = False
        self.stopped = False
        self._drain_deadline = float("inf")
        self._next_refresh = 0.0
        self._next_heartbeat = 0.0
        self.beats = HeartbeatWriter(self.redis, settings, self.worker_id, pool, buckets, model)
        self.outage = Outage(self.worker_id)  # starts "down": the first turn connects
        # outputs Redis has not confirmed yet
        self.pending = PendingWrites(LogprobEntries(engine.tokenizer))
        self.writer = ResultWriter(self.redis, self.store, self.held, self.pending,
                                   settings.events_ttl_seconds, inline=write_inline)  # fmt: skip
        self.metrics = WorkerMetrics.for_engine(engine, pool, settings, served=model)
        self.choices = ChoiceRunner(
            engine, lambda job, rid: self.metrics.track(rid, job.created_at, job.lora)
        )
        self.adapters = WorkerAdapters(engine, self.redis, catalog(settings), model)
        self.metrics_url = ""  # set when the metrics endpoint starts (run)
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
        cold = self.boot.ready()
        self.metrics.cold_start.set(cold)
        log.info("worker %s serving %s (cold start %.2f s)", self.worker_id,
                 ", ".join(self.queue_names), cold)  # fmt: skip
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
        self._periodic()
        if self.draining:
            self.intake.release()
            if not self.held or time.monotonic() > self._drain_deadline:
                return False
        else:
            self._fill()
        if self.engine.has_unfinished():
            self._step()
        else:
            self.intake.wait_idle(IDLE_WAIT_SECONDS)  # until a new job is announced
        self._write()
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
        for job in self.choices.after_step(self.held):
            self.pending.finish_if_done(job)
        for job in self.held.values():  # computed on at least once: charged if lost
            if not job.started and self.choices.computed(job):
                self.pending.mark_started(job)

    def _come_back(self) -> None:
        """Redis answers again: subscribe, refresh leases before anything else, then write
        what was held up (all of which raises, and retries later, if it is still away)."""
        self.redis.ping()
        self.intake.subscribe(self.redis)
        self._next_refresh = self._next_heartbeat = 0.0
        self._periodic()  # leases first: the reaper gives them a grace after an outage
        self._write(everything=True)
        self.outage.recovered(held=len(self.held))

    def _shutdown(self) -> None:
        try:
            self._write(everything=True)  # after the flush in flight, what is left
            self.intake.release()
            for job in self.held.values():
                self.choices.abort(job)
                if self.store.requeue(job.job_id, job.token):
                    log.info("re-queued %s at shutdown", job.job_id)
                self.taker.ack_now(job.message)
            self.redis.zrem(Keys.workers, self.worker_id)
            self.redis.delete(Keys.worker(self.worker_id), Keys.drain(self.worker_id))
        except (redis.RedisError, OSError) as e:
            # Held jobs keep their leases; the reaper re-queues them when they expire.
            log.warning("Redis unavailable at shutdown (%s); leases will expire instead", e)
        self.held.clear()
        self.writer.close()
        self.metrics.close()

    # -- taking work -------------------------------------------------------------------

    def _fill(self) -> None:
        """Start queued jobs while the engine has free slots and can admit them (the
        first that does not fit waits in the intake)."""
        while True:
            # Free slots, or the fair share a new job would get from jobs running past
            # theirs (worker/engine/fair_share.py); less the choices already promised.
            # The take prefers jobs on the adapters the engine holds (queues.ADAPTER_WINDOW).
            room = self.engine.room() - self.choices.num_waiting
            taken = self.intake.next(room, self.adapters.held())
            if not taken:
                return
            for i, (message, job) in enumerate(taken):
                try:
                    fits = self.adapters.admits(job.prompt_tokens, job.max_tokens, message.lora)
                except AdapterRefused as e:
                    self._start(message, job, refused=str(e))
                    continue
                if not fits:
                    self.intake.hold(taken, i)
                    return
                self._start(message, job)

    def _start(self, message: queues.Delivery, job: JobMessage, refused: str = "") -> None:
        """Acquire the job and start its choices (`refused`: fail it, saying why)."""
        lease = self.settings.lease_seconds
        status, token, record = self.store.acquire(
            job.job_id, self.worker_id, lease, self.settings.events_ttl_seconds
        )
        if status != "acquired":  # cancelled, a duplicate, or expired just now
            log.info("skipping %s: %s", job.job_id, status)
            self.taker.ack_now(message)
            return
        held = HeldJob(
            job.job_id, token, record.get("tenant", ""), message, bool(record.get("webhook_url")),
            streams=record.get("priority") != Priority.BATCH,
            created_at=float(record.get("created_at") or 0),
        )  # fmt: skip
        held.work = job.prompt_tokens + job.max_tokens
        held.cold_start_s = self.boot.waited_for(held.created_at)
        self._idle_since = None
        try:
            if refused:
                raise ValueError(refused)
            spec = JobSpec.from_record(record)
            n, params = spec.n, spec.params
            held.work = job.prompt_tokens + n * params.max_tokens  # what the n choices may use
            held.logprobs = params.logprobs is not None
            held.choices = [Choice(i, request_id(job.job_id, i, n)) for i in range(n)]
            if held.streams and may_have_output(record):
                resume(self.redis, held, record)
            self.held.add(held)
            self.choices.start(held, spec)
        except (ValueError, TypeError, KeyError) as e:
            self.held.add(held)
            self.pending.reject(held, f"rejected by the worker: {e}")

    # -- results -----------------------------------------------------------------------

    def _write(self, everything: bool = False) -> None:
        """Settle what the writer wrote and hand it what is pending (``everything``: wait
        until all of it is written)."""
        let_go = self.writer.write_all() if everything else self.writer.write()
        if let_go and not self.held:
            self._idle_since = time.time()

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
                    job = self.held[job_id]
                    if self.writer.is_finishing(job_id):
                        continue  # its final write, in flight, cleared the lease
                    if state == "lost":  # reaped: another worker owns it now
                        log.warning("lost the lease on %s; dropping it here", job_id)
                        self.choices.abort(job)
                        self.pending.forget(job_id)
                        self.held.pop(job_id)
                        self.taker.ack_now(job.message)
                    elif state == "1":  # every choice finishes as cancelled next step
                        self.choices.abort(job)
                        self.pending.finish_if_done(job)
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.settings.worker_heartbeat_seconds
            self._heartbeat()

    def _heartbeat(self) -> None:
        self.adapters.sweep()
        stats = self.engine.stats()
        self.metrics.sync(stats)
        max_seqs = self.engine.config.max_num_seqs
        drain = self.beats.write(
            stats, held=len(self.held), draining=self.draining,
            free_slots=max(0, max_seqs - self.held.num_sequences),
            served_work=self.writer.served_work, idle_since=self._idle_since,
            metrics_url=self.metrics_url, cold_start_s=self.boot.seconds,
        )  # fmt: skip
        if drain and not self.draining:
            log.info("worker %s: drain requested by the controller", self.worker_id)
            self.drain()
