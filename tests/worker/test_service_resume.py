"""A job taken again after its worker was lost resumes from the tokens it already produced:
the second attempt computes only the rest, and the result, the event stream and the usage
equal an uninterrupted run's."""

from __future__ import annotations

import re
from typing import Any

import pytest
import redis

from tests.worker.service_driver import choices, events, run, service, submit
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.protocol import Keys
from tide_fleet.worker.service import WorkerService

EMAIL = r"[a-z]{3,8}@[a-z]{3,8}\.(com|org)"
CODE = r"[a-z]{6}-[0-9]{6}-[a-z]{6}"


def deltas(client: redis.Redis, job_id: str) -> list[dict[str, str]]:
    return [e for e in events(client, job_id) if e["type"] == "delta"]


def tokens(client: redis.Redis, job_id: str, index: int = 0) -> list[int]:
    out: list[int] = []
    for e in deltas(client, job_id):
        if int(e.get("i") or 0) == index and e["t"]:
            out += [int(t) for t in e["t"].split(",")]
    return out


def interrupt(worker: WorkerService, client: redis.Redis, job_id: str, k: int) -> None:
    """Turn the worker until the job's stream holds at least k tokens, then drop it as a
    kill -9 would (nothing more is written) and let the reaper re-queue the job."""
    for _ in range(2000):
        worker._iterate()
        if sum(int(e["n"]) for e in deltas(client, job_id)) >= k:
            break
    worker.writer.close()  # the flush in flight lands; nothing after it
    assert JobStore(client).get(job_id)["status"] == "in_progress"  # type: ignore[index]
    client.zadd(Keys.leases, {job_id: 0})  # its lease expired
    assert JobStore(client).reap(max_attempts=3)[job_id] == "requeued"


def compare(client: redis.Redis, resumed: str, whole: str, n: int = 1) -> dict[str, Any]:
    """The resumed job's record equals the uninterrupted one's; its stream is continuous."""
    store = JobStore(client)
    a, b = store.get(resumed) or {}, store.get(whole) or {}
    assert a["status"] == b["status"] == "completed", (a, b)
    assert a["text"] == b["text"] and a["completion_tokens"] == b["completion_tokens"]
    for x, y in zip(choices(a), choices(b), strict=True):
        lx, ly = x.pop("logprobs"), y.pop("logprobs")
        assert x == y
        # Recomputed from a prefill of prompt + kept tokens, not step by step: the same
        # up to float rounding.
        assert (lx is None) == (ly is None)
        for ex, ey in zip(lx or [], ly or [], strict=True):
            assert ex["token"] == ey["token"] and ex["logprob"] == pytest.approx(ey["logprob"])
    for i in range(n):
        assert tokens(client, resumed, i) == tokens(client, whole, i)
        got = [e for e in deltas(client, resumed) if int(e.get("i") or 0) == i]
        assert "".join(e["text"] for e in got) == choices(a)[i]["text"]  # no repeat, no gap
        assert sum(int(e["n"]) for e in got) == choices(a)[i]["completion_tokens"]
    return a


def resume_case(url: str, client: redis.Redis, path: Any, k: int, **sampling: Any) -> dict:
    whole = submit(client, path, **sampling)
    run(service(url, path), client, whole)
    job = submit(client, path, **sampling)
    interrupt(service(url, path), client, job, k)
    kept = sum(len(tokens(client, job, i)) for i in range(sampling.get("n", 1)))
    assert 0 < kept < int(JobStore(client).get(whole)["completion_tokens"])  # type: ignore[index]
    second = service(url, path)
    generated = client.get(Keys.generated_tokens)
    record = run(second, client, job)
    assert int(record["attempts"]) == 2
    # The second attempt computed only what was left.
    computed = int(client.get(Keys.generated_tokens) or 0) - int(generated or 0)
    assert computed == int(record["completion_tokens"]) - kept
    second._shutdown()
    return compare(client, job, whole, sampling.get("n", 1))


def test_a_greedy_job_resumes_where_its_worker_died(redis_server, redis_client, tiny_path):
    resume_case(redis_server.url, redis_client, tiny_path, 5,
                max_tokens=24, temperature=0.0, ignore_eos=True)  # fmt: skip


def test_seeded_sampling_resumes_reproducibly_with_logprobs_kept(
    redis_server, redis_client, tiny_path
):
    record = resume_case(redis_server.url, redis_client, tiny_path, 7, max_tokens=20,
                         temperature=1.0, seed=11, n=2, logprobs=2, ignore_eos=True)  # fmt: skip
    assert all(len(c["logprobs"]) == c["completion_tokens"] for c in choices(record))


def test_stop_strings_count_over_the_whole_output(redis_server, redis_client, tiny_path):
    whole = submit(redis_client, tiny_path, max_tokens=40, temperature=0.0, ignore_eos=True)
    text = run(service(redis_server.url, tiny_path), redis_client, whole)["text"]
    stop = text[12:14]  # ends the run later than the interruption
    resume_case(redis_server.url, redis_client, tiny_path, 3, max_tokens=40,
                temperature=0.0, ignore_eos=True, stop=[stop])  # fmt: skip


@pytest.mark.parametrize("pattern", [EMAIL, CODE])
def test_a_structured_job_resumes_with_its_grammar_advanced(
    redis_server, redis_client, tiny_path, pattern
):
    pytest.importorskip("llguidance")
    record = resume_case(redis_server.url, redis_client, tiny_path, 4, max_tokens=30,
                         temperature=1.0, seed=3, structured={"regex": pattern})  # fmt: skip
    assert record["finish_reason"] == "stop" and re.fullmatch(pattern, record["text"])


def test_a_stale_holder_writes_no_delta(redis_server, redis_client, tiny_path):
    job = submit(redis_client, tiny_path, max_tokens=30, temperature=0.0, ignore_eos=True)
    first = service(redis_server.url, tiny_path)
    interrupt(first, redis_client, job, 3)
    before = len(deltas(redis_client, job))
    store = JobStore(redis_client)
    held = next(iter(first.held.values()))
    pipe = redis_client.pipeline(transaction=False)
    store.add_delta(job, held.token, {"type": "delta", "text": "x", "n": 1, "t": "5"}, pipe)
    assert pipe.execute() == [0]
    assert len(deltas(redis_client, job)) == before
