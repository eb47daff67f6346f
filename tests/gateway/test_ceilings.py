"""Cost ceilings per request: prompts x n x (prompt + max_tokens), per tenant, a 400 naming
`max_tokens` and the limit with nothing queued (batch lines: tests/infra/batches)."""

from __future__ import annotations

import pytest

from tests.gateway.test_api import A, make_client, queued_messages

CEILING = {"max_request_tokens": 1_000, "tenant_max_request_tokens": {"tenant-a": 400}}


@pytest.fixture
def client(redis_server, redis_client, tiny_path):
    with make_client(redis_server, str(tiny_path), **CEILING) as c:
        yield c


def refused(r, redis_client) -> str:  # type: ignore[no-untyped-def]
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "max_tokens" and error["code"] == "request_too_large", error
    assert "ceiling of 400 tokens" in error["message"], error
    assert queued_messages(redis_client) == 0 and not redis_client.keys("tide:job:*")
    return str(error["message"])


def test_a_job_over_its_tenants_ceiling_is_refused(client, redis_client):
    # dummy:tiny: one token per byte plus <s>: "abc" is 4 tokens.
    ok = client.post("/v1/jobs", json={"prompt": "abc", "n": 4, "max_tokens": 96}, headers=A)
    assert ok.status_code == 202, ok.text  # 4 x (4 + 96) = 400: at the ceiling
    redis_client.flushdb()
    r = client.post("/v1/jobs", json={"prompt": "abc", "n": 4, "max_tokens": 97}, headers=A)
    assert "404 tokens" in refused(r, redis_client)


def test_a_list_of_prompts_counts_together(client, redis_client):
    body = {"prompt": ["abc"] * 5, "n": 2, "max_tokens": 37}  # 5 x 2 x (4 + 37) = 410
    r = client.post("/v1/completions", json=body, headers=A)
    assert "410 tokens (5 prompts" in refused(r, redis_client)
