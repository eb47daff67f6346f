"""Queue topology and message encoding on kombu's Redis transport.

The gateway and reaper push encoded messages inside their Lua scripts (atomic with the
job record); workers take them with ``Taker`` (kombu's Redis channel format, in its
unacked hash too, many per round trip). ``encode`` builds exactly the envelope kombu's
Redis channel writes for a publish to the default exchange.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tide_fleet.infra.wire.fair_scripts import FAIR_PRELUDE, GIVE_BACK
from tide_fleet.infra.wire.protocol import JobMessage, Keys

# kombu's Redis transport defaults: taken, unacknowledged messages (tag -> message) and
# their take times. Workers write them here; ``JobStore.restore_stranded`` reads them.
UNACKED, UNACKED_INDEX = "unacked", "unacked_index"


def encode(message: JobMessage, queue: str) -> str:
    """A kombu Redis-transport message for ``queue`` (default exchange, priority 0)."""
    body = message.dumps().encode()
    envelope = {
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"job_id": message.job_id},  # read by the take script (its tenant)
        "properties": {
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "delivery_mode": 2,
        },
    }
    return json.dumps(envelope)


# Adapter-aware take: a worker names the LoRA adapters it holds (infra/wire/adapters.py),
# and from each list it takes from (a tenant's, or the plain list) it takes the first of the
# ADAPTER_WINDOW messages at the front whose job runs on the base model or on one of those
# adapters; when none in the window does, the front one, so a worker with a free slot never
# idles while work waits. Only the order within that one list changes: deadline jobs are
# taken first, earliest first, as ever; the tenant is the one with the least counter; the
# queues are read in the worker's consume order. A job's adapter is its record's `lora`.
ADAPTER_WINDOW = 16

# Take up to ARGV[1] messages from the queues in KEYS[3..] (pairs: a kombu list, then its
# deadline zset, in consume order); ARGV[3..]: the adapters the worker holds. From each
# queue: its deadline zset first, earliest deadline first (ZPOPMIN); then its tenants'
# lists, the tenant with the least weighted service first (infra/wire/fair_scripts.py);
# then the plain list (messages pushed there directly), RPOP end first; within a list,
# adapter-aware (above). Each message goes into kombu's unacked hash and index so an
# unacknowledged one can be restored; many in one round trip, without kombu's per-call
# overhead. The hash holds kombu's own format: [envelope, exchange, routing key]. A queued
# job's tenant is charged its cost, recorded on the job. Returns (queue, message, deadline
# or '', tenant or '', charge, adapter or '') sextuples.
_TAKE = (
    FAIR_PRELUDE
    + """
local out = {}
local limit = tonumber(ARGV[1])
local held = {}
for i = 3, #ARGV do held[ARGV[i]] = true end
local function job_of(m)
  local headers = cjson.decode(m)['headers']
  return type(headers) == 'table' and headers['job_id'] or nil
end
local function adapter_of(job_id)
  if not job_id then return '' end
  return redis.call('HGET', 'tide:job:' .. job_id, 'lora') or ''
end
-- The first message of the window at the list's front (its RPOP end) whose job runs on
-- the base or a held adapter, else the front one; removed from the list.
local function pick(list)
  local window = redis.call('LRANGE', list, -ADAPTER_WINDOW, -1)
  for i = #window, 1, -1 do
    local lora = adapter_of(job_of(window[i]))
    if lora == '' or held[lora] then
      if i == #window then break end
      redis.call('LREM', list, -1, window[i])
      return window[i]
    end
  end
  return redis.call('RPOP', list)
end
local function take(queue, m, deadline, tenant)
  local env = cjson.decode(m)
  local tag = env['properties']['delivery_tag']
  local job_id = type(env['headers']) == 'table' and env['headers']['job_id']
  local charged = 0
  if job_id and (tenant ~= '' or deadline ~= '') then  -- the plain list charges no one
    local jobkey = 'tide:job:' .. job_id
    local owner, cost = fair_cost(jobkey)
    if owner and (tenant == '' or owner == tenant) then
      tenant = owner
      -- A second copy of a job already charged (a reaped job can be queued twice) is not.
      if redis.call('HEXISTS', jobkey, 'fair_queue') == 0 then
        charged = fair_charge(queue, owner, cost)
      end
      if charged ~= 0 then  -- remembered until the job ends (fair_settle) or goes back
        redis.call('HSET', jobkey, 'fair_queue', queue, 'fair_charge', tostring(charged))
      end
    end
  end
  redis.call('HSET', KEYS[1], tag, '[' .. m .. ', "", "' .. queue .. '"]')
  redis.call('ZADD', KEYS[2], ARGV[2], tag)
  for _, v in ipairs({queue, m, deadline, tenant, tostring(charged), adapter_of(job_id)}) do
    table.insert(out, v)
  end
end
for i = 3, #KEYS, 2 do
  while #out < 6 * limit do
    local z = redis.call('ZPOPMIN', KEYS[i + 1])
    if #z == 0 then break end
    take(KEYS[i], z[1], z[2], '')
  end
  while #out < 6 * limit do
    local m, tenant = fair_pop(KEYS[i], pick)
    if not m then break end
    take(KEYS[i], m, '', tenant)
  end
  while #out < 6 * limit do
    local m = pick(KEYS[i])
    if not m then break end
    take(KEYS[i], m, '', '')
  end
end
return out
""".replace("ADAPTER_WINDOW", str(ADAPTER_WINDOW))
)


@dataclass
class Delivery:
    """A message taken from a queue and not yet acknowledged."""

    queue: str
    tag: str
    envelope: str
    deadline: float | None = None  # taken from the queue's deadline zset
    tenant: str = ""  # whose list (or, for a deadline job, whose counter) it came from
    charged: str = "0"  # what the take charged the tenant's counter (given back with it)
    lora: str = ""  # the job's LoRA adapter ('' for the base model), read at take

    def job(self) -> JobMessage:
        body = json.loads(self.envelope)["body"]
        return JobMessage.loads(base64.b64decode(body))


class Taker:
    """Takes job messages for a worker (kombu-compatible on the wire and in Redis)."""

    def __init__(self, client: Any) -> None:
        self.r = client
        self._take = client.register_script(_TAKE)
        self._give_back = client.register_script(GIVE_BACK)

    def take(
        self, queue_names: list[str], limit: int, adapters: Iterable[str] = ()
    ) -> list[Delivery]:
        """Up to `limit` messages, in consume order; `adapters`: the LoRA adapters the
        worker holds, whose jobs it takes first within a list (ADAPTER_WINDOW)."""
        keys = [UNACKED, UNACKED_INDEX]
        for q in queue_names:
            keys += [q, Keys.deadline_queue(q)]
        raw = self._take(keys=keys, args=[limit, time.time(), *adapters])
        out = []
        fields = [x.decode() if isinstance(x, bytes) else x for x in raw]
        for i in range(0, len(fields), 6):
            q, m, d, tenant, charged, lora = fields[i : i + 6]
            tag = json.loads(m)["properties"]["delivery_tag"]
            out.append(Delivery(q, tag, m, float(d) if d else None, tenant, charged, lora))
        return out

    @staticmethod
    def ack(d: Delivery, pipe: Any) -> None:
        """Queue the ack on `pipe` (the caller executes it, after the result it follows)."""
        pipe.zrem(UNACKED_INDEX, d.tag)
        pipe.hdel(UNACKED, d.tag)

    def ack_now(self, d: Delivery) -> None:
        pipe = self.r.pipeline(transaction=False)
        self.ack(d, pipe)
        pipe.execute()

    def give_back(self, deliveries: list[Delivery]) -> None:
        """Untaken: back to the front of their queues, in their original order (a deadline
        job's to its queue's deadline zset, a tenant's to its list, its charge refunded)."""
        if not deliveries:
            return
        args: list[str] = []
        for d in reversed(deliveries):
            deadline = repr(d.deadline) if d.deadline is not None else ""
            args += [d.queue, d.envelope, deadline, d.tenant, d.charged, d.tag]
        self._give_back(keys=[UNACKED, UNACKED_INDEX], args=args)


def read_depth(pipe: Any, queue: str) -> None:
    """Queue on `pipe` the reads of a queue's depth (DEPTH_READS results, see `depth_of`):
    its plain list, its deadline zset, its tenants' lists."""
    pipe.llen(queue)
    pipe.zcard(Keys.deadline_queue(queue))
    pipe.get(Keys.queue_waiting(queue))


DEPTH_READS = 3


def depth_of(values: list[Any]) -> int:
    return sum(int(v or 0) for v in values)


def depth(client: Any, queue: str) -> int:
    """Messages waiting in one job queue (cancelled jobs' included, skipped at pickup)."""
    pipe = client.pipeline(transaction=False)
    read_depth(pipe, queue)
    return depth_of(pipe.execute())
