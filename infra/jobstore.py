"""The job record in Redis: the source of truth. Every state change is one Lua script.

A job is completed only by the holder of its current lease; a late completion from a
stale holder is dropped. Queue messages (kombu's Redis format, see ``infra.queues``)
are pushed in the same script as the record changes, so accepted work is never
half-written.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis

from infra.protocol import BUCKETS, JobStatus, Keys, Priority, queue_name

# Backlog accounting, shared by the scripts below: a queued job is a member of the zset
# tide:backlog:<bucket> (score: created_at) and its prompt + max tokens are in the hash
# tide:backlog_tokens; the two change together, only when membership changes.
_BACKLOG_LUA = """
local function backlog(jobkey, job_id, add)
  local f = redis.call('HMGET', jobkey, 'bucket', 'prompt_tokens', 'max_tokens', 'created_at')
  if not f[1] then return end
  local z = 'tide:backlog:' .. f[1]
  local tokens = tonumber(f[2] or '0') + tonumber(f[3] or '0')
  if add then
    if redis.call('ZADD', z, 'NX', tonumber(f[4] or '0'), job_id) == 1 then
      redis.call('HINCRBY', 'tide:backlog_tokens', f[1], tokens)
    end
  elseif redis.call('ZREM', z, job_id) == 1 then
    redis.call('HINCRBY', 'tide:backlog_tokens', f[1], 0 - tokens)  -- never -0
  end
  return tokens
end

-- A batch job reaching a terminal state counts once in its batch's record, so the batch
-- supervisor need not read every line's status each pass (infra/batches.py).
local function batch_terminal(jobkey, status)
  local b = redis.call('HGET', jobkey, 'batch_id')
  if b and b ~= '' then
    redis.call('HINCRBY', 'tide:batch:' .. b, 'jobs_terminal', 1)
    if status == 'completed' then
      redis.call('HINCRBY', 'tide:batch:' .. b, 'jobs_completed', 1)
    end
  end
end
"""

_CREATE = (
    _BACKLOG_LUA
    + """local calls = redis.call('INCR', KEYS[5])
if calls == 1 then redis.call('EXPIRE', KEYS[5], 2) end
if calls > tonumber(ARGV[3]) then return {'rate'} end
if ARGV[1] ~= '' then
  local existing = redis.call('GET', KEYS[2])
  if existing then
    local f = redis.call('HMGET', 'tide:job:' .. existing, 'status', 'bucket', 'created_at')
    if f[1] then return {'exists', existing, f[1], f[2], f[3]} end
  end
end
if tonumber(redis.call('GET', KEYS[3]) or '0') >= tonumber(ARGV[5]) then
  return {'tenant_full'}
end
if redis.call('LLEN', KEYS[4]) >= tonumber(ARGV[6]) then return {'queue_full'} end
redis.call('HSET', KEYS[1], unpack(ARGV, 8))
redis.call('EXPIRE', KEYS[1], ARGV[4])
if ARGV[1] ~= '' then redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[4]) end
redis.call('INCR', KEYS[3])
local tokens = backlog(KEYS[1], ARGV[2], true)
local bucket = redis.call('HGET', KEYS[1], 'bucket')
redis.call('HINCRBY', 'tide:arrived_tokens', bucket, tokens)
redis.call('HINCRBY', 'tide:arrived_jobs', bucket, 1)
redis.call('LPUSH', KEYS[4], ARGV[7])
redis.call('PUBLISH', KEYS[6], KEYS[4])
return {'created', ARGV[2]}
"""
)

_ACQUIRE = (
    _BACKLOG_LUA
    + """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {'missing'} end
if st ~= 'queued' then return {st} end
redis.call('HSET', KEYS[1], 'status', 'in_progress', 'lease_token', ARGV[2],
           'lease_owner', ARGV[1], 'started_at', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'attempts', 1)
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
backlog(KEYS[1], ARGV[5], false)
local record = redis.call('HGETALL', KEYS[1])
table.insert(record, 1, 'acquired')
return record
"""
)

_REFRESH = """
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then return 'lost' end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
return redis.call('HGET', KEYS[1], 'cancel_requested') or '0'
"""

_UPDATE_IF_HOLDER = """
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return 1
"""

# ARGV: lease token, job id, events TTL (0: no 'done' event), then field/value pairs with
# 'status' first. The 'done' event is written only by the holder that won.
_FINISH = (
    _BACKLOG_LUA
    + """
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'status') ~= 'in_progress' then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
redis.call('HDEL', KEYS[1], 'lease_token')
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('DECR', KEYS[3])
batch_terminal(KEYS[1], ARGV[5])
if tonumber(ARGV[3]) > 0 then
  redis.call('XADD', KEYS[4], '*', 'type', 'done', 'status', ARGV[5])
  redis.call('EXPIRE', KEYS[4], ARGV[3])
end
return 1
"""
)

_REQUEUE = (
    _BACKLOG_LUA
    + """
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', 'queued')
redis.call('HDEL', KEYS[1], 'lease_token', 'lease_owner')
redis.call('HINCRBY', KEYS[1], 'attempts', -1)
redis.call('ZREM', KEYS[2], ARGV[2])
backlog(KEYS[1], ARGV[2], true)
local fields = redis.call('HMGET', KEYS[1], 'queue', 'message')
redis.call('RPUSH', fields[1], fields[2])
redis.call('PUBLISH', 'tide:wakeup', fields[1])
return 1
"""
)

_CANCEL = (
    _BACKLOG_LUA
    + """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return 'missing' end
if st == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'finished_at', ARGV[1],
             'finish_reason', 'abort')
  redis.call('DECR', KEYS[2])
  backlog(KEYS[1], ARGV[2], false)
  batch_terminal(KEYS[1], 'cancelled')
  return 'cancelled'
end
if st == 'in_progress' then
  redis.call('HSET', KEYS[1], 'cancel_requested', '1')
  return 'cancelling'
end
return st
"""
)

_REAP = (
    _BACKLOG_LUA
    + """
local expiry = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not expiry or tonumber(expiry) > tonumber(ARGV[2]) then return 'alive' end
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('HGET', KEYS[1], 'status') ~= 'in_progress' then return 'stale' end
redis.call('HDEL', KEYS[1], 'lease_token', 'lease_owner')
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'finished_at', ARGV[2],
             'finish_reason', 'abort')
  redis.call('DECR', KEYS[3])
  batch_terminal(KEYS[1], 'cancelled')
  return 'cancelled'
end
local attempts = tonumber(redis.call('HGET', KEYS[1], 'attempts') or '0')
if attempts >= tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[1], 'status', 'failed', 'finished_at', ARGV[2], 'error',
             'worker lost the job ' .. attempts .. ' times (max_attempts ' .. ARGV[3] .. ')')
  redis.call('DECR', KEYS[3])
  batch_terminal(KEYS[1], 'failed')
  return 'failed'
end
redis.call('HSET', KEYS[1], 'status', 'queued')
backlog(KEYS[1], ARGV[1], true)
local fields = redis.call('HMGET', KEYS[1], 'queue', 'message')
redis.call('RPUSH', fields[1], fields[2])
redis.call('PUBLISH', 'tide:wakeup', fields[1])
return 'requeued'
"""
)


@dataclass
class NewJob:
    """Everything the create script needs; built by the gateway, written in one call."""

    fields: dict[str, Any]
    queue: str
    message: str
    idempotency_key: str | None
    max_active: int
    max_queue_length: int
    max_rate: int
    ttl_seconds: int

    def script_call(self) -> tuple[list[str], list[Any]]:
        job_id, tenant = self.fields["id"], self.fields["tenant"]
        flat: list[Any] = []
        for k, v in {**self.fields, "queue": self.queue, "message": self.message}.items():
            flat += [k, _encode(v)]
        keys = [
            Keys.job(job_id),
            Keys.idempotency(tenant, self.idempotency_key or "-"),
            Keys.tenant_active(tenant),
            self.queue,
            Keys.tenant_rate(tenant, int(time.time())),
            Keys.wakeup,
        ]
        args = [
            self.idempotency_key or "", job_id, self.max_rate, self.ttl_seconds,
            self.max_active, self.max_queue_length, self.message, *flat,
        ]  # fmt: skip
        return keys, args

    def result(self, raw: list[Any]) -> dict[str, str]:
        """{id, status, bucket, created_at} of the new (or idempotently found) job."""
        out = [v.decode() if isinstance(v, bytes) else v for v in raw]
        if out[0] in ("rate", "tenant_full", "queue_full"):
            raise LimitExceeded(out[0])
        if out[0] == "exists":
            return {"id": out[1], "status": out[2], "bucket": out[3], "created_at": out[4]}
        f = self.fields
        return {
            "id": f["id"],
            "status": f["status"],
            "bucket": f["bucket"],
            "created_at": repr(f["created_at"]),
        }


_RESTORE_STRANDED = """
if redis.call('HGET', KEYS[3], 'status') ~= 'queued' then return 0 end
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('RPUSH', KEYS[4], ARGV[2])
redis.call('PUBLISH', 'tide:wakeup', KEYS[4])
return 1
"""

KOMBU_UNACKED, KOMBU_UNACKED_INDEX = "unacked", "unacked_index"  # kombu's Redis defaults


class LimitExceeded(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def new_job_id() -> str:
    return "job_" + uuid.uuid4().hex


class JobStore:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self.create_script = client.register_script(_CREATE)
        self._acquire = client.register_script(_ACQUIRE)
        self._refresh = client.register_script(_REFRESH)
        self._update = client.register_script(_UPDATE_IF_HOLDER)
        self._finish = client.register_script(_FINISH)
        self._requeue = client.register_script(_REQUEUE)
        self._cancel = client.register_script(_CANCEL)
        self._reap = client.register_script(_REAP)
        self._restore = client.register_script(_RESTORE_STRANDED)

    def create(self, job: NewJob) -> dict[str, str]:
        keys, args = job.script_call()
        return job.result(self.create_script(keys=keys, args=args))

    def get(self, job_id: str) -> dict[str, str] | None:
        raw = self.r.hgetall(Keys.job(job_id))
        if not raw:
            return None
        return {k.decode(): v.decode() for k, v in raw.items()}

    def acquire(
        self, job_id: str, worker_id: str, lease_seconds: float
    ) -> tuple[str, str, dict[str, str]]:
        """Take a queued job in one round trip: ('acquired', lease token, its record),
        or (its status, '', {}) when it is not queued (cancelled, a duplicate message)."""
        token = uuid.uuid4().hex
        now = time.time()
        res = [
            v.decode() if isinstance(v, bytes) else v
            for v in self._acquire(
                keys=[Keys.job(job_id), Keys.leases],
                args=[worker_id, token, now, now + lease_seconds, job_id],
            )
        ]
        if res[0] != "acquired":
            return res[0], "", {}
        return "acquired", token, dict(zip(res[1::2], res[2::2], strict=True))

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
            args += [k, _encode(v)]
        if client is not None:
            return self._update(keys=[Keys.job(job_id)], args=args, client=client)
        return bool(self._update(keys=[Keys.job(job_id)], args=args))

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
            args += [k, _encode(v)]
        keys = [Keys.job(job_id), Keys.leases, Keys.tenant_active(tenant), Keys.events(job_id)]
        if client is not None:
            return self._finish(keys=keys, args=args, client=client)
        return bool(self._finish(keys=keys, args=args))

    def requeue(self, job_id: str, token: str) -> bool:
        """Hand a held job back to its queue (drain): it keeps its place near the front."""
        return bool(self._requeue(keys=[Keys.job(job_id), Keys.leases], args=[token, job_id]))

    def cancel(self, job_id: str, tenant: str) -> str:
        res = self._cancel(
            keys=[Keys.job(job_id), Keys.tenant_active(tenant)], args=[time.time(), job_id]
        )
        return res.decode() if isinstance(res, bytes) else res

    def reap(self, max_attempts: int, now: float | None = None) -> dict[str, str]:
        """Re-queue (or fail, after max_attempts) in-progress jobs whose lease expired."""
        now = time.time() if now is None else now
        expired = self.r.zrangebyscore(Keys.leases, "-inf", now)
        out = {}
        for raw in expired:
            job_id = raw.decode()
            tenant = self.r.hget(Keys.job(job_id), "tenant")
            res = self._reap(
                keys=[Keys.job(job_id), Keys.leases, Keys.tenant_active((tenant or b"").decode())],
                args=[job_id, now, max_attempts],
            )
            out[job_id] = res.decode() if isinstance(res, bytes) else res
        return out

    def prune_backlog(self, job_ttl: float, now: float | None = None) -> list[str]:
        """Drop backlog entries of queued jobs whose record expired (job_ttl) before any
        worker took them (a bucket nobody serves), so a pool can still scale to zero."""
        now = time.time() if now is None else now
        dropped = []
        for b in BUCKETS:
            key = Keys.backlog(b)
            for raw in self.r.zrangebyscore(key, "-inf", now - job_ttl):
                job_id = raw.decode()
                if not self.r.exists(Keys.job(job_id)) and self.r.zrem(key, job_id):
                    dropped.append(job_id)
            if dropped and self.r.zcard(key) == 0:
                self.r.hset(Keys.backlog_tokens, b, 0)  # its tokens went with the records
        return dropped

    def restore_stranded(self, older_than: float, now: float | None = None) -> list[str]:
        """Put back messages a worker took but never started (it died, or Redis restarted
        between the take and the acquire): the job is still queued, its message sits in
        kombu's unacked set. Copies of started jobs are left alone (acquire skips them)."""
        now = time.time() if now is None else now
        job_queues = {queue_name(b, p) for b in BUCKETS for p in Priority}
        restored = []
        for tag in self.r.zrangebyscore(KOMBU_UNACKED_INDEX, "-inf", now - older_than):
            raw = self.r.hget(KOMBU_UNACKED, tag)
            if raw is None:
                continue
            envelope, _exchange, routing_key = json.loads(raw)
            if routing_key not in job_queues:
                continue  # a Celery task, not a job
            body = json.loads(base64.b64decode(envelope["body"]))
            job_id = body.get("job_id", "")
            keys = [KOMBU_UNACKED, KOMBU_UNACKED_INDEX, Keys.job(job_id), routing_key]
            if self._restore(keys=keys, args=[tag, json.dumps(envelope)]):
                restored.append(job_id)
        return restored


def _encode(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value)
