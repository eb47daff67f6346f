"""A Redis outage is weather, not death: a worker started while Redis is down waits for it,
and a worker whose Redis goes away mid-generation keeps generating and writes what it
holds when Redis is back (real redis-server processes, killed for real)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import redis

from tests.conftest import make_engine, wait_for
from tide_fleet.infra.fleet.redis_server import EmbeddedRedis, free_port
from tide_fleet.infra.jobs.schemas import JobCreate
from tide_fleet.infra.jobs.submission import ModelInfo, build_job
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.protocol import Keys
from tide_fleet.worker.service import WorkerService


def _settings(url: str, model: Path) -> Settings:
    return Settings(redis_url=url, model=str(model), worker_heartbeat_seconds=0.2,
                    worker_metrics_port=-1, lease_seconds=2)  # fmt: skip


def _submit(url: str, model: Path, max_tokens: int) -> str:
    settings = _settings(url, model)
    store = JobStore(redis.Redis.from_url(url))
    body = JobCreate(prompt="once upon a time", max_tokens=max_tokens, ignore_eos=True)
    return store.create(build_job(settings, ModelInfo.load(str(model)), "t", body, None))["id"]


def _record(url: str, job_id: str) -> dict[str, str]:
    try:
        return JobStore(redis.Redis.from_url(url)).get(job_id) or {}
    except redis.RedisError:
        return {}


def test_a_worker_started_while_redis_is_down_waits_for_it(tmp_path, tiny_path):
    port = free_port()
    server = EmbeddedRedis(tmp_path / "redis", port=port)
    url = server.url
    service = WorkerService(make_engine(tiny_path), _settings(url, tiny_path), "p", ["short"])
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:
        time.sleep(1.0)  # a few failed connection attempts
        assert thread.is_alive(), "the worker died while Redis was down"
        server.start()
        job_id = _submit(url, tiny_path, 4)
        wait_for(lambda: _record(url, job_id).get("status") == "completed", timeout=30,
                 what="the job completed once Redis was up")  # fmt: skip
    finally:
        service.stopped = True
        thread.join(timeout=10)
        server.stop()


def test_a_worker_keeps_generating_through_an_outage_and_saves_when_redis_is_back(
    tmp_path, tiny_path
):
    server = EmbeddedRedis(tmp_path / "redis").start()
    url = server.url
    engine = make_engine(tiny_path)
    service = WorkerService(engine, _settings(url, tiny_path), "p", ["short"], "w-outage")
    steps_while_down: list[int] = []
    real_step = engine.step
    down = threading.Event()

    def slow_step():  # type: ignore[no-untyped-def]
        time.sleep(0.01)  # so the job outlives the kill
        if down.is_set():
            steps_while_down.append(1)
        return real_step()

    engine.step = slow_step  # type: ignore[method-assign]
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:
        job_id = _submit(url, tiny_path, 200)
        wait_for(lambda: _record(url, job_id).get("first_token_at"), timeout=30,
                 what="the job to start")  # fmt: skip
        server.kill()  # kill -9 mid-generation
        down.set()
        time.sleep(1.5)
        assert thread.is_alive(), "the worker exited on a Redis outage"
        assert steps_while_down, "the engine stopped generating while Redis was away"
        assert service.held, "the job was dropped during the outage"
        server.start()  # same port and AOF folder
        down.clear()
        record = wait_for(
            lambda: (r := _record(url, job_id)).get("status") == "completed" and r,
            timeout=30, what="the result written after Redis came back",
        )  # fmt: skip
        assert record["completion_tokens"] == "200"
        assert record["attempts"] == "1", "the job was run again instead of saved"
        events = redis.Redis.from_url(url).xrange(Keys.events(job_id))
        text = "".join(f[b"text"].decode() for _, f in events if f[b"type"] == b"delta")
        assert text == record["text"], "deltas generated during the outage were lost"
        assert thread.is_alive()
    finally:
        service.stopped = True
        thread.join(timeout=10)
        server.stop()
