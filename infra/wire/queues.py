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
from dataclasses import dataclass
from typing import Any

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
        "headers": {},
        "properties": {
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "delivery_mode": 2,
        },
    }
    return json.dumps(envelope)


# Take up to ARGV[1] messages from the queues in KEYS[3..] (in that order), as kombu's Redis
# channel does for one (RPOP, then the message into its unacked hash and index, so an
# unacknowledged message can be restored), but many in one round trip and without kombu's
# per-call overhead. The hash holds kombu's own format: [envelope, exchange, routing key].
_TAKE = """
local out = {}
local limit = tonumber(ARGV[1])
for i = 3, #KEYS do
  while #out < 2 * limit do
    local m = redis.call('RPOP', KEYS[i])
    if not m then break end
    local tag = cjson.decode(m)['properties']['delivery_tag']
    redis.call('HSET', KEYS[1], tag, '[' .. m .. ', "", "' .. KEYS[i] .. '"]')
    redis.call('ZADD', KEYS[2], ARGV[2], tag)
    table.insert(out, KEYS[i])
    table.insert(out, m)
  end
end
return out
"""


@dataclass
class Delivery:
    """A message taken from a queue and not yet acknowledged."""

    queue: str
    tag: str
    envelope: str

    def job(self) -> JobMessage:
        body = json.loads(self.envelope)["body"]
        return JobMessage.loads(base64.b64decode(body))


class Taker:
    """Takes job messages for a worker (kombu-compatible on the wire and in Redis)."""

    def __init__(self, client: Any) -> None:
        self.r = client
        self._take = client.register_script(_TAKE)

    def take(self, queue_names: list[str], limit: int) -> list[Delivery]:
        raw = self._take(keys=[UNACKED, UNACKED_INDEX, *queue_names], args=[limit, time.time()])
        out = []
        for q, m in zip(raw[::2], raw[1::2], strict=True):
            q, m = (x.decode() if isinstance(x, bytes) else x for x in (q, m))
            out.append(Delivery(q, json.loads(m)["properties"]["delivery_tag"], m))
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
        """Untaken: back to the front of their queues, in their original order."""
        if not deliveries:
            return
        pipe = self.r.pipeline(transaction=False)
        for d in reversed(deliveries):
            pipe.rpush(d.queue, d.envelope)
            self.ack(d, pipe)
            pipe.publish(Keys.wakeup, d.queue)
        pipe.execute()
