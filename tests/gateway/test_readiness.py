"""/readyz means "can serve": Redis, the tokenizer, and the live workers per pool."""

from __future__ import annotations

import time

from tests.gateway.test_api import make_client
from tide_fleet.infra.wire.protocol import Keys


def heartbeat(r, worker_id: str, pool: str, draining: bool = False, ttl: int = 30) -> None:  # type: ignore[no-untyped-def]
    """What a worker writes (worker/service.py): a hash with a TTL, listed in a zset."""
    key = Keys.worker(worker_id)
    r.hset(key, mapping={"pool": pool, "buckets": "short,medium", "draining": int(draining),
                         "at": time.time(), "worker_id": worker_id})  # fmt: skip
    r.expire(key, ttl)
    r.zadd(Keys.workers, {worker_id: time.time()})


def test_no_worker_yet_is_ready_where_the_fleet_scales_from_zero(
    redis_server, redis_client, tiny_path
):
    with make_client(redis_server, str(tiny_path)) as c:
        r = c.get("/readyz")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "ready" and body["workers"] == 0
    assert body["checks"] == {"tokenizer": True, "redis": True, "workers": False}
    assert "no worker yet" in body["detail"]


def test_no_worker_yet_is_not_ready_when_workers_are_required(
    redis_server, redis_client, tiny_path
):
    with make_client(redis_server, str(tiny_path), ready_requires_workers=True) as c:
        r = c.get("/readyz")
        assert r.status_code == 503, r.text
        assert r.json()["status"] == "not ready" and "no worker yet" in r.json()["detail"]
        heartbeat(redis_client, "w-1", "gpu")
        r = c.get("/readyz")
        assert r.status_code == 200, r.text


def test_workers_are_counted_per_pool(redis_server, redis_client, tiny_path):
    heartbeat(redis_client, "w-1", "gpu")
    heartbeat(redis_client, "w-2", "gpu")
    heartbeat(redis_client, "w-3", "big", draining=True)
    redis_client.zadd(Keys.workers, {"w-gone": time.time() - 60})  # its hash expired
    with make_client(redis_server, str(tiny_path), ready_requires_workers=True) as c:
        body = c.get("/readyz").json()
    assert body["workers"] == 2  # draining workers take no new jobs
    assert body["pools"] == {
        "gpu": {"workers": 2, "draining": 0, "buckets": ["medium", "short"]},
        "big": {"workers": 0, "draining": 1, "buckets": ["medium", "short"]},
    }
    assert body["model"] == str(tiny_path)


def test_only_draining_workers_are_not_ready_when_workers_are_required(
    redis_server, redis_client, tiny_path
):
    heartbeat(redis_client, "w-3", "big", draining=True)
    with make_client(redis_server, str(tiny_path), ready_requires_workers=True) as c:
        r = c.get("/readyz")
    assert r.status_code == 503 and "draining" in r.json()["detail"]


def test_redis_down_is_not_ready(tiny_path):
    from fastapi.testclient import TestClient

    from tide_fleet.gateway.app import create_app
    from tide_fleet.infra.fleet.redis_server import free_port
    from tide_fleet.infra.settings import Settings

    settings = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0", model=str(tiny_path))
    with TestClient(create_app(settings)) as c:
        r = c.get("/readyz")
    assert r.status_code == 503 and r.json()["checks"]["redis"] is False
