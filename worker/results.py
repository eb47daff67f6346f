"""What a worker has produced that Redis has not confirmed yet.

The engine's outputs are recorded here first, in memory (stream deltas, first-token
times, jobs that started computing, terminal results), then written to Redis in one
pipeline, in that order, with the queue acks last: a message is acked only after its
result is durable (or moot). A job's webhook is scheduled in the same pipeline as its
result, and only if that result won (``SCHEDULE_IF_FINISHED`` in
``infra/jobs/webhook_store.py``). A flush writes a batch taken out whole (``take``), on
the writer's thread (``tide_fleet.worker.writer``) while recording goes on here; a batch that
failed is put back in front of what was recorded since (``restore``), so the next flush
writes both in the order they were recorded. While Redis is away, recording goes on and
nothing is written; when it is back, one flush writes everything the outage held up. A
repeated write is harmless: a finish from a holder that lost its lease is dropped by the
job store, a start mark is set once, and a webhook already scheduled is left as it is.

Outputs are per choice (``tide_fleet.worker.held``); a job's result is recorded once, when its last
choice ends. A delta names its choice (``i``), carries its token ids (``t``, comma-separated:
what a resumed attempt continues from, ``tide_fleet.worker.resume``) and, when the job asked for
logprobs, their entries (``lp``, JSON). It is written only while this worker holds the
job's lease. Each flush also adds the tokens it carries to the fleet's
``Keys.generated_tokens``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from tide_fleet.infra.jobs.webhooks import event_id
from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.codec import encode_value
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.protocol import JobStatus, Keys
from tide_fleet.worker.engine import RequestOutput
from tide_fleet.worker.held import Held, HeldJob
from tide_fleet.worker.logprobs import LogprobEntries

log = logging.getLogger(__name__)

WEBHOOK_STATUSES = (JobStatus.COMPLETED, JobStatus.FAILED)


@dataclass
class Saved:
    """One terminal result the flush wrote (won: this worker still held the lease)."""

    held: HeldJob
    status: JobStatus
    won: bool


@dataclass
class PendingWrites:
    entries: LogprobEntries = field(default_factory=lambda: LogprobEntries(None))
    deltas: list[tuple[HeldJob, dict[str, Any]]] = field(default_factory=list)
    first_tokens: list[HeldJob] = field(default_factory=list)
    started: list[HeldJob] = field(default_factory=list)
    finished: list[tuple[HeldJob, JobStatus, dict[str, Any]]] = field(default_factory=list)
    generated: int = 0  # tokens the engine produced for held jobs (Keys.generated_tokens)

    def __bool__(self) -> bool:
        return bool(
            self.deltas or self.first_tokens or self.started or self.finished or self.generated
        )

    def record(self, held: Held, outputs: list[RequestOutput]) -> None:
        """A step's outputs, for the choices of the jobs this worker holds."""
        now = time.time()
        for out in outputs:
            found = held.choice(out.request_id)
            if found is None or found[1].done:
                continue
            job, choice = found
            self.generated += len(out.new_token_ids)
            if job.streams and (out.delta_text or out.new_token_ids):
                event: dict[str, Any] = {
                    "type": "delta", "text": out.delta_text, "n": len(out.new_token_ids),
                    "i": choice.index, "t": ",".join(map(str, out.new_token_ids)),
                }  # fmt: skip
                if job.logprobs:
                    event["lp"] = json.dumps(self.entries(out.new_logprobs))
                self.deltas.append((job, event))
            if job.first_token_at is None and out.new_token_ids:
                job.first_token_at = now
                if job.streams and not out.finished:  # visible while it runs
                    self.first_tokens.append(job)
            if out.finished:
                choice.done, choice.text = True, out.text
                choice.finish_reason, choice.error = out.finish_reason or "stop", out.error
                choice.completion_tokens = len(out.token_ids)
                if job.logprobs:  # kept ones as an earlier attempt wrote them
                    choice.logprobs = choice.kept_logprobs + self.entries(out.logprobs or [])
                self.finish_if_done(job)

    def finish_if_done(self, job: HeldJob) -> None:
        """Record the job's result once every choice has ended (once)."""
        if job.done and not job.ended:
            fields = job.result()
            if error := job.error():
                fields["error"] = error
            self._finish(job, job.status(), fields)

    def reject(self, job: HeldJob, error: str) -> None:
        """The job could not be started at all: failed, with no output."""
        self._finish(job, JobStatus.FAILED, {"error": error})

    def mark_started(self, job: HeldJob) -> None:
        if not job.started:
            job.started = True
            self.started.append(job)

    def _finish(self, job: HeldJob, status: JobStatus, fields: dict[str, Any]) -> None:
        job.ended = True
        fields = {"finished_at": time.time()} | fields
        if job.first_token_at is not None:
            fields["first_token_at"] = job.first_token_at
        if job.cold_start_s is not None:
            fields["cold_start_seconds"] = job.cold_start_s
        self.finished.append((job, status, fields))

    def forget(self, job_id: str) -> None:
        """The lease moved on (reaped while Redis was away): nothing of it is written."""
        self.deltas = [d for d in self.deltas if d[0].job_id != job_id]
        self.first_tokens = [j for j in self.first_tokens if j.job_id != job_id]
        self.started = [j for j in self.started if j.job_id != job_id]
        self.finished = [f for f in self.finished if f[0].job_id != job_id]

    def take(self) -> PendingWrites:
        """Everything pending, moved out whole as one batch to flush; this starts empty."""
        batch = PendingWrites(
            self.entries, self.deltas, self.first_tokens, self.started, self.finished,
            self.generated,
        )  # fmt: skip
        self.deltas, self.first_tokens, self.started, self.finished = [], [], [], []
        self.generated = 0
        return batch

    def restore(self, batch: PendingWrites, held: Held) -> None:
        """A batch whose flush failed goes back before what was recorded since; what it
        holds of a job dropped meanwhile (``forget``) stays dropped."""

        def kept(jobs: list[HeldJob]) -> list[HeldJob]:
            return [j for j in jobs if held.get(j.job_id) is j]

        self.deltas = [d for d in batch.deltas if held.get(d[0].job_id) is d[0]] + self.deltas
        self.generated += batch.generated
        self.first_tokens = kept(batch.first_tokens) + self.first_tokens
        self.started = kept(batch.started) + self.started
        finished = [f for f in batch.finished if held.get(f[0].job_id) is f[0]]
        self.finished = finished + self.finished

    def flush(self, store: JobStore, pipe: Any, events_ttl: int, webhook: Any) -> list[Saved]:
        """This batch on one pipeline, executed (a Redis error raises; the batch is left
        as it was, to be restored). Reads only what recording no longer changes.
        `webhook`: SCHEDULE_IF_FINISHED (infra/jobs/webhook_store.py), registered."""
        for job, event in self.deltas:
            store.add_delta(job.job_id, job.token, event, client=pipe)
        if self.generated:
            pipe.incrby(Keys.generated_tokens, self.generated)
        for job in self.first_tokens:
            cold = {} if job.cold_start_s is None else {"cold_start_seconds": job.cold_start_s}
            store.update(
                job.job_id, job.token, client=pipe, first_token_at=job.first_token_at, **cold
            )
        for job in self.started:
            store.mark_started(job.job_id, job.token, client=pipe)
        results_at = len(pipe.command_stack)
        finished = list(self.finished)
        for job, status, fields in finished:
            store.finish(
                job.job_id, job.token, job.tenant, status,
                events_ttl=events_ttl, client=pipe, **fields,
            )  # fmt: skip
        for job, status, fields in finished:
            if job.has_webhook and status in WEBHOOK_STATUSES:
                msg_id = event_id(job.job_id, status.value)
                keys = [Keys.job(job.job_id), Keys.webhook(msg_id), Keys.webhooks_due]
                finished_at = encode_value(fields["finished_at"])
                webhook(keys=keys, args=[finished_at, "job", job.job_id, msg_id, time.time()],
                        client=pipe)  # fmt: skip
        for job, _, _ in finished:
            queues.Taker.ack(job.message, pipe)
        if not pipe.command_stack:
            return []
        results = pipe.execute()
        won = results[results_at : results_at + len(finished)]
        return [Saved(j, s, bool(w)) for (j, s, _), w in zip(finished, won, strict=True)]
