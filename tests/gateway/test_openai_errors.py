"""A job that does not complete behind a synchronous OpenAI route answers by what ended it:
400 rejected, 409 cancelled, 503 with Retry-After when no worker could take it, 500 for a
fault inside; streams send the error object. Through the official client, live gateway."""

from __future__ import annotations

import json
import time

import openai
import pytest

from tests.gateway.live import Answer, live_fleet
from tide_fleet.infra.wire.heartbeats import Heartbeat
from tide_fleet.infra.wire.protocol import JobStatus, Keys

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("status", "error", "exc", "code", "http"),
    [
        (JobStatus.FAILED, "rejected by the worker: bad option", openai.BadRequestError,
         "job_rejected", 400),
        (JobStatus.FAILED, "lease expired after 3 attempts", openai.InternalServerError,
         "job_failed", 500),
        (JobStatus.CANCELLED, "", openai.ConflictError, "job_cancelled", 409),
        (JobStatus.EXPIRED, "", openai.InternalServerError, "expired", 504),
    ],
)  # fmt: skip
def test_unfinished_jobs_map_to_their_status(oai, fleet, tiny_path, status, error, exc, code, http):
    fleet[1].script = lambda record, i: Answer(status=status, error=error)
    with pytest.raises(exc) as e:
        oai.completions.create(model=str(tiny_path), prompt="hi")
    assert e.value.status_code == http and e.value.body["code"] == code
    job_id = fleet[1].seen[0]["id"]
    assert job_id in e.value.body["message"]
    if http == 503:
        assert e.value.response.headers["retry-after"] == "5"


def test_a_failed_job_in_a_stream_is_an_error_chunk(oai, fleet, tiny_path):
    fleet[1].script = lambda record, i: Answer(status=JobStatus.FAILED, error="engine fault")
    with pytest.raises(openai.APIError) as e:
        list(oai.chat.completions.create(model=str(tiny_path), stream=True,
                                         messages=[{"role": "user", "content": "hi"}]))  # fmt: skip
    assert "engine fault" in str(e.value.message)


def test_one_failed_prompt_fails_the_whole_request(oai, fleet, tiny_path):
    def script(record, i):  # type: ignore[no-untyped-def]
        if json.loads(record["token_ids"]) == [1, 4 + ord("b")]:
            return Answer(status=JobStatus.FAILED, error="rejected by the worker: no")
        return Answer()

    fleet[1].script = script
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model=str(tiny_path), prompt=["a", "b"])
    assert e.value.body["code"] == "job_rejected"
    failed = next(r["id"] for r in fleet[1].seen if r["token_ids"] == "[1, 102]")
    assert failed in e.value.body["message"]


@pytest.fixture
def strict_fleet(redis_server, fleet, oai, tiny_path):  # type: ignore[no-untyped-def]
    """A gateway of a fleet that does not scale from zero (the module's fake worker answers
    what it queues)."""
    with live_fleet(redis_server.url, str(tiny_path), with_worker=False,
                    ready_requires_workers=True, bucket_short_max=64,
                    bucket_medium_max=256) as pair:  # fmt: skip
        gateway, _ = pair
        yield openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="key-a", max_retries=0)


def beat(redis_client, buckets: tuple[str, ...], model: str = "") -> None:  # type: ignore[no-untyped-def]
    hb = Heartbeat(worker_id="w1", pool="p", model=model, buckets=buckets, at=time.time())
    redis_client.delete(Keys.worker("w1"))  # a new beat replaces the whole hash
    redis_client.hset(Keys.worker("w1"), mapping=hb.to_hash())
    redis_client.zadd(Keys.workers, {"w1": time.time()})


def test_no_worker_for_the_bucket_is_a_503_at_submit(strict_fleet, redis_client, tiny_path):
    with pytest.raises(openai.InternalServerError) as e:
        strict_fleet.completions.create(model=str(tiny_path), prompt="hi", max_tokens=4)
    assert e.value.status_code == 503 and e.value.body["code"] == "no_worker"
    assert e.value.response.headers["retry-after"] and not redis_client.keys("tide:job:*")
    beat(redis_client, ("medium",))  # a worker, but not for this job's bucket
    time.sleep(1.1)  # past the gateway's one-second cache of the workers
    with pytest.raises(openai.InternalServerError):
        strict_fleet.completions.create(model=str(tiny_path), prompt="hi", max_tokens=4)
    beat(redis_client, ("short", "medium"), model="another-model")  # not this model's worker
    time.sleep(1.1)
    with pytest.raises(openai.InternalServerError) as e:
        strict_fleet.completions.create(model=str(tiny_path), prompt="hi", max_tokens=4)
    assert str(tiny_path) in e.value.body["message"]
    beat(redis_client, ("short", "medium"))
    time.sleep(1.1)
    out = strict_fleet.completions.create(model=str(tiny_path), prompt="hi", max_tokens=4)
    assert out.choices[0].text == "choice 0 says hi"
