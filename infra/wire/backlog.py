"""Per-bucket backlog: queued jobs, their tokens, the oldest one's age, arrivals so far.

The job scripts (infra/wire/jobstore.py) keep a zset of queued job ids per bucket and a hash of
their prompt + max tokens, changed in the same Lua call as the job's status, so a job
taken by a worker but not yet started (an un-acked message) still counts as backlog and a
job counts once however many times it is re-queued. Read by the controller (scaling), the
gateway (metrics) and `tide doctor`. Torch-free.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from infra.wire.protocol import BUCKETS, Keys


@dataclass(frozen=True)
class BucketBacklog:
    jobs: int
    tokens: int
    oldest_age_s: float
    arrived_jobs: int  # monotonic counters: rates come from two readings
    arrived_tokens: int


def _pipeline_reads(pipe: Any) -> None:
    for b in BUCKETS:
        pipe.zcard(Keys.backlog(b))
        pipe.zrange(Keys.backlog(b), 0, 0, withscores=True)
    pipe.hgetall(Keys.backlog_tokens)
    pipe.hgetall(Keys.arrived_tokens)
    pipe.hgetall(Keys.arrived_jobs)


def _parse(raw: list[Any], now: float) -> dict[str, BucketBacklog]:
    def ints(h: dict[Any, Any]) -> dict[str, int]:
        return {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in h.items()}

    tokens, arrived_tokens, arrived_jobs = (ints(h) for h in raw[-3:])
    out = {}
    for i, b in enumerate(BUCKETS):
        count, oldest = raw[2 * i], raw[2 * i + 1]
        age = max(0.0, now - float(oldest[0][1])) if oldest else 0.0
        out[b] = BucketBacklog(
            jobs=int(count),
            tokens=max(0, tokens.get(b, 0)) if count else 0,
            oldest_age_s=age,
            arrived_jobs=arrived_jobs.get(b, 0),
            arrived_tokens=arrived_tokens.get(b, 0),
        )
    return out


def read_backlog(r: Any, now: float | None = None) -> dict[str, BucketBacklog]:
    """One round trip (a pipeline) with a sync redis client."""
    pipe = r.pipeline(transaction=False)
    _pipeline_reads(pipe)
    return _parse(pipe.execute(), time.time() if now is None else now)


async def read_backlog_async(r: Any, now: float | None = None) -> dict[str, BucketBacklog]:
    """The same with redis.asyncio (the gateway)."""
    pipe = r.pipeline(transaction=False)
    _pipeline_reads(pipe)
    return _parse(await pipe.execute(), time.time() if now is None else now)
