"""A running worker advertises its metrics URL in the heartbeat and serves real numbers there."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.conftest import make_engine
from tests.gateway.test_gateway_metrics import A, job, make_client
from tide_fleet.infra.doctor.scrape import Scrape
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire.protocol import Keys
from tide_fleet.worker.service import WorkerService


def wait_for(predicate, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_heartbeat_carries_a_scrapable_metrics_url(redis_server, redis_client, tiny_path):
    settings = Settings(redis_url=redis_server.url, worker_heartbeat_seconds=0.2,
                        worker_device="h200")  # fmt: skip
    service = WorkerService(make_engine(tiny_path), settings, "pool-a", ["short"], "w-metrics")
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:
        url = wait_for(lambda: redis_client.hget(Keys.worker("w-metrics"), "metrics_url"))
        url = url.decode()
        assert url.startswith("http://127.0.0.1:") and url == service.metrics_url
        with make_client(redis_server, tiny_path) as gateway:
            # ignore_eos: a sampled EOS would end the job early and change every count.
            body = job(6) | {"ignore_eos": True}
            job_id = gateway.post("/v1/jobs", json=body, headers=A).json()["id"]

            def done():  # type: ignore[no-untyped-def]
                status = gateway.get(f"/v1/jobs/{job_id}", headers=A).json()["status"]
                return status not in ("queued", "in_progress")

            wait_for(done)
        s = Scrape.parse(httpx.get(url, timeout=5).text)
        labels = {"pool": "pool-a"}
        assert s.total("tide:generation_tokens_total", **labels) == 6
        assert s.total("tide:request_queue_time_seconds_count", **labels) == 1
        assert s.total("tide:e2e_request_latency_seconds_count", **labels) == 1
        assert s.total("tide:mbu_ema", **labels) > 0
    finally:
        service.drain()
        thread.join(timeout=30)
    assert not thread.is_alive()
    with pytest.raises(httpx.HTTPError):  # the endpoint goes away with the worker
        httpx.get(url, timeout=1)
