"""The job API in process (FastAPI TestClient) on a real Redis, with no workers."""

from __future__ import annotations

import json
import shutil

import pytest
from fastapi.testclient import TestClient

from tide_fleet.gateway.app import create_app
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.protocol import Keys

KEYS = {"key-a": "tenant-a", "key-b": "tenant-b"}
A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}


def make_client(
    redis_server, model: str, raise_server_exceptions: bool = True, **overrides
) -> TestClient:
    settings = Settings(
        redis_url=redis_server.url, model=model, api_keys=KEYS,
        webhook_allow_hosts=["127.0.0.1"], bucket_short_max=64, bucket_medium_max=256,
        **overrides,
    )  # fmt: skip
    return TestClient(create_app(settings), raise_server_exceptions=raise_server_exceptions)


@pytest.fixture
def client(redis_server, redis_client, tiny_path):
    # dummy:tiny: a byte-level tokenizer (one token per byte plus <s>), context 1024.
    with make_client(redis_server, str(tiny_path)) as c:
        yield c


def queued_messages(r) -> int:
    return sum(r.llen(k) for k in r.keys("tide.*") if r.type(k) == b"list")


def test_submit_and_get(client, redis_client):
    r = client.post("/v1/jobs", json={"prompt": "Once upon a time", "max_tokens": 20}, headers=A)
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["status"] == "queued" and job["bucket"] == "short" and job["id"].startswith("job_")
    got = client.get(f"/v1/jobs/{job['id']}", headers=A).json()
    assert got["usage"]["prompt_tokens"] == 17  # <s> + 16 bytes: the workers' own tokenizer
    assert got["priority"] == "interactive" and got["attempts"] == 0
    assert queues.depth(redis_client, "tide.short.interactive") == 1


@pytest.mark.parametrize(
    ("max_tokens", "bucket"), [(20, "short"), (47, "short"), (48, "medium"), (240, "long")]
)
def test_bucket_by_prompt_plus_max_tokens(client, max_tokens, bucket):
    r = client.post(
        "/v1/jobs", json={"prompt": "Once upon a time", "max_tokens": max_tokens}, headers=A
    )
    assert r.json()["bucket"] == bucket  # 17 prompt tokens: short <= 64 < medium <= 256 < long


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"max_tokens": 5}, 400, "give exactly one of prompt or messages"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400, "exactly one"),
        (
            {"prompt": "a", "max_tokens": 0},
            400,
            "max_tokens: Input should be greater than or equal to 1",
        ),
        ({"prompt": "a", "max_tokens": 1023}, 400, "exceeds the model's context of 1024 tokens"),
        ({"prompt": "word " * 300}, 400, "1501 tokens, but the model's context is 1024 tokens"),
        ({"prompt": "a", "temperature": "hot"}, 400, "temperature"),
        ({"prompt": "a", "top_p": 1.5}, 400, "top_p: Input should be less than or equal to 1"),
        ({"prompt": "a", "surprise": 1}, 400, "surprise: Extra inputs are not permitted"),
        ({"prompt": "a", "webhook": {"url": "not a url"}}, 400, "webhook.url"),
        ({"prompt": "a", "webhook": {"url": "http://10.0.0.8/hook"}}, 400, "non-public address"),
        ({"prompt": "a", "priority": "urgent"}, 400, "priority"),
        ({"prompt": ""}, 400, "prompt: String should have at least 1 character"),
    ],
)
def test_bad_input_names_the_field_and_enqueues_nothing(
    client, redis_client, body, status, message
):
    r = client.post("/v1/jobs", json=body, headers=A)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]["message"]
    assert queued_messages(redis_client) == 0
    assert not redis_client.keys("tide:job:*")


def test_idempotency_key_returns_the_same_job_per_tenant(client, redis_client):
    body = {"prompt": "Once upon a time", "max_tokens": 8}
    first = client.post("/v1/jobs", json=body, headers={**A, "Idempotency-Key": "k1"}).json()
    again = client.post("/v1/jobs", json=body, headers={**A, "Idempotency-Key": "k1"}).json()
    other = client.post("/v1/jobs", json=body, headers={**B, "Idempotency-Key": "k1"}).json()
    assert first["id"] == again["id"] != other["id"]
    assert queues.depth(redis_client, "tide.short.interactive") == 2


def test_auth_and_tenant_isolation(client):
    assert client.post("/v1/jobs", json={"prompt": "a"}).status_code == 401
    assert client.get("/v1/jobs/x", headers={"Authorization": "Bearer nope"}).status_code == 401
    job = client.post("/v1/jobs", json={"prompt": "a", "max_tokens": 3}, headers=A).json()
    assert client.get(f"/v1/jobs/{job['id']}", headers=B).status_code == 404
    assert client.delete(f"/v1/jobs/{job['id']}", headers=B).status_code == 404
    assert client.get(f"/v1/jobs/{job['id']}", headers=A).status_code == 200
    assert client.get("/healthz").status_code == 200  # outside /v1: open


def test_cancel_a_queued_job(client):
    job = client.post("/v1/jobs", json={"prompt": "a", "max_tokens": 3}, headers=A).json()
    r = client.delete(f"/v1/jobs/{job['id']}", headers=A)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert client.get(f"/v1/jobs/{job['id']}", headers=A).json()["status"] == "cancelled"


def test_tenant_limit_answers_429_with_retry_after(redis_server, redis_client, tiny_path):
    with make_client(redis_server, str(tiny_path), max_queued_per_tenant=2) as c:
        for _ in range(2):
            assert c.post("/v1/jobs", json={"prompt": "a"}, headers=A).status_code == 202
        r = c.post("/v1/jobs", json={"prompt": "a"}, headers=A)
        assert r.status_code == 429 and r.headers["Retry-After"]
        assert "2 unfinished jobs per tenant" in r.json()["error"]["message"]
        assert c.post("/v1/jobs", json={"prompt": "a"}, headers=B).status_code == 202
        assert redis_client.get(Keys.tenant_active("tenant-a")) == b"2"


def test_queue_cap_and_rate_limit(redis_server, redis_client, tiny_path):
    with make_client(redis_server, str(tiny_path), max_queue_length=1) as c:
        assert c.post("/v1/jobs", json={"prompt": "a"}, headers=A).status_code == 202
        r = c.post("/v1/jobs", json={"prompt": "a"}, headers=B)
        assert (
            r.status_code == 429 and "holds its maximum of 1 jobs" in r.json()["error"]["message"]
        )
    redis_client.flushdb()
    with make_client(redis_server, str(tiny_path), max_requests_per_second_per_tenant=3) as c:
        codes = [c.post("/v1/jobs", json={"prompt": "a"}, headers=A).status_code for _ in range(8)]
        assert 429 in codes and codes.count(202) >= 3


def test_readyz_reports_a_missing_tokenizer(redis_server, tmp_path):
    with make_client(redis_server, str(tmp_path / "nope")) as c:
        r = c.get("/readyz")
        checks = r.json()["checks"]
        assert r.status_code == 503
        assert checks == {"tokenizer": False, "redis": True, "workers": False}
        assert c.post("/v1/jobs", json={"prompt": "a"}, headers=A).status_code == 503


def test_openapi_and_metrics(client):
    assert "/v1/jobs" in client.get("/openapi.json").json()["paths"]
    client.post("/v1/jobs", json={"prompt": "a"}, headers=A)
    text = client.get("/metrics").text
    assert 'tide:gateway_requests_total{code="202",route="/v1/jobs"}' in text
    assert 'tide:queue_depth{queue="tide.medium.interactive"} 1.0' in text


def test_chat_messages_use_the_models_template(redis_server, redis_client, tiny_path):
    with make_client(redis_server, str(tiny_path)) as c:
        body = {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
            ]
        }
        job = c.post("/v1/jobs", json={**body, "max_tokens": 5}, headers=A).json()
        got = c.get(f"/v1/jobs/{job['id']}", headers=A).json()
        rendered = "<s><|system|>Be brief.\n<|user|>Hi\n<|assistant|>"
        assert got["usage"]["prompt_tokens"] == len(rendered.encode()) - 2  # "<s>" is one token
        bad = {"messages": [{"role": "wizard", "content": "x"}]}
        r = c.post("/v1/jobs", json=bad, headers=A)
        assert r.status_code == 400 and "messages.0.role" in r.json()["error"]["message"]


def test_chat_without_a_template_is_a_clear_400(redis_server, redis_client, tiny_path, tmp_path):
    folder = tmp_path / "no-template"
    shutil.copytree(tiny_path, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with make_client(redis_server, str(folder)) as c:
        r = c.post("/v1/jobs", json={"messages": [{"role": "user", "content": "hi"}]}, headers=A)
        assert r.status_code == 400 and "has no chat template" in r.json()["error"]["message"]
        assert not redis_client.keys("tide:job:*")


def test_redis_down_is_a_503_with_retry_after_not_a_500(tiny_path):
    from tide_fleet.infra.fleet.redis_server import free_port

    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens here
    settings = Settings(redis_url=dead, model=str(tiny_path))
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        r = c.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 4})
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "1"
    assert "job store unavailable" in r.json()["error"]["message"]


def test_connection_pool_waits_for_a_free_connection_then_gives_up(redis_server):
    import asyncio

    from tide_fleet.gateway.app import _async_pool

    settings = Settings(
        redis_url=redis_server.url, gateway_redis_connections=8, gateway_redis_wait_seconds=0.3
    )
    pool = _async_pool(settings)

    async def scenario() -> tuple[bool, str]:
        held = [await pool.get_connection() for _ in range(8)]  # e.g. 8 open event streams
        waiter = asyncio.create_task(pool.get_connection())
        await asyncio.sleep(0.1)
        assert not waiter.done()  # the ninth waits instead of failing at once
        await pool.release(held.pop())
        conn = await asyncio.wait_for(waiter, 1)  # ... and gets the freed connection
        await pool.release(conn)
        try:
            await asyncio.gather(*(pool.get_connection() for _ in range(2)))
            return False, ""
        except Exception as e:  # the pool is exhausted past the wait: a clear error
            return True, type(e).__name__
        finally:
            await pool.disconnect()

    gave_up, kind = asyncio.run(scenario())
    assert gave_up and kind == "ConnectionError"
