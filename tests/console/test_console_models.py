"""The console of a gateway serving two models: the fleet view's queues per (model, bucket),
pools and workers naming their model, totals per model; the job list's model filter."""

from __future__ import annotations

import time

import pytest

from tests.console.test_console_api import OP, A, B, make
from tide_fleet.infra.wire.heartbeats import Heartbeat
from tide_fleet.infra.wire.protocol import Keys


@pytest.fixture
def two(redis_server, redis_client, tiny_path):
    models = [{"name": "a", "model": str(tiny_path), "aliases": ["alpha"]},
              {"name": "b", "model": str(tiny_path)}]  # fmt: skip
    with make(redis_server, str(tiny_path), served_models=models) as c:
        yield c


def submit(client, headers, model=None, max_tokens=4):
    body = {"prompt": "hello", "max_tokens": max_tokens} | ({"model": model} if model else {})
    r = client.post("/v1/jobs", json=body, headers=headers)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def beat(redis_client, worker_id, pool, model="", tokens_per_s=0.0):
    now = time.time()
    hb = Heartbeat(worker_id=worker_id, pool=pool, model=model, buckets=("short",), at=now,
                   tokens_per_s=tokens_per_s)  # fmt: skip
    redis_client.hset(Keys.worker(worker_id), mapping=hb.to_hash())
    redis_client.zadd(Keys.workers, {worker_id: now})


def test_the_fleet_view_shows_every_models_queues_pools_and_workers(two, redis_client):
    submit(two, A)  # the default model, a
    submit(two, A, model="b")
    submit(two, B, model="b", max_tokens=100)  # b's medium bucket
    beat(redis_client, "w-old", "gpu")  # an older worker names no model: it runs the default
    beat(redis_client, "w-b", "pool-b", model="b", tokens_per_s=10.0)
    beat(redis_client, "w-c", "pool-c", model="c")  # a model this gateway does not serve
    got = two.get("/console/api/fleet", headers=OP).json()

    rows = {(r["model"], r["bucket"]): r for r in got["buckets"]}
    assert list(rows) == [(m, b) for m in ("a", "b") for b in ("short", "medium", "long")]
    assert rows["a", "short"]["queued"] == 1 and rows["a", "medium"]["queued"] == 0
    assert rows["b", "short"]["queued"] == 1 and rows["b", "medium"]["queued"] == 1
    assert rows["b", "short"]["queue_depth"] == {"interactive": 1, "batch": 0}
    assert rows["b", "short"]["backlog_tokens"] > 0 and rows["b", "long"]["backlog_tokens"] == 0

    assert {p["pool"]: p["model"] for p in got["pools"]} == {"gpu": "a", "pool-b": "b",
                                                             "pool-c": "c"}  # fmt: skip
    assert {w["worker_id"]: w["model"] for w in got["workers"]} == {"w-old": "a", "w-b": "b",
                                                                    "w-c": "c"}  # fmt: skip
    models = {m["model"]: m for m in got["models"]}
    assert [m["model"] for m in got["models"]] == ["a", "b", "c"]
    assert (models["a"]["default"], models["a"]["queued"], models["a"]["workers"]) == (True, 1, 1)
    assert (models["b"]["queued"], models["b"]["workers"], models["b"]["tokens_per_s"]) == (
        2, 1, 10.0)  # fmt: skip
    assert models["c"]["queued"] is None and models["c"]["workers"] == 1  # its queues unread
    assert got["totals"]["queued"] == 3 and got["totals"]["workers"] == 3
    assert got["model"] == "a"  # the default, as a one-model gateway answered


def test_the_job_list_filters_by_model_before_its_limit(two, redis_client):
    a_old = submit(two, A)
    a_alias = submit(two, A, model="alpha")
    redis_client.hdel(Keys.job(a_old), "model")  # as written before records named a model
    b_jobs = [submit(two, A, model="b") for _ in range(3)]

    def listed(**params) -> list[str]:
        res = two.get("/console/api/jobs", params=params, headers=A)
        assert res.status_code == 200, res.text
        return [j["id"] for j in res.json()["data"]]

    assert listed(model="b") == b_jobs[::-1]
    assert listed(model="a") == [a_alias, a_old]  # a record naming no model is the default's
    assert listed(model="alpha") == [a_alias, a_old]  # an alias is its model
    assert listed(model="a", limit=1) == [a_alias]  # b's newer jobs do not use up the limit
    assert listed(model="gone") == []
    rows = two.get("/console/api/jobs", headers=A).json()["data"]
    assert [j["model"] for j in rows] == ["b", "b", "b", "a", "a"]
    assert two.get("/console/api/me", headers=A).json()["models"] == ["a", "b"]
