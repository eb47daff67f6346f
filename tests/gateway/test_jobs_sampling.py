"""The job API takes the same sampling and output options (n, logprobs, penalties,
logit_bias, min_tokens, structured / response_format, token-id prompts) and shows a job's
choices when it asked for several or for logprobs."""

from __future__ import annotations

import json

import pytest

from tests.gateway.live import entry
from tests.gateway.test_api import A, make_client
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.protocol import JobStatus, Keys


@pytest.fixture
def client(redis_server, redis_client, tiny_path):  # type: ignore[no-untyped-def]
    with make_client(redis_server, str(tiny_path)) as c:
        yield c


def sampling(redis_client, job_id: str) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(redis_client.hget(Keys.job(job_id), "sampling"))


def test_options_reach_the_record(client, redis_client):
    body = {"prompt": [1, 80, 81], "n": 3, "logprobs": 4, "presence_penalty": 0.1,
            "frequency_penalty": 0.2, "repetition_penalty": 1.1, "logit_bias": {"7": -100},
            "min_tokens": 2, "seed": 5, "structured": {"regex": "[a-z]+"}}  # fmt: skip
    r = client.post("/v1/jobs", json=body, headers=A)
    assert r.status_code == 202, r.text
    got = sampling(redis_client, r.json()["id"])
    assert got == {"max_tokens": 64, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "seed": 5,
                   "stop": [], "ignore_eos": False, "presence_penalty": 0.1,
                   "frequency_penalty": 0.2, "repetition_penalty": 1.1,
                   "logit_bias": {"7": -100.0}, "min_tokens": 2, "logprobs": 4,
                   "structured": {"regex": "[a-z]+"}, "n": 3}  # fmt: skip
    assert json.loads(redis_client.hget(Keys.job(r.json()["id"]), "token_ids")) == [1, 80, 81]


def test_a_plain_job_writes_the_keys_it_always_did(client, redis_client):
    job_id = client.post("/v1/jobs", json={"prompt": "a"}, headers=A).json()["id"]
    assert set(sampling(redis_client, job_id)) == {
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "ignore_eos",
    }


def test_response_format_on_the_job_api(client, redis_client):
    body = {"prompt": "a", "response_format": {"type": "json_object"}}
    job_id = client.post("/v1/jobs", json=body, headers=A).json()["id"]
    assert sampling(redis_client, job_id)["structured"] == {"json_object": True}


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"structured": {"json_schema": {"type": "nope"}}}, "structured", "invalid_schema"),
        ({"structured": {"regex": "a", "choice": ["b"]}}, "structured", "invalid_structured"),
        ({"response_format": {"type": "regex", "regex": "(["}}, "response_format",
         "invalid_schema"),
        ({"structured": {"regex": "a"}, "response_format": {"type": "json_object"}},
         "structured", "conflict"),
        ({"logprobs": 21}, "logprobs", None),
        ({"n": 17}, "n", None),
        ({"logit_bias": {"260": 5}}, "logit_bias", "invalid_token_id"),
        ({"min_tokens": 65}, "min_tokens", None),
        ({"prompt": [1, 2, 300]}, "prompt", "invalid_token_id"),
        ({"prompt": [[1, 2]]}, "prompt", "invalid_token_id"),
        ({"prompt": []}, "prompt", "empty_prompt"),
    ],
)  # fmt: skip
def test_bad_options_are_400s_naming_the_field(client, redis_client, body, param, code):
    r = client.post("/v1/jobs", json={"prompt": "a", **body}, headers=A)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    if code:
        assert error["code"] == code, error
    assert not redis_client.keys("tide:job:*")


def finish_with_choices(redis_client, job_id: str, n: int, top: int | None) -> None:  # type: ignore[no-untyped-def]
    store = JobStore(redis_client)
    _, token, record = store.acquire(job_id, "w", 30)
    choices = [{"index": i, "text": f"t{i}", "finish_reason": "stop", "completion_tokens": 1,
                "logprobs": [entry(f"t{i}", 0, top)] if top is not None else None}
               for i in range(n)]  # fmt: skip
    store.finish(job_id, token, record["tenant"], JobStatus.COMPLETED, events_ttl=60,
                 text="t0", finish_reason="stop", completion_tokens=n, choices=choices)  # fmt: skip


def test_the_job_shows_its_choices_when_it_asked_for_them(client, redis_client):
    job_id = client.post("/v1/jobs", json={"prompt": "a", "n": 2, "logprobs": 1},
                         headers=A).json()["id"]  # fmt: skip
    assert client.get(f"/v1/jobs/{job_id}", headers=A).json()["choices"] is None  # queued
    finish_with_choices(redis_client, job_id, 2, 1)
    got = client.get(f"/v1/jobs/{job_id}", headers=A).json()
    assert [c["text"] for c in got["choices"]] == ["t0", "t1"]
    assert got["choices"][1]["logprobs"][0]["top_logprobs"][0]["token"] == "alt0"
    assert got["result"]["text"] == "t0" and got["usage"]["completion_tokens"] == 2
    plain = client.post("/v1/jobs", json={"prompt": "a"}, headers=A).json()["id"]
    finish_with_choices(redis_client, plain, 1, None)
    assert client.get(f"/v1/jobs/{plain}", headers=A).json()["choices"] is None


def test_job_events_carry_the_choice_index_and_logprobs(client, redis_client):
    job_id = client.post("/v1/jobs", json={"prompt": "a", "n": 2, "logprobs": 0},
                         headers=A).json()["id"]  # fmt: skip
    lp = json.dumps([entry("x", 0, 0)])
    redis_client.xadd(Keys.events(job_id), {"type": "delta", "text": "x", "n": 1, "i": "1",
                                            "lp": lp})  # fmt: skip
    finish_with_choices(redis_client, job_id, 2, 0)
    with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=A) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
    first = json.loads(lines[0].removeprefix("data:"))
    assert first == {"text": "x", "index": 1, "logprobs": json.loads(lp)}
