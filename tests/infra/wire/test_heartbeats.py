"""The worker heartbeat: one typed object, stored exactly as workers always wrote it."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aredis

from tide_fleet.infra.wire.heartbeats import Heartbeat, read_heartbeats, read_heartbeats_async
from tide_fleet.infra.wire.protocol import Keys

BEAT = Heartbeat(
    worker_id="pool-a-host-1", pool="pool-a", buckets=("short", "medium"), pid=4242,
    host="host", running=2, waiting=1, held=3, free_slots=13, kv_cache_usage=0.1234,
    tokens_per_s=56.78, draining=True, served_work_total=9000, idle_since=None,
    instance_id="i-0abc", metrics_url="http://127.0.0.1:9401/metrics", at=1712345678.123456,
)  # fmt: skip


def legacy_mapping(b: Heartbeat) -> dict[str, object]:
    """What worker/service.py passed to HSET before the heartbeat had a type."""
    return {
        "worker_id": b.worker_id, "pool": b.pool, "buckets": ",".join(b.buckets), "pid": b.pid,
        "host": b.host, "running": b.running, "waiting": b.waiting, "held": b.held,
        "free_slots": b.free_slots, "kv_cache_usage": b.kv_cache_usage,
        "tokens_per_s": b.tokens_per_s, "draining": int(b.draining),
        "served_work_total": b.served_work_total,
        "idle_since": "" if b.idle_since is None else b.idle_since,
        "instance_id": b.instance_id, "metrics_url": b.metrics_url, "at": b.at,
    }  # fmt: skip


def beat(r, worker_id: str, mapping: dict[str, str], ttl: int = 30) -> None:  # type: ignore[no-untyped-def]
    r.hset(Keys.worker(worker_id), mapping=mapping)
    r.expire(Keys.worker(worker_id), ttl)
    r.zadd(Keys.workers, {worker_id: time.time()})


def test_the_redis_hash_is_byte_for_byte_what_workers_wrote(redis_client):
    for b in (BEAT, Heartbeat(worker_id="w", idle_since=1712345600.5, kv_cache_usage=0.0)):
        redis_client.hset("legacy", mapping=legacy_mapping(b))  # type: ignore[arg-type]
        redis_client.hset("typed", mapping=b.to_hash())  # type: ignore[arg-type]
        assert redis_client.hgetall("typed") == redis_client.hgetall("legacy")
        redis_client.delete("legacy", "typed")


def test_round_trip():
    assert Heartbeat.from_hash(BEAT.to_hash()) == BEAT
    idle = Heartbeat(worker_id="w", pool="p", idle_since=1712345600.5)
    assert Heartbeat.from_hash(idle.to_hash()) == idle
    assert BEAT.to_hash()["draining"] == "1" and idle.to_hash()["idle_since"] == "1712345600.5"
    assert idle.to_hash()["buckets"] == "" and BEAT.to_hash()["buckets"] == "short,medium"
    started = Heartbeat(worker_id="w", model="b", cold_start_s=3.25)
    assert started.to_hash()["cold_start_s"] == "3.25"
    assert Heartbeat.from_hash(started.to_hash()) == started


def test_fields_an_older_worker_did_not_write_take_their_defaults():
    old = Heartbeat.from_hash({"pool": "p", "buckets": "short", "idle_since": ""}, "w-old")
    assert old == Heartbeat(worker_id="w-old", pool="p", buckets=("short",))
    assert not old.draining and not old.is_busy and old.idle_since is None
    assert Heartbeat.from_hash({}, "w") == Heartbeat(worker_id="w")


def test_read_heartbeats_skips_expired_workers(redis_client):
    beat(redis_client, BEAT.worker_id, BEAT.to_hash())
    beat(redis_client, "w-partial", {"pool": "p"})  # no worker_id field: named by its id
    redis_client.zadd(Keys.workers, {"w-gone": time.time()})  # its hash expired
    beats = read_heartbeats(redis_client)
    assert list(beats) == [BEAT.worker_id, "w-partial"]
    assert beats[BEAT.worker_id] == BEAT
    assert beats["w-partial"] == Heartbeat(worker_id="w-partial", pool="p")


def test_the_async_reader_reads_the_same(redis_server, redis_client):
    beat(redis_client, BEAT.worker_id, BEAT.to_hash())
    redis_client.zadd(Keys.workers, {"w-gone": time.time()})

    async def read() -> dict[str, Heartbeat]:
        client = aredis.Redis.from_url(redis_server.url)
        try:
            return await read_heartbeats_async(client)
        finally:
            await client.aclose()

    assert asyncio.run(read()) == read_heartbeats(redis_client) == {BEAT.worker_id: BEAT}
    redis_client.flushdb()
    assert asyncio.run(read()) == {}


def test_adapters_round_trip_and_a_worker_without_any_writes_the_old_hash():
    lora = Heartbeat(worker_id="w", adapters=("a", "b/v2"), adapters_on_device=("b/v2",))
    raw = lora.to_hash()
    assert raw["adapters"] == "a,b/v2" and raw["adapters_on_device"] == "b/v2"
    assert Heartbeat.from_hash(raw) == lora
    assert "adapters" not in BEAT.to_hash() and "adapters_on_device" not in BEAT.to_hash()
    assert Heartbeat.from_hash({"pool": "p"}).adapters == ()
