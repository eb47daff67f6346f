"""The reaper: an outage grace before leases are reaped, done events, dead worker ids."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.conftest import wait_for
from tide_fleet.infra.fleet.reaper import OutageGrace, Reaper
from tide_fleet.infra.fleet.redis_server import EmbeddedRedis, free_port
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.new_job import NewJob
from tide_fleet.infra.wire.protocol import JobStatus, Keys


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _create(store: JobStore, job_id: str) -> None:
    fields = {"id": job_id, "tenant": "t", "status": "queued", "bucket": "short",
              "priority": "interactive", "created_at": time.time()}  # fmt: skip
    store.create(NewJob(fields, "tide.short.interactive", "msg", None, 10, 10, 10, 3600))


def _running(store: JobStore, job_id: str, lease_seconds: float) -> str:
    _create(store, job_id)
    status, token, _ = store.acquire(job_id, "w", lease_seconds)
    assert status == "acquired" and store.mark_started(job_id, token)
    return token


def _uptime(client: redis.Redis) -> int:
    return int(client.info("server")["uptime_in_seconds"])


def test_grace_after_the_reaper_lost_redis():
    clock = FakeClock()
    grace = OutageGrace(lease_seconds=5, margin=2, clock=clock)
    assert grace.remaining(redis_uptime=3600) == 7  # a new reaper has not seen Redis up yet
    clock.t += 7
    assert grace.remaining(redis_uptime=3600) == 0
    grace.note_error()
    clock.t += 6.5
    assert grace.remaining(redis_uptime=3600) == pytest.approx(0.5)
    clock.t += 0.5
    assert grace.remaining(redis_uptime=3600) == 0


def test_grace_after_redis_restarted():
    clock = FakeClock()
    grace = OutageGrace(lease_seconds=5, margin=2, clock=clock)
    clock.t += 3600
    assert grace.remaining(redis_uptime=3) == 4  # a restart the reaper never saw
    assert grace.remaining(redis_uptime=7) == 0


def test_reaper_holds_expired_leases_and_dead_workers_during_the_grace(redis_client):
    clock = FakeClock()
    reaper = Reaper(redis_client, Settings(), grace=OutageGrace(0.2, margin=0, clock=clock))
    wait_for(lambda: _uptime(redis_client) >= 2, what="the fixture Redis to be up 2 s")
    _running(reaper.store, "job_x", lease_seconds=0.01)
    redis_client.zadd(Keys.workers, {"w-dead": time.time() - 600})
    time.sleep(0.05)  # the lease expires
    reaper.grace.note_error()
    assert reaper.reap_once() == {}
    assert reaper.store.get("job_x")["status"] == "in_progress"
    assert redis_client.zscore(Keys.workers, "w-dead") is not None
    clock.t += 0.2
    assert reaper.reap_once() == {"job_x": "requeued"}
    assert redis_client.zscore(Keys.workers, "w-dead") is None


def test_a_redis_error_starts_the_grace():
    nowhere = redis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))  # nobody listens
    reaper = Reaper(nowhere, Settings(), grace=OutageGrace(5, clock=FakeClock()))
    with pytest.raises(redis.ConnectionError):
        reaper.reap_once()
    assert reaper.grace.remaining(redis_uptime=3600) > 5


@pytest.mark.slow
def test_a_lease_that_expired_in_a_redis_outage_survives_if_refreshed_in_the_grace(
    tmp_path: Path,
):
    server = EmbeddedRedis(tmp_path / "redis").start()
    try:
        client = redis.Redis.from_url(server.url)
        client.config_set("appendfsync", "always")  # every write below survives the kill
        reaper = Reaper(client, Settings(lease_seconds=1.0), grace=OutageGrace(1.0, margin=0.5))
        store = reaper.store
        alive = _running(store, "job_alive", lease_seconds=1.0)  # its worker survives
        dead = _running(store, "job_dead", lease_seconds=1.0)  # its worker dies meanwhile
        server.kill()
        with pytest.raises(redis.RedisError):
            reaper.reap_once()
        # Both leases expire while Redis is down. The reaper tries no pass meanwhile, so
        # only Redis' own uptime tells it that Redis just came back.
        time.sleep(1.2)
        server.start()
        back_at = time.monotonic()
        assert client.zscore(Keys.leases, "job_alive") < time.time()  # expired
        while not (out := reaper.reap_once()):
            assert store.refresh({"job_alive": alive}, 1.0) == {"job_alive": "0"}
            time.sleep(0.1)
        assert time.monotonic() - back_at >= 1.5  # the grace held it back
        assert out == {"job_dead": "requeued"}
        assert store.get("job_alive")["lease_token"] == alive
        assert store.refresh({"job_alive": alive}, 1.0) == {"job_alive": "0"}
        # The dead worker's late result is dropped: no record change, no done event.
        assert store.refresh({"job_dead": dead}, 1.0) == {"job_dead": "lost"}
        assert not store.finish("job_dead", dead, "t", JobStatus.COMPLETED, events_ttl=60)
        assert store.get("job_dead")["status"] == "queued"
        assert client.xlen(Keys.events("job_dead")) == 0
        client.close()
    finally:
        server.kill()


def test_dead_workers_leave_the_registry_with_their_drain_flags(redis_client):
    now = time.time()
    old = now - 120
    redis_client.zadd(Keys.workers, {"w-dead": old, "w-recent": now - 10, "w-alive": old})
    redis_client.hset(Keys.worker("w-alive"), "at", now)  # its heartbeat is still there
    for w in ("w-dead", "w-recent", "w-alive"):
        redis_client.set(Keys.drain(w), "1")
    reaper = Reaper(redis_client, Settings())
    assert reaper.prune_workers(now=now) == ["w-dead"]
    assert {w.decode() for w in redis_client.zrange(Keys.workers, 0, -1)} == {
        "w-recent",
        "w-alive",
    }
    assert not redis_client.exists(Keys.drain("w-dead"))
    assert redis_client.exists(Keys.drain("w-recent"), Keys.drain("w-alive")) == 2


def test_reaper_passes_end_event_streams_of_jobs_it_fails(redis_client):
    settings = Settings(max_attempts=1, events_ttl_seconds=60)
    reaper = Reaper(redis_client, settings, grace=OutageGrace(0, margin=0))
    _running(reaper.store, "job_x", lease_seconds=0.01)
    time.sleep(0.05)
    assert reaper.reap_once() == {"job_x": "failed"}
    ((_, fields),) = redis_client.xrange(Keys.events("job_x"))
    assert fields == {b"type": b"done", b"status": b"failed"}
