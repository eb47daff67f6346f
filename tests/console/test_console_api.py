"""The console's JSON endpoints in process (FastAPI TestClient) on a real Redis: who sees
what, the job list from the recent-jobs index, the fleet view, batch progress, and the
offline docs."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from tide_fleet.gateway.app import create_app
from tide_fleet.infra.batches.store import BatchStore
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire import fleet_status
from tide_fleet.infra.wire.heartbeats import Heartbeat
from tide_fleet.infra.wire.protocol import Keys

KEYS = {"key-a": "tenant-a", "key-b": "tenant-b"}
A, B = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
OP = {"Authorization": "Bearer key-op"}


def make(redis_server, model, **overrides) -> TestClient:
    settings = Settings(redis_url=redis_server.url, model=model, bucket_short_max=64,
                        bucket_medium_max=256, **{"api_keys": KEYS, "admin_keys": ["key-op"],
                                                  **overrides})  # fmt: skip
    return TestClient(create_app(settings))


@pytest.fixture
def client(redis_server, redis_client, tiny_path):
    with make(redis_server, str(tiny_path)) as c:
        yield c


def submit(client, headers, max_tokens=4, prompt="hello"):
    r = client.post("/v1/jobs", json={"prompt": prompt, "max_tokens": max_tokens}, headers=headers)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def test_me_says_who_the_key_is(client):
    assert client.get("/console/api/me").json()["accepted"] is False  # 200: the page asks
    a = client.get("/console/api/me", headers=A).json()
    assert (a["accepted"], a["tenant"], a["operator"], a["auth"]) == (True, "tenant-a", False, True)
    op = client.get("/console/api/me", headers=OP).json()
    assert (op["tenant"], op["operator"]) == (None, True)


def test_a_tenant_lists_only_its_own_jobs_newest_first(client):
    mine = [submit(client, A), submit(client, A, max_tokens=100)]  # short, then medium
    theirs = submit(client, B)

    def listed(**params: str) -> list[dict]:
        return client.get("/console/api/jobs", params=params, headers=A).json()["data"]

    got = client.get("/console/api/jobs", headers=A).json()
    assert [j["id"] for j in got["data"]] == mine[::-1] and got["tenant"] == "tenant-a"
    assert theirs not in str(got)
    assert [j["bucket"] for j in got["data"]] == ["medium", "short"]
    assert [j["id"] for j in listed(bucket="short")] == [mine[0]]
    assert len(listed(status="queued")) == 2 and listed(status="completed") == []
    model = client.get("/console/api/me", headers=A).json()["models"][0]
    assert len(listed(model=model)) == 2 and listed(model="other") == []
    assert client.get("/console/api/jobs", headers=B).json()["data"][0]["id"] == theirs
    assert client.get("/console/api/jobs").status_code == 401
    assert client.get("/console/api/jobs", headers=OP).status_code == 403  # no tenant's key


def test_the_list_reads_a_bounded_window_and_forgets_expired_jobs(client, redis_client):
    ids = [submit(client, A) for _ in range(5)]
    redis_client.delete(Keys.job(ids[0]), Keys.job(ids[1]))  # as if their TTL ran out
    got = client.get("/console/api/jobs", params={"limit": 2}, headers=A).json()
    assert [j["id"] for j in got["data"]] == [ids[4], ids[3]]
    client.get("/console/api/jobs", headers=A)
    assert redis_client.zcard(Keys.tenant_jobs("tenant-a")) == 3


def test_a_job_detail_is_its_tenants_only(client):
    job_id = submit(client, A)
    got = client.get(f"/console/api/jobs/{job_id}", headers=A).json()
    assert got["status"] == "queued" and got["max_tokens"] == 4 and got["worker"] is None
    assert got["timings"]["queued_at"] and got["attempts"] == 0
    assert client.get(f"/console/api/jobs/{job_id}", headers=B).status_code == 404


def test_the_fleet_view_is_for_operators(client, redis_client):
    now = time.time()
    beat = Heartbeat(
        worker_id="w1",
        pool="gpu",
        buckets=("short",),
        held=2,
        running=2,
        tokens_per_s=42.0,
        at=now,
        metrics_url="http://127.0.0.1:1/metrics",
    )
    redis_client.hset(Keys.worker("w1"), mapping=beat.to_hash())
    redis_client.zadd(Keys.workers, {"w1": now})
    pipe = redis_client.pipeline()
    status = fleet_status.PoolStatus("gpu", "scale_out", 1, 2, "backlog", now, {"starting": 1})
    fleet_status.record(pipe, [status], fleet_status.FleetSample(now, 1, 2, 1, 42.0))
    pipe.execute()
    submit(client, A)
    assert client.get("/console/api/fleet", headers=A).status_code == 403
    got = client.get("/console/api/fleet", params={"history": 1}, headers=OP).json()
    (pool,) = got["pools"]
    assert pool["workers"] == {"starting": 1, "idle": 0, "busy": 1, "draining": 0}
    assert (pool["actual"], pool["desired"], pool["decision"]["reason"]) == (2, 2, "backlog")
    (worker,) = got["workers"]
    assert worker["state"] == "busy" and worker["tokens_per_s"] == 42.0
    assert worker["mfu"] is None  # its metrics endpoint does not answer: no figures
    short = next(b for b in got["buckets"] if b["bucket"] == "short")
    assert short["queued"] == 1 and short["queue_depth"]["interactive"] == 1
    assert {t["tenant"]: t["active"] for t in got["tenants"]} == {"tenant-a": 1, "tenant-b": 0}
    assert got["decisions"][0]["action"] == "scale_out" and len(got["history"]) == 1
    assert client.get("/console/api/fleet", headers=OP).json()["history"] == []  # only if asked


def test_with_no_keys_at_all_everyone_is_the_default_tenant_and_operator(
    redis_server, redis_client, tiny_path
):
    with make(redis_server, str(tiny_path), api_keys={}, admin_keys=[]) as c:
        me = c.get("/console/api/me").json()
        assert (me["tenant"], me["operator"], me["auth"]) == ("default", True, False)
        assert c.get("/console/api/fleet").status_code == 200


def test_batch_progress_moves_with_the_job_counters(client, redis_client):
    now = time.time()
    BatchStore(redis_client).create({
        "id": "batch_1", "tenant": "tenant-a", "endpoint": "/v1/completions",
        "input_file_id": "file_1", "completion_window": "24h", "status": "in_progress",
        "created_at": now - 20, "in_progress_at": now - 10, "expires_at": now + 3600,
        "total": 10, "completed": 0, "failed": 0, "jobs_terminal": 4, "jobs_completed": 3,
        "refused": 1,
    })  # fmt: skip
    (batch,) = client.get("/console/api/batches", headers=A).json()["data"]
    p = batch["progress"]
    assert (p["total"], p["completed"], p["failed"], p["fraction"]) == (10, 3, 2, 0.5)
    assert p["eta_s"] == pytest.approx(10, rel=0.1)  # 5 done in 10 s, 5 to go
    assert client.get("/console/api/batches", headers=B).json()["data"] == []


def test_the_page_and_the_docs_load_nothing_from_elsewhere(client):
    page = client.get("/console")
    assert page.status_code == 200
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert "http" not in page.text.replace("http-equiv", "")
    for path in ("/docs", "/redoc"):
        html = client.get(path).text
        assert "cdn" not in html and "/docs-assets/" in html
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js"):
        assert client.get(f"/docs-assets/{asset}").status_code == 200
    assert client.get("/console/static/vendor/uPlot.iife.min.js").status_code == 200
    assert "/console" not in str(client.get("/openapi.json").json()["paths"])
