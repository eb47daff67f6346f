"""A synchronous OpenAI route whose job does not complete answers a clear error, not a 500."""

from __future__ import annotations

import threading

import pytest

from tests.conftest import wait_for
from tests.gateway.test_api import A, make_client
from tide_fleet.infra.wire.protocol import Keys

pytestmark = pytest.mark.timeout(60)  # a request that waits for a worker fails, not hangs

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture
def client(redis_server, redis_client, tiny_path):
    with make_client(redis_server, str(tiny_path)) as c:
        yield c


def waiting_request(client, path: str, body: dict):  # type: ignore[no-untyped-def]
    """Send the request in a thread (it waits for the job); return (result holder, job id)."""
    result: dict = {}
    thread = threading.Thread(
        target=lambda: result.update(r=client.post(path, json=body, headers=A)), daemon=True
    )
    thread.start()
    r = client.app.state.tide.redis  # the gateway's own Redis client

    def the_job() -> str | None:
        keys = r.keys("tide:job:*")
        return keys[0].decode().removeprefix("tide:job:") if keys else None

    job_id = wait_for(the_job, timeout=10, what="the job record")
    return thread, result, job_id


def finish(redis_client, job_id: str, status: str, error: str) -> None:  # type: ignore[no-untyped-def]
    """What a worker (or the reaper) writes when a job ends without completing."""
    redis_client.hset(Keys.job(job_id), mapping={"status": status, "error": error})
    redis_client.xadd(Keys.events(job_id), {"type": "done", "status": status})


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_cancelled_job_is_a_409_with_its_id(client, path):
    body = {"prompt": "hi", "max_tokens": 4} if path == "/v1/completions" else CHAT
    thread, result, job_id = waiting_request(client, path, body)
    assert client.delete(f"/v1/jobs/{job_id}", headers=A).status_code == 200
    thread.join(10)
    r = result["r"]
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert job_id in error["message"] and "cancelled" in error["message"]
    assert error["code"] == "job_cancelled" and error["type"] == "invalid_request_error"


def test_a_job_the_worker_rejected_is_a_400(client, redis_client):
    thread, result, job_id = waiting_request(client, "/v1/completions", {"prompt": "hi"})
    finish(redis_client, job_id, "failed", "rejected by the worker: top_k must be -1 or >= 1")
    thread.join(10)
    r = result["r"]
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert job_id in error["message"] and "rejected by the worker" in error["message"]
    assert error["code"] == "job_rejected"


def test_a_job_that_failed_inside_is_a_500_with_its_id(client, redis_client):
    thread, result, job_id = waiting_request(client, "/v1/completions", {"prompt": "hi"})
    finish(redis_client, job_id, "failed", "lease expired after 3 attempts")
    thread.join(10)
    r = result["r"]
    assert r.status_code == 500, r.text
    error = r.json()["error"]
    assert job_id in error["message"] and "lease expired" in error["message"]
    assert error["type"] == "server_error" and error["code"] == "job_failed"
