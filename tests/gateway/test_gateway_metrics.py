"""Gateway /metrics: rejections carry their reason; backlog per bucket is read at scrape time."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tide_fleet.gateway.app import create_app
from tide_fleet.infra.doctor.scrape import Scrape
from tide_fleet.infra.settings import Settings

A = {"Authorization": "Bearer key-a"}


def make_client(redis_server, tiny_path, **overrides) -> TestClient:
    settings = Settings(
        redis_url=redis_server.url, model=str(tiny_path), api_keys={"key-a": "tenant-a"},
        bucket_short_max=64, bucket_medium_max=256, **overrides,
    )  # fmt: skip
    return TestClient(create_app(settings))


def rejections(client: TestClient) -> dict[str, float]:
    text = client.get("/metrics").text
    return Scrape.parse(text).by_label("tide:gateway_rejections_total", "reason")


def grew(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v > before.get(k, 0)}


def job(max_tokens: int = 8) -> dict:
    return {"prompt": "Once upon a time", "max_tokens": max_tokens}


def test_rejections_by_reason(redis_server, redis_client, tiny_path):
    with make_client(redis_server, tiny_path) as c:
        before = rejections(c)
        assert c.post("/v1/jobs", json={"prompt": "a", "top_p": 2}, headers=A).status_code == 400
        assert c.post("/v1/jobs", json=job(1023), headers=A).status_code == 400  # > context
        assert c.post("/v1/jobs", json=job()).status_code == 401
        assert c.get("/v1/jobs/job_nope", headers=A).status_code == 404
        assert grew(before, rejections(c)) == {"validation": 2, "auth": 1, "not_found": 1}


@pytest.mark.parametrize(
    ("limit", "reason"),
    [
        ({"max_queue_length": 1}, "queue_full"),
        ({"max_queued_per_tenant": 1}, "tenant_queue_full"),
        ({"max_requests_per_second_per_tenant": 1}, "rate_limit"),
    ],
)
def test_limit_rejections_name_the_limit(redis_server, redis_client, tiny_path, limit, reason):
    with make_client(redis_server, tiny_path, **limit) as c:
        before = rejections(c)
        codes = [c.post("/v1/jobs", json=job(), headers=A).status_code for _ in range(4)]
        assert codes[0] == 202 and 429 in codes
        assert grew(before, rejections(c)) == {reason: codes.count(429)}


def test_backlog_per_bucket_is_read_at_scrape_time(redis_server, redis_client, tiny_path):
    with make_client(redis_server, tiny_path) as c:
        for max_tokens in (8, 10, 100):  # 17 prompt tokens: short, short, medium
            assert c.post("/v1/jobs", json=job(max_tokens), headers=A).status_code == 202
        s = Scrape.parse(c.get("/metrics").text)
        assert s.by_label("tide:backlog_jobs", "bucket") == {"short": 2, "medium": 1, "long": 0}
        assert s.by_label("tide:backlog_jobs", "model") == {str(tiny_path): 3}  # its served name
        tokens = s.by_label("tide:backlog_tokens", "bucket")
        assert tokens == {"short": 17 + 8 + 17 + 10, "medium": 117, "long": 0}
        ages = s.by_label("tide:backlog_oldest_job_age_seconds", "bucket")
        assert 0 <= ages["short"] < 30 and ages["long"] == 0
        assert s.by_label("tide:arrived_jobs_total", "bucket")["short"] == 2
        assert s.total("tide:queue_depth", queue="tide.short.interactive") == 2
        assert s.total("process_cpu_seconds_total") > 0
        redis_client.delete("tide:backlog:short")  # taken by a worker, say
        s = Scrape.parse(c.get("/metrics").text)
        assert s.by_label("tide:backlog_jobs", "bucket")["short"] == 0


def test_backlog_series_are_labelled_by_model_and_bucket():
    from prometheus_client import CollectorRegistry, generate_latest

    from tide_fleet.gateway.metrics import BacklogCollector
    from tide_fleet.infra.wire.backlog import BucketBacklog

    collector, registry = BacklogCollector(), CollectorRegistry()
    registry.register(collector)
    collector.latest = {
        "a": {"short": BucketBacklog(1, 10, 2.0, 7, 70)},
        "b": {"short": BucketBacklog(5, 50, 9.0, 8, 80)},
    }
    s = Scrape.parse(generate_latest(registry).decode())
    expected = [
        ("tide:backlog_jobs", 1, 5),
        ("tide:backlog_tokens", 10, 50),
        ("tide:backlog_oldest_job_age_seconds", 2, 9),
        ("tide:arrived_jobs_total", 7, 8),
        ("tide:arrived_tokens_total", 70, 80),
    ]
    for name, a, b in expected:
        assert s.total(name, model="a", bucket="short") == a, name
        assert s.total(name, model="b", bucket="short") == b, name


def test_each_served_models_backlog_is_read_at_scrape_time(redis_server, redis_client, tiny_path):
    models = [{"name": "tiny", "model": str(tiny_path)}, {"name": "other", "model": str(tiny_path)}]
    with make_client(redis_server, tiny_path, served_models=models) as c:
        assert c.post("/v1/jobs", json=job() | {"model": "other"}, headers=A).status_code == 202
        assert c.post("/v1/jobs", json=job(100), headers=A).status_code == 202
        s = Scrape.parse(c.get("/metrics").text)
        assert s.total("tide:backlog_jobs", model="other", bucket="short") == 1
        assert s.total("tide:backlog_jobs", model="tiny", bucket="medium") == 1
        assert s.total("tide:backlog_jobs", model="tiny", bucket="short") == 0
        assert s.total("tide:backlog_tokens", model="other", bucket="short") == 17 + 8
        assert s.by_label("tide:backlog_jobs", "model") == {"tiny": 1, "other": 1}
