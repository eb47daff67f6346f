"""Per-(model, bucket) backlog: queued jobs, their tokens, the oldest one's age, arrivals.

The job scripts (infra/wire/jobstore.py) keep a zset of queued job ids per bucket and a hash of
their prompt + max tokens, changed in the same Lua call as the job's status, so a job
taken by a worker but not yet started (an un-acked message) still counts as backlog and a
job counts once however many times it is re-queued. Read by the controller (scaling), the
gateway (metrics) and `tide doctor`. A model other than the fleet's default has its own
keys (its lane, infra/wire/protocol.py `backlog_field`); `read_backlog(r, lane=...)` reads
one model's, `read_lanes` several in one round trip. Torch-free.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from tide_fleet.infra.wire.protocol import BUCKETS, Keys, backlog_field


@dataclass(frozen=True)
class BucketBacklog:
    jobs: int
    tokens: int
    oldest_age_s: float
    arrived_jobs: int  # monotonic counters: rates come from two readings
    arrived_tokens: int
    expired_jobs: int = 0  # queued jobs that expired unstarted (a counter)


def _pipeline_reads(pipe: Any, fields: list[str]) -> None:
    for f in fields:
        pipe.zcard(Keys.backlog(f))
        pipe.zrange(Keys.backlog(f), 0, 0, withscores=True)
    pipe.hgetall(Keys.backlog_tokens)
    pipe.hgetall(Keys.arrived_tokens)
    pipe.hgetall(Keys.arrived_jobs)
    pipe.hgetall(Keys.expired_jobs)


def _parse(raw: list[Any], now: float, fields: list[str]) -> dict[str, BucketBacklog]:
    def ints(h: dict[Any, Any]) -> dict[str, int]:
        return {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in h.items()}

    tokens, arrived_tokens, arrived_jobs, expired = (ints(h) for h in raw[-4:])
    out = {}
    for i, f in enumerate(fields):
        count, oldest = raw[2 * i], raw[2 * i + 1]
        age = max(0.0, now - float(oldest[0][1])) if oldest else 0.0
        out[f] = BucketBacklog(
            jobs=int(count),
            tokens=max(0, tokens.get(f, 0)) if count else 0,
            oldest_age_s=age,
            arrived_jobs=arrived_jobs.get(f, 0),
            arrived_tokens=arrived_tokens.get(f, 0),
            expired_jobs=expired.get(f, 0),
        )
    return out


def _fields(lanes: list[str]) -> list[str]:
    return [backlog_field(b, lane) for lane in lanes for b in BUCKETS]


Lanes = dict[str, dict[str, BucketBacklog]]  # lane -> bucket -> backlog


def _by_lane(flat: dict[str, BucketBacklog], lanes: list[str]) -> Lanes:
    return {lane: {b: flat[backlog_field(b, lane)] for b in BUCKETS} for lane in lanes}


def read_lanes(r: Any, lanes: list[str], now: float | None = None) -> Lanes:
    """lane -> bucket -> backlog for each lane ('' is the default model), in one pipeline."""
    fields = _fields(lanes)
    pipe = r.pipeline(transaction=False)
    _pipeline_reads(pipe, fields)
    flat = _parse(pipe.execute(), time.time() if now is None else now, fields)
    return _by_lane(flat, lanes)


async def read_lanes_async(r: Any, lanes: list[str], now: float | None = None) -> Lanes:
    """The same with redis.asyncio (the gateway)."""
    fields = _fields(lanes)
    pipe = r.pipeline(transaction=False)
    _pipeline_reads(pipe, fields)
    flat = _parse(await pipe.execute(), time.time() if now is None else now, fields)
    return _by_lane(flat, lanes)


def read_backlog(r: Any, now: float | None = None, lane: str = "") -> dict[str, BucketBacklog]:
    """One model's backlog per bucket (the default model's unless `lane`), one round trip
    (a pipeline) with a sync redis client."""
    return read_lanes(r, [lane], now)[lane]


async def read_backlog_async(
    r: Any, now: float | None = None, lane: str = ""
) -> dict[str, BucketBacklog]:
    """The same with redis.asyncio (the gateway)."""
    return (await read_lanes_async(r, [lane], now))[lane]


def deadline_backlog(client: redis.Redis, field: str) -> list[tuple[float, int]]:
    """The queued (not yet started) jobs with a deadline of one `backlog_field`, as
    (deadline unix seconds, prompt + n x max tokens), earliest first: one ZRANGE of the
    zset the job scripts keep beside the backlog (members '<job id>:<tokens>')."""
    raw: list[tuple[Any, float]] = client.zrange(  # type: ignore[assignment]
        Keys.deadline_backlog(field), 0, -1, withscores=True
    )
    out = []
    for member, deadline in raw:
        text = member.decode() if isinstance(member, bytes) else str(member)
        out.append((float(deadline), int(text.rsplit(":", 1)[1])))
    return out


def adapter_backlog(client: Any) -> dict[str, int]:
    """LoRA adapter name -> its queued jobs (adapters with none are absent): the hash the
    job scripts keep with the backlog. The jobs also count in their parent model's backlog."""
    return _counts(client.hgetall(Keys.adapter_backlog))


async def adapter_backlog_async(client: Any) -> dict[str, int]:
    """The same with redis.asyncio (the gateway)."""
    return _counts(await client.hgetall(Keys.adapter_backlog))


def _counts(raw: dict[Any, Any]) -> dict[str, int]:
    pairs = ((k.decode() if isinstance(k, bytes) else str(k), int(v)) for k, v in raw.items())
    return {name: n for name, n in pairs if n > 0}
