"""The controller's records for the web console: last decision per pool, recent changes,
one history sample per poll; capped lists, readable across versions."""

from __future__ import annotations

import asyncio
import json

import redis.asyncio

from tide_fleet.infra.wire import fleet_status as fs
from tide_fleet.infra.wire.protocol import Keys


def _status(pool: str, action: str, at: float) -> fs.PoolStatus:
    return fs.PoolStatus(pool, action, 0, 1 if action == "scale_out" else 0, f"why {at}", at,
                         {"starting": 1}, 3, 12.5, 2000.0)  # fmt: skip


def _read(url: str, history: bool) -> fs.FleetStatus:
    async def go() -> fs.FleetStatus:
        client = redis.asyncio.Redis.from_url(url)
        try:
            return await fs.read_status_async(client, history=history)
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_records_read_back(redis_client, redis_server):
    for t in range(3):
        pipe = redis_client.pipeline()
        statuses = [_status("a", "scale_out" if t == 1 else "hold", t), _status("b", "hold", t)]
        fs.record(pipe, statuses, fs.FleetSample(t, workers=t, desired=1, queued=3 - t,
                                                 tokens_per_s=10.0 * t))  # fmt: skip
        pipe.execute()
    got = _read(redis_server.url, history=True)
    assert got.pools["a"] == _status("a", "hold", 2) and set(got.pools) == {"a", "b"}
    assert got.decisions == [_status("a", "scale_out", 1)]  # holds are not changes
    assert [s.t for s in got.history] == [0, 1, 2]  # oldest first
    assert got.history[2] == fs.FleetSample(2, 2, 1, 1, 20.0)
    assert _read(redis_server.url, history=False).history == []


def test_lists_are_capped(redis_client, redis_server):
    for t in range(fs.HISTORY_KEPT + 5):
        pipe = redis_client.pipeline()
        fs.record(pipe, [_status("a", "scale_out", t)], fs.FleetSample(t, 0, 0, 0, 0.0))
        pipe.execute()
    assert redis_client.llen(Keys.controller_decisions) == fs.DECISIONS_KEPT
    assert redis_client.llen(Keys.controller_history) == fs.HISTORY_KEPT
    got = _read(redis_server.url, history=True)
    assert got.decisions[0].at == fs.HISTORY_KEPT + 4  # newest first
    assert got.history[-1].t == fs.HISTORY_KEPT + 4


def test_a_record_from_another_version_still_reads(redis_client, redis_server):
    newer = {"pool": "a", "action": "hold", "current": 1, "desired": 1, "reason": "ok",
             "at": 5.0, "a_field_from_the_future": True}  # fmt: skip
    redis_client.hset(Keys.controller_pools, "a", json.dumps(newer))
    pool = _read(redis_server.url, history=False).pools["a"]
    assert pool.reason == "ok" and pool.workers == {} and pool.backlog_jobs == 0
