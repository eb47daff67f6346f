"""What a worker holds and what it has produced that Redis has not confirmed yet.

The engine's outputs are recorded here first, in memory (stream deltas, first-token
times, jobs that started computing, terminal results), then written to Redis in one
pipeline, in that order, with the queue acks last: a message is acked only after its
result is durable (or moot). While Redis is away, recording goes on and nothing is
written; when it is back, one flush writes everything the outage held up. A repeated
write is harmless: a finish from a holder that lost its lease is dropped by the job
store, and a start mark is set once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from infra.wire import queues
from infra.wire.jobstore import JobStore
from infra.wire.protocol import JobStatus, Keys
from worker.engine import RequestOutput

log = logging.getLogger(__name__)

FINISH_STATUS = {"stop": JobStatus.COMPLETED, "length": JobStatus.COMPLETED}


@dataclass
class HeldJob:
    job_id: str
    token: str
    tenant: str
    message: queues.Delivery
    has_webhook: bool
    streams: bool = True  # batch jobs publish no per-step deltas: nobody follows them live
    first_token_at: float | None = None
    started: bool = False  # the engine has computed some of it (marked in Redis once)
    completion_tokens: int = 0
    work: int = 0  # prompt + max tokens: what the queue counted as backlog


@dataclass
class Saved:
    """One terminal result the flush wrote (won: this worker still held the lease)."""

    held: HeldJob
    status: JobStatus
    won: bool


@dataclass
class PendingWrites:
    deltas: list[tuple[str, str, int]] = field(default_factory=list)  # job, text, tokens
    first_tokens: list[HeldJob] = field(default_factory=list)
    started: list[HeldJob] = field(default_factory=list)
    finished: list[tuple[HeldJob, JobStatus, dict[str, Any]]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.deltas or self.first_tokens or self.started or self.finished)

    def record(self, held: dict[str, HeldJob], outputs: list[RequestOutput]) -> None:
        """A step's outputs, for the jobs this worker holds."""
        now = time.time()
        for out in outputs:
            job = held.get(out.request_id)
            if job is None:
                continue
            job.completion_tokens += len(out.new_token_ids)
            if job.streams and (out.delta_text or out.new_token_ids):
                self.deltas.append((job.job_id, out.delta_text, len(out.new_token_ids)))
            if job.first_token_at is None and out.new_token_ids:
                job.first_token_at = now
                if job.streams and not out.finished:  # visible while it runs
                    self.first_tokens.append(job)
            if out.finished:
                self.finish(job, _status(out), out, out.error)

    def mark_started(self, job: HeldJob) -> None:
        if not job.started:
            job.started = True
            self.started.append(job)

    def finish(
        self,
        job: HeldJob,
        status: JobStatus,
        out: RequestOutput | None = None,
        error: str | None = None,
    ) -> None:
        fields: dict[str, Any] = {"finished_at": time.time()}
        if job.first_token_at is not None:
            fields["first_token_at"] = job.first_token_at
        if out is not None:
            fields |= {
                "text": out.text,
                "finish_reason": out.finish_reason,
                "completion_tokens": len(out.token_ids),
            }
        if error:
            fields["error"] = error
        self.finished.append((job, status, fields))

    def forget(self, job_id: str) -> None:
        """The lease moved on (reaped while Redis was away): nothing of it is written."""
        self.deltas = [d for d in self.deltas if d[0] != job_id]
        self.first_tokens = [j for j in self.first_tokens if j.job_id != job_id]
        self.started = [j for j in self.started if j.job_id != job_id]
        self.finished = [f for f in self.finished if f[0].job_id != job_id]

    def flush(self, store: JobStore, pipe: Any, events_ttl: int) -> list[Saved]:
        """Everything pending on one pipeline, executed; cleared only if it succeeded (a
        Redis error leaves it all pending for the next flush)."""
        for job_id, text, n in self.deltas:
            pipe.xadd(Keys.events(job_id), {"type": "delta", "text": text, "n": n})
        for job in self.first_tokens:
            store.update(job.job_id, job.token, client=pipe, first_token_at=job.first_token_at)
        for job in self.started:
            store.mark_started(job.job_id, job.token, client=pipe)
        results_at = len(pipe.command_stack)
        finished = list(self.finished)
        for job, status, fields in finished:
            store.finish(
                job.job_id, job.token, job.tenant, status,
                events_ttl=events_ttl, client=pipe, **fields,
            )  # fmt: skip
        for job, _, _ in finished:
            queues.Taker.ack(job.message, pipe)
        if not pipe.command_stack:
            return []
        results = pipe.execute()
        self.deltas, self.first_tokens, self.started, self.finished = [], [], [], []
        won = results[results_at : results_at + len(finished)]
        return [Saved(j, s, bool(w)) for (j, s, _), w in zip(finished, won, strict=True)]


def _status(out: RequestOutput) -> JobStatus:
    if out.finish_reason == "error":
        return JobStatus.FAILED
    if out.finish_reason == "abort":
        return JobStatus.CANCELLED
    return FINISH_STATUS[out.finish_reason or "stop"]
