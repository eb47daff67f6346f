"""The webhook delivery schedule in Redis: durable, so a retry outlives a crash of anything.

Every pending delivery is a member of one sorted set, scored by when it is next due. A
dispatcher claims due deliveries (moving their score a lease ahead, so a lost task is
sent again when the lease runs out) and hands each to a Celery task with a ticket; only
the holder of the current ticket may record the outcome and reschedule or finish it. A
retry is thus a write to Redis (AOF), never a broker ETA message: those sit in kombu's
unacked hash until the visibility timeout when a worker or Redis dies.

Endpoints that answered 410 Gone are kept per tenant and skipped from then on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from tide_fleet.infra.wire.protocol import Keys


@dataclass(frozen=True)
class Delivery:
    """One event to one receiver: the same ``msg_id`` (``webhook-id``) on every attempt."""

    kind: str  # "job" | "batch"
    obj_id: str
    msg_id: str
    ticket: int = 0


_CLAIM = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
local out = {}
for _, id in ipairs(due) do
  local key = ARGV[4] .. id
  redis.call('ZADD', KEYS[1], ARGV[2], id)
  local ticket = redis.call('HINCRBY', key, 'ticket', 1)
  local f = redis.call('HMGET', key, 'kind', 'obj_id')
  table.insert(out, {id, f[1] or '', f[2] or '', ticket})
end
return out
"""

# KEYS: due, delivery, record. ARGV: msg_id, ticket, next due ('' = finished), field pairs.
_SETTLE = """
if redis.call('HGET', KEYS[2], 'ticket') ~= ARGV[2] then return 0 end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[2])
else
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
if #ARGV > 3 and redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HSET', KEYS[3], unpack(ARGV, 4))
end
return 1
"""


# A delivery scheduled as ``WebhookStore.schedule`` makes it, but only if the job's record
# still carries the given finished_at: queued by a worker in the same pipeline as its final
# write (worker/results.py), so the webhook exists exactly when that write won, and no
# crash can come between the two. KEYS: job, delivery, due set. ARGV: finished_at, kind,
# object id, message id, due time.
SCHEDULE_IF_FINISHED = """
if redis.call('HGET', KEYS[1], 'finished_at') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], 'kind', ARGV[2], 'obj_id', ARGV[3])
redis.call('ZADD', KEYS[3], 'NX', ARGV[5], ARGV[4])
return 1
"""


class WebhookStore:
    def __init__(self, client: redis.Redis, lease_seconds: float) -> None:
        self.r = client
        self.lease_seconds = lease_seconds
        self._claim = client.register_script(_CLAIM)
        self._settle = client.register_script(_SETTLE)

    def schedule(self, delivery: Delivery, due: float | None = None) -> None:
        """Make a delivery pending (due now by default); one already pending is left as it is."""
        pipe = self.r.pipeline()
        key = Keys.webhook(delivery.msg_id)
        pipe.hset(key, mapping={"kind": delivery.kind, "obj_id": delivery.obj_id})
        pipe.zadd(
            Keys.webhooks_due, {delivery.msg_id: time.time() if due is None else due}, nx=True
        )
        pipe.execute()

    def claim_due(self, now: float | None = None, limit: int = 100) -> list[Delivery]:
        """Take the due deliveries for one lease each; each comes with a fresh ticket."""
        now = time.time() if now is None else now
        prefix = Keys.webhook("")
        rows = self._claim(
            keys=[Keys.webhooks_due], args=[now, now + self.lease_seconds, limit, prefix]
        )
        return [
            Delivery(_s(kind), _s(obj), _s(msg), int(ticket)) for msg, kind, obj, ticket in rows
        ]

    def holds(self, delivery: Delivery) -> bool:
        ticket = self.r.hget(Keys.webhook(delivery.msg_id), "ticket")
        return _s(ticket) == str(delivery.ticket)

    def settle(
        self, delivery: Delivery, record_key: str, next_due: float | None, **fields: Any
    ) -> bool:
        """As the ticket holder: reschedule at ``next_due`` (None: finished) and write
        ``fields`` on the job (or batch) record. False if the ticket moved on."""
        # A reason may quote what could not be encoded (a lone surrogate): escape it.
        pairs = [
            str(x).encode(errors="backslashreplace").decode() for kv in fields.items() for x in kv
        ]
        due = "" if next_due is None else repr(next_due)
        keys = [Keys.webhooks_due, Keys.webhook(delivery.msg_id), record_key]
        return bool(self._settle(keys=keys, args=[delivery.msg_id, delivery.ticket, due, *pairs]))

    def record(self, key: str) -> dict[str, str]:
        """The job (or batch) record the delivery is about."""
        return {_s(k): _s(v) for k, v in self.r.hgetall(key).items()}

    def pending(self) -> int:
        return int(self.r.zcard(Keys.webhooks_due))

    def disable(self, tenant: str, url: str, reason: str) -> None:
        self.r.hset(Keys.webhooks_disabled(tenant), url, f"{reason} at {_iso(time.time())}")

    def disabled_reason(self, tenant: str, url: str) -> str | None:
        value = self.r.hget(Keys.webhooks_disabled(tenant), url)
        return _s(value) if value is not None else None

    def enable(self, tenant: str, url: str) -> bool:
        return bool(self.r.hdel(Keys.webhooks_disabled(tenant), url))


def _s(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
