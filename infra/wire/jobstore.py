"""The job record in Redis: the source of truth. Every state change is one Lua script.

A job is completed only by the holder of its current lease; a late completion from a
stale holder is dropped. An attempt is charged only when computation starts
(``mark_started``), so a worker killed while merely holding jobs costs them nothing.
Queue messages (kombu's Redis format, see ``tide_fleet.infra.wire.queues``) are pushed in the same
script as the record changes, so accepted work is never half-written. The scripts
themselves are in ``tide_fleet.infra.wire.job_scripts``.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Any

import redis

from tide_fleet.infra.wire import job_scripts as lua
from tide_fleet.infra.wire.codec import decode_hash, encode_value
from tide_fleet.infra.wire.new_job import NewJob
from tide_fleet.infra.wire.protocol import BUCKETS, JobStatus, Keys, parse_queue
from tide_fleet.infra.wire.queues import UNACKED, UNACKED_INDEX

# A job lost this many times max_attempts before it ever started fails: a poison job can
# kill its worker before the start mark is written.
UNSTARTED_LOSS_FACTOR = 3


class JobStore:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self.create_script = client.register_script(lua.CREATE)
        self._acquire = client.register_script(lua.ACQUIRE)
        self._mark_started = client.register_script(lua.MARK_STARTED)
        self._refresh = client.register_script(lua.REFRESH)
        self._update = client.register_script(lua.UPDATE_IF_HOLDER)
        self._delta = client.register_script(lua.DELTA)
        self._finish = client.register_script(lua.FINISH)
        self._requeue = client.register_script(lua.REQUEUE)
        self._cancel = client.register_script(lua.CANCEL)
        self._reap = client.register_script(lua.REAP)
        self._restore = client.register_script(lua.RESTORE_STRANDED)
        self._expire = client.register_script(lua.EXPIRE_DUE)

    def create(self, job: NewJob) -> dict[str, str]:
        keys, args = job.script_call()
        return job.result(self.create_script(keys=keys, args=args))

    def get(self, job_id: str) -> dict[str, str] | None:
        raw = self.r.hgetall(Keys.job(job_id))
        if not raw:
            return None
        return decode_hash(raw)

    def acquire(
        self, job_id: str, worker_id: str, lease_seconds: float, events_ttl: int = 0
    ) -> tuple[str, str, dict[str, str]]:
        """Take a queued job in one round trip: ('acquired', lease token, its record),
        or (its status, '', {}) when it is not queued (cancelled, a duplicate message), or
        ('expired', '', {}) when its deadline or ttl passed (it ends so, never started).
        Holding a job charges no attempt; ``mark_started`` does."""
        token = uuid.uuid4().hex
        now = time.time()
        res = [
            v.decode() if isinstance(v, bytes) else v
            for v in self._acquire(
                keys=[Keys.job(job_id), Keys.leases],
                args=[worker_id, token, now, now + lease_seconds, job_id, events_ttl],
            )
        ]
        if res[0] != "acquired":
            return res[0], "", {}
        return "acquired", token, dict(zip(res[1::2], res[2::2], strict=True))

    def mark_started(self, job_id: str, token: str, client: Any = None) -> Any:
        """Computation of the job began under this lease (the engine scheduled it): charge
        its attempt, once per lease however often it is called. True if the token still
        holds the lease; with client=a pipeline, queued there (1 or 0 from execute())."""
        keys, args = [Keys.job(job_id)], [token]
        if client is not None:
            return self._mark_started(keys=keys, args=args, client=client)
        return bool(self._mark_started(keys=keys, args=args))

    def refresh(self, leases: dict[str, str], lease_seconds: float) -> dict[str, str]:
        """Extend many leases in one round trip: job id -> '0', '1' (cancel asked) or 'lost'."""
        pipe = self.r.pipeline(transaction=False)
        expiry = time.time() + lease_seconds
        for job_id, token in leases.items():
            self._refresh(
                keys=[Keys.job(job_id), Keys.leases], args=[token, expiry, job_id], client=pipe
            )
        out = pipe.execute()
        return {
            j: (v.decode() if isinstance(v, bytes) else str(v))
            for j, v in zip(leases, out, strict=True)
        }

    def update(self, job_id: str, token: str, client: Any = None, **fields: Any) -> Any:
        """Set fields if token still holds the lease (True if it did); with client=a
        pipeline, queued there."""
        args = [token]
        for k, v in fields.items():
            args += [k, encode_value(v)]
        if client is not None:
            return self._update(keys=[Keys.job(job_id)], args=args, client=client)
        return bool(self._update(keys=[Keys.job(job_id)], args=args))

    def add_delta(self, job_id: str, token: str, event: dict[str, Any], client: Any) -> Any:
        """Append a delta event to the job's stream if token still holds the lease; queued
        on `client` (a pipeline: 1 or 0 from its execute())."""
        args = [token]
        for k, v in event.items():
            args += [k, encode_value(v)]
        keys = [Keys.job(job_id), Keys.events(job_id)]
        return self._delta(keys=keys, args=args, client=client)

    def finish(
        self,
        job_id: str,
        token: str,
        tenant: str,
        status: JobStatus,
        events_ttl: int = 0,
        client: Any = None,
        **fields: Any,
    ) -> Any:
        """Terminal state, only from the current lease holder (True if it was). With
        events_ttl, also the job's 'done' event. With client=a pipeline, the call is queued
        there and its result (1 or 0) comes from the pipeline's execute()."""
        args: list[Any] = [token, job_id, events_ttl, "status", status.value]
        for k, v in fields.items():
            args += [k, encode_value(v)]
        keys = [Keys.job(job_id), Keys.leases, Keys.tenant_active(tenant), Keys.events(job_id)]
        if client is not None:
            return self._finish(keys=keys, args=args, client=client)
        return bool(self._finish(keys=keys, args=args))

    def requeue(self, job_id: str, token: str) -> bool:
        """Hand a held job back to its queue (drain): it keeps its place near the front,
        and an attempt charged under this lease is given back."""
        return bool(self._requeue(keys=[Keys.job(job_id), Keys.leases], args=[token, job_id]))

    def cancel(self, job_id: str, tenant: str) -> str:
        res = self._cancel(
            keys=[Keys.job(job_id), Keys.tenant_active(tenant)], args=[time.time(), job_id]
        )
        return res.decode() if isinstance(res, bytes) else res

    def cancel_queued(self, job_ids: list[str], tenant: str, chunk: int = 500) -> int:
        """Cancel those of the jobs still queued (running ones finish), in pipelines of
        `chunk` jobs; how many were cancelled."""
        cancelled = 0
        for start in range(0, len(job_ids), chunk):
            ids = job_ids[start : start + chunk]
            read = self.r.pipeline(transaction=False)
            for job_id in ids:
                read.hget(Keys.job(job_id), "status")
            queued = [j for j, s in zip(ids, read.execute(), strict=True) if s == b"queued"]
            write = self.r.pipeline(transaction=False)
            now = time.time()
            for job_id in queued:
                self._cancel(keys=[Keys.job(job_id), Keys.tenant_active(tenant)],
                             args=[now, job_id], client=write)  # fmt: skip
            write.execute()
            cancelled += len(queued)
        return cancelled

    def reap(
        self,
        max_attempts: int,
        now: float | None = None,
        events_ttl: int = 0,
        max_unstarted_losses: int | None = None,
    ) -> dict[str, str]:
        """Re-queue in-progress jobs whose lease expired: job id -> 'requeued', 'failed',
        'cancelled' (cancel was asked), 'alive' or 'stale'. A job fails after max_attempts
        losses while it ran, or after max_unstarted_losses (default UNSTARTED_LOSS_FACTOR x
        max_attempts) losses before it ever started. With events_ttl, a job the reaper ends
        gets its 'done' event, as from a worker."""
        now = time.time() if now is None else now
        if max_unstarted_losses is None:
            max_unstarted_losses = UNSTARTED_LOSS_FACTOR * max_attempts
        expired = self.r.zrangebyscore(Keys.leases, "-inf", now)
        out = {}
        for raw in expired:
            job_id = raw.decode()
            tenant = (self.r.hget(Keys.job(job_id), "tenant") or b"").decode()
            keys = [Keys.job(job_id), Keys.leases, Keys.tenant_active(tenant), Keys.events(job_id)]
            res = self._reap(
                keys=keys, args=[job_id, now, max_attempts, max_unstarted_losses, events_ttl]
            )
            out[job_id] = res.decode() if isinstance(res, bytes) else res
        return out

    def expire_due(self, now: float | None = None, events_ttl: int = 0) -> list[str]:
        """End queued jobs whose deadline or ttl passed as expired (never started, charged
        nothing; their webhook scheduled); the ids expired."""
        now = time.time() if now is None else now
        expired = []
        for raw in self.r.zrangebyscore(Keys.expiries, "-inf", now):
            job_id = raw.decode()
            if self._expire(keys=[Keys.job(job_id), Keys.expiries], args=[job_id, now, events_ttl]):
                expired.append(job_id)
        return expired

    def prune_backlog(self, job_ttl: float, now: float | None = None) -> list[str]:
        """Drop backlog entries of queued jobs whose record expired (job_ttl) before any
        worker took them (a bucket nobody serves), so a pool can still scale to zero."""
        now = time.time() if now is None else now
        dropped = []
        known = {k.decode() for k in self.r.hkeys(Keys.backlog_tokens)}
        for b in [*BUCKETS, *sorted(known - set(BUCKETS))]:  # every model's (model, bucket)
            key = Keys.backlog(b)
            for raw in self.r.zrangebyscore(key, "-inf", now - job_ttl):
                job_id = raw.decode()
                if not self.r.exists(Keys.job(job_id)) and self.r.zrem(key, job_id):
                    dropped.append(job_id)
                    self._prune_deadline(b, job_id)
            if dropped and self.r.zcard(key) == 0:
                self.r.hset(Keys.backlog_tokens, b, 0)  # its tokens went with the records
        return dropped

    def _prune_deadline(self, field: str, job_id: str) -> None:
        key = Keys.deadline_backlog(field)
        for raw in self.r.zscan_iter(key, match=f"{job_id}:*"):
            self.r.zrem(key, raw[0])

    def restore_stranded(self, older_than: float, now: float | None = None) -> list[str]:
        """Put back messages a worker took but never started (it died, or Redis restarted
        between the take and the acquire): the job is still queued, its message sits in
        kombu's unacked set. Copies of started jobs are left alone (acquire skips them)."""
        now = time.time() if now is None else now
        restored = []
        for tag in self.r.zrangebyscore(UNACKED_INDEX, "-inf", now - older_than):
            raw = self.r.hget(UNACKED, tag)
            if raw is None:
                continue
            envelope, _exchange, routing_key = json.loads(raw)
            if parse_queue(routing_key) is None:
                continue  # a Celery task, not a job
            body = json.loads(base64.b64decode(envelope["body"]))
            job_id = body.get("job_id", "")
            keys = [UNACKED, UNACKED_INDEX, Keys.job(job_id), routing_key,
                    Keys.deadline_queue(routing_key)]  # fmt: skip
            if self._restore(keys=keys, args=[tag, json.dumps(envelope)]):
                restored.append(job_id)
        return restored
