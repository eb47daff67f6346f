"""deadline, completion_window and ttl on /v1/jobs and the OpenAI routes: 400s naming the
field and the limit; accepted values land on the record and steer the queue."""

from __future__ import annotations

import time

import pytest

from tests.gateway.test_api import A, make_client
from tide_fleet.infra.wire.backlog import deadline_backlog
from tide_fleet.infra.wire.protocol import Keys


@pytest.fixture
def client(redis_server, redis_client, tiny_path):
    with make_client(redis_server, str(tiny_path)) as c:
        yield c


JOB = {"prompt": "Once upon a time", "max_tokens": 20}


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"deadline": 1000.0}, "deadline", "not in the future"),
        ({"deadline": "soon"}, "deadline", ""),
        ({"deadline": time.time() + 30 * 86400}, "deadline", "at most 604800 seconds"),
        ({"completion_window": "tomorrow"}, "completion_window", "like '24h'"),
        ({"completion_window": "200h"}, "completion_window", "at most 604800 seconds"),
        ({"ttl": 0}, "ttl", "from 1 to 604800"),
        ({"ttl": 10**7}, "ttl", "from 1 to 604800"),
        ({"deadline": time.time() + 60, "completion_window": "1h"}, "completion_window",
         "not both"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("route", ["/v1/jobs", "/v1/completions", "/v1/chat/completions"])
def test_bad_timing_fields_are_refused_naming_the_field(client, redis_client, extra, param,
                                                       says, route):  # fmt: skip
    body = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in route else JOB
    r = client.post(route, json={**body, **extra}, headers=A)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"]
    assert not redis_client.keys("tide.*")  # nothing enqueued


def test_timing_fields_set_the_record_and_the_deadline_queue(client, redis_client):
    deadline = time.time() + 600
    first = client.post("/v1/jobs", json={**JOB, "deadline": deadline}, headers=A).json()
    r = client.post("/v1/jobs", json={**JOB, "completion_window": "30m", "ttl": 60}, headers=A)
    second = r.json()
    record = {
        k.decode(): v.decode() for k, v in redis_client.hgetall(Keys.job(first["id"])).items()
    }
    assert float(record["deadline"]) == float(record["expire_at"]) == deadline
    other = redis_client.hgetall(Keys.job(second["id"]))
    created = float(other[b"created_at"])
    assert float(other[b"deadline"]) == pytest.approx(created + 1800)
    assert float(other[b"expire_at"]) == pytest.approx(created + 60)
    assert redis_client.zcard(Keys.deadline_queue("tide.short.interactive")) == 2
    assert [t for _, t in deadline_backlog(redis_client, "short")] == [37, 37]  # 17 + 20


def test_the_job_shows_its_deadline_ttl_and_expiry(client):
    deadline = time.time() + 600
    job = client.post("/v1/jobs", json={**JOB, "deadline": deadline, "ttl": 60}, headers=A).json()
    for shown in (job, client.get(f"/v1/jobs/{job['id']}", headers=A).json()):
        assert shown["deadline"] == deadline and shown["ttl"] == 60
        assert shown["expires_at"] == pytest.approx(shown["created_at"] + 60)
    plain = client.post("/v1/jobs", json=JOB, headers=A).json()
    assert plain["deadline"] is None and plain["ttl"] is None and plain["expires_at"] is None
