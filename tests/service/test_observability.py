"""Live metrics on the real fleet: workers advertise scrapable endpoints, doctor reads them all."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.service.conftest import wait_done, wait_for
from tide_fleet.infra.doctor.scrape import Scrape

pytestmark = pytest.mark.slow


def _metric_urls(fleet_redis) -> list[str]:  # type: ignore[no-untyped-def]
    urls = []
    for worker_id in fleet_redis.zrange("tide:workers", 0, -1):
        url = fleet_redis.hget(b"tide:worker:" + worker_id, "metrics_url")
        if url:
            urls.append(url.decode())
    return urls


def test_worker_endpoints_and_doctor_on_a_live_fleet(api, fleet, fleet_redis, capsys):
    urls = wait_for(lambda: _metric_urls(fleet_redis), timeout=30)
    body = {"prompt": "Once upon a time", "max_tokens": 12, "ignore_eos": True}
    job = wait_done(api, api.post("/v1/jobs", json=body).json()["id"])
    assert job["status"] == "completed"
    scrapes = [Scrape.parse(httpx.get(u, timeout=5).text) for u in _metric_urls(fleet_redis)]
    assert sum(s.total("tide:generation_tokens_total") or 0 for s in scrapes) >= 12
    assert sum(s.total("tide:request_queue_time_seconds_count") or 0 for s in scrapes) >= 1

    from tide_fleet.infra.cli.main import main

    args = ["doctor", "--url", fleet.url, "--redis-url", fleet.redis.url, "--interval", "0.5",
            "--json"]  # fmt: skip
    assert main(args) in (0, 1)  # an idle test fleet may well show findings
    report = json.loads(capsys.readouterr().out)
    assert urls and report["gateway"] and len(report["workers"]) >= 1
    assert not [e for e in report["errors"] if "worker" in e], report["errors"]
    # The workers' heartbeats and the gateway's backlog name the model alike: the doctor
    # matches each queue with the workers of its own model.
    gateway = Scrape.parse(httpx.get(f"{fleet.url}/metrics", timeout=5).text)
    assert set(report["models"]) == set(gateway.by_label("tide:backlog_jobs", "model")) != {""}
