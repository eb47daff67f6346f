"""The batch record in Redis, its line table, and the handles the batch tasks share.

A batch is a hash (``Keys.batch``) listed per tenant by creation time; its status moves
only by ``transition``, which sets fields if the status is still one the caller expects,
so two steps racing (a cancel and a finalize) cannot both win. The line table
(``Keys.batch_lines``) maps each input line's index to its job id, or to ``error:`` and
the refusal for a line refused at fan-out (it has no job record).
"""

from __future__ import annotations

import functools
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

import redis

from tide_fleet.infra.jobs.files import FileStore
from tide_fleet.infra.jobs.storage import make_storage
from tide_fleet.infra.settings import Settings, get_settings
from tide_fleet.infra.wire.codec import decode_hash, encode_value
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.protocol import Keys

FANOUT_CHUNK = 500  # lines per pipeline, writing jobs at fan-out and reading them back
REFUSED = "error:"  # prefix of a refused line's entry in the line table
UNLIMITED_WINDOW = re.compile(r"^(\d+)([smh])$")


def parse_window(window: str) -> int:
    """'24h' (OpenAI's only value), or any N s|m|h; seconds."""
    m = UNLIMITED_WINDOW.match(window)
    if not m or int(m.group(1)) < 1:
        raise ValueError(f"completion_window: expected a duration like '24h', got {window!r}")
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


def new_batch_id() -> str:
    return "batch_" + uuid.uuid4().hex


def refusal(status: int, message: str, custom_id: str, param: str | None = None) -> str:
    """A refused line's entry in the line table (`param`: the body field refused)."""
    entry = {"status": status, "message": message, "custom_id": custom_id, "param": param}
    return REFUSED + json.dumps(entry)


# Set ARGV[2 + n ..] (field, value pairs) if the status is one of the n in ARGV[2 .. 1 + n].
_TRANSITION = """
local st = redis.call('HGET', KEYS[1], 'status')
for i = 2, 1 + tonumber(ARGV[1]) do
  if st == ARGV[i] then
    redis.call('HSET', KEYS[1], unpack(ARGV, 2 + tonumber(ARGV[1])))
    return 1
  end
end
return 0
"""


class BatchStore:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._transition = client.register_script(_TRANSITION)

    def create(self, record: dict[str, Any]) -> None:
        pipe = self.r.pipeline()
        pipe.hset(Keys.batch(record["id"]), mapping={k: encode_value(v) for k, v in record.items()})
        pipe.zadd(Keys.tenant_batches(record["tenant"]), {record["id"]: record["created_at"]})
        pipe.execute()

    def get(self, batch_id: str, tenant: str | None = None) -> dict[str, str] | None:
        record = decode_hash(self.r.hgetall(Keys.batch(batch_id)))
        if not record or (tenant is not None and record.get("tenant") != tenant):
            return None
        return record

    def list(self, tenant: str, after: str | None, limit: int) -> tuple[list[dict[str, str]], bool]:
        """Newest first; ``after`` is the last id of the previous page."""
        key = Keys.tenant_batches(tenant)
        start = 0
        if after:
            rank = self.r.zrevrank(key, after)
            start = 0 if rank is None else rank + 1
        ids = self.r.zrevrange(key, start, start + limit)
        records = [b for b in (self.get(i.decode(), tenant) for i in ids[:limit]) if b]
        return records, len(ids) > limit

    def transition(self, batch_id: str, from_: list[str], **fields: Any) -> bool:
        """Set fields (status among them) only if the status is one of from_."""
        flat: list[Any] = []
        for k, v in fields.items():
            flat += [k, encode_value(v)]
        return bool(self._transition(keys=[Keys.batch(batch_id)], args=[len(from_), *from_, *flat]))

    def update(self, batch_id: str, **fields: Any) -> None:
        self.r.hset(Keys.batch(batch_id), mapping={k: encode_value(v) for k, v in fields.items()})

    def lines(self, batch_id: str) -> dict[int, str]:
        """The line table: line index -> job id or refusal."""
        return {int(k): v.decode() for k, v in self.r.hgetall(Keys.batch_lines(batch_id)).items()}


@dataclass(frozen=True)
class Handles:
    """What the batch tasks and the supervisor use, built once per process."""

    settings: Settings
    client: redis.Redis
    batches: BatchStore
    files: FileStore
    jobs: JobStore


@functools.cache
def handles() -> Handles:
    settings = get_settings()
    client = redis.Redis.from_url(settings.redis_url or "")
    return Handles(
        settings, client, BatchStore(client), FileStore(client, make_storage(settings)),
        JobStore(client),
    )  # fmt: skip
