"""Writing a worker's results to Redis on one background thread, off the engine's step.

The main loop records outputs in ``PendingWrites`` (``tide_fleet.worker.results``) and, once a turn,
calls ``write``: a flush that has ended is settled, then what is pending is taken out whole
and written as one pipeline on the writer's thread while the engine goes on stepping. At
most one flush is in flight and what is recorded meanwhile waits for the next, so a job's
writes reach Redis in the order they were recorded: its deltas, its final state, its ack.

Settling stays on the main thread, which owns ``held``: a job leaves it (its lease stops
being refreshed) only once its final write succeeded. (Its webhook is scheduled by that
write itself, in the same pipeline, not at the settle: a worker killed in between would
leave it unsent for good.) A Redis error of a flush is raised on the main thread, as an
outage (``tide_fleet.worker.outage``), after its batch was put back in front of what came since:
nothing is lost, and the same writes go out again once Redis is back. Between a final
write and its settling the job's lease reads as lost (the write cleared it):
``is_finishing`` tells the refresh to wait. ``write_all`` waits for the flush in flight,
then writes the rest and waits for that too (Redis back, shutdown).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor

import redis

from tide_fleet.infra.jobs.webhook_store import SCHEDULE_IF_FINISHED
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.worker.held import Held
from tide_fleet.worker.results import PendingWrites, Saved

log = logging.getLogger("tide_fleet.worker.service")


class ResultWriter:
    def __init__(
        self,
        client: redis.Redis,
        store: JobStore,
        held: Held,
        pending: PendingWrites,
        events_ttl: int,
        inline: bool = False,
    ) -> None:
        """`inline`: flush on the caller's thread, as a serial loop does (a benchmark's
        baseline); the order of writes and settling is the same either way."""
        self.redis, self.store, self.held, self.pending = client, store, held, pending
        self.events_ttl = events_ttl
        self.inline = inline
        self.served_work = 0  # prompt + n x max tokens of the jobs settled, for the controller
        self.num_flushes = 0  # started, for tests and logs
        self._webhook = client.register_script(SCHEDULE_IF_FINISHED)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tide-writer")
        self._flush: Future[list[Saved]] | None = None
        self._batch: PendingWrites | None = None  # what the flush in flight writes
        self._finishing: set[str] = set()  # jobs whose final write is in flight

    @property
    def is_busy(self) -> bool:
        return self._flush is not None and not self._flush.done()

    def is_finishing(self, job_id: str) -> bool:
        return job_id in self._finishing

    def write(self) -> bool:
        """Settle the flush that ended, start the next; True if it let go of a job. Raises
        the flush's Redis error once its batch is pending again."""
        settled = self._settle(wait=False)
        if self._flush is None and self.pending:
            self._start()
            settled = self._settle(wait=False) or settled  # done already when inline
        return settled

    def write_all(self) -> bool:
        """Wait for the flush in flight, then write everything pending and wait for that."""
        settled = False
        try:
            settled = self._settle(wait=True)
        except (redis.RedisError, OSError) as e:  # from before: its batch goes out below
            log.info("an earlier write failed (%s); writing it again", e)
        if self.pending:
            self._start()
            settled = self._settle(wait=True) or settled
        return settled

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _start(self) -> None:
        batch = self.pending.take()
        self._batch, self._finishing = batch, {job.job_id for job, _, _ in batch.finished}
        self.num_flushes += 1
        if not self.inline:
            self._flush = self._pool.submit(self._execute, batch)
            return
        self._flush = Future()
        try:
            self._flush.set_result(self._execute(batch))
        except Exception as e:
            self._flush.set_exception(e)

    def _execute(self, batch: PendingWrites) -> list[Saved]:
        # On the writer's thread: a pipeline is not thread-safe, the client's pool is.
        pipe = self.redis.pipeline(transaction=False)
        return batch.flush(self.store, pipe, self.events_ttl, self._webhook)

    def _settle(self, wait: bool) -> bool:
        flush, batch = self._flush, self._batch
        if flush is None or batch is None or not (wait or flush.done()):
            return False
        self._flush, self._batch, self._finishing = None, None, set()
        try:
            saved = flush.result()
        except BaseException:
            self.pending.restore(batch, self.held)
            raise
        for s in saved:
            if self.held.pop(s.held.job_id) is None:
                continue
            self.served_work += s.held.work
            if not s.won:
                log.warning("dropping result of %s: the lease moved on", s.held.job_id)
        return bool(saved)
