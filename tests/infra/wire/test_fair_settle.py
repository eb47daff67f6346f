"""Fair-share counters settled to the tokens served when a job ends: a tenant whose jobs
stop early is served more often, a correction never goes below the counter its tenant
joined at, a tenant that left is not corrected, and a job taken twice is settled once."""

from __future__ import annotations

import time

from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.new_job import NewJob
from tide_fleet.infra.wire.protocol import JobMessage, JobStatus, Keys, queue_name

Q = queue_name("short", "interactive")


def _create(store: JobStore, job_id: str, tenant: str, max_tokens: int = 100) -> None:
    fields = {"id": job_id, "tenant": tenant, "status": "queued", "bucket": "short",
              "priority": "interactive", "created_at": time.time(), "prompt_tokens": 10,
              "max_tokens": max_tokens, "n": 1}  # fmt: skip
    message = queues.encode(JobMessage(job_id, "short", "interactive", 10, max_tokens), Q)
    store.create(NewJob(fields, Q, message, None, 10_000, 10_000, 10_000, 3600))


def _take(taker: queues.Taker) -> str:
    (d,) = taker.take([Q], 1)
    return d.job().job_id


def _run(store: JobStore, job_id: str, completion_tokens: int) -> None:
    """Acquire and complete a taken job, its choices having generated `completion_tokens`."""
    tenant = job_id[0]
    status, token, _ = store.acquire(job_id, "w", 30)
    assert status == "acquired"
    assert store.finish(job_id, token, tenant, JobStatus.COMPLETED,
                        completion_tokens=completion_tokens)  # fmt: skip


def _score(r, tenant: str) -> float | None:
    return r.zscore(Keys.queue_tenants(Q), tenant)


def test_a_tenant_served_under_its_estimate_is_taken_more_often(redis_client):
    store, taker = JobStore(redis_client), queues.Taker(redis_client)
    for i in range(60):
        _create(store, f"a{i}", "a")
        _create(store, f"b{i}", "b")
    served = {"a": 0, "b": 0}
    taken = []
    for _ in range(44):  # one worker slot: take, run, finish
        job_id = _take(taker)
        used = 1 if job_id.startswith("a") else 100  # a's jobs stop after 1 of 100 tokens
        _run(store, job_id, used)
        served[job_id[0]] += 10 + used
        taken.append(job_id[0])
    jobs = {t: taken.count(t) for t in "ab"}
    # Estimates 110 each, served 11 and 110: a is taken ~10 times per b job, and the two
    # are served about the same tokens (without the correction: one each, 11 against 110).
    assert 8 <= jobs["a"] / jobs["b"] <= 12
    assert abs(served["a"] - served["b"]) <= 110


def test_a_correction_never_goes_below_the_counter_its_tenant_joined_at(redis_client):
    store, taker, r = JobStore(redis_client), queues.Taker(redis_client), redis_client
    _create(store, "a0", "a", max_tokens=1000)
    _create(store, "a1", "a")
    for i in range(12):
        _create(store, f"b{i}", "b")
    assert _take(taker) == "a0" and _score(r, "a") == 1010
    assert {_take(taker) for _ in range(10)} == {f"b{i}" for i in range(10)}
    assert _take(taker) == "a1" and _score(r, "a") is None  # a's list emptied: it left
    _create(store, "a2", "a")  # and came back, at the minimum, while a0 ran
    assert _score(r, "a") == _score(r, "b") == 1100
    _run(store, "a0", 1)  # served 11 of 1010: a refund of 999 would put a at 101
    assert _score(r, "a") == 1100 and r.hget(Keys.job("a0"), "fair_charge") is None


def test_a_tenant_that_left_is_not_corrected(redis_client):
    store, taker, r = JobStore(redis_client), queues.Taker(redis_client), redis_client
    _create(store, "a0", "a")
    _create(store, "a1", "a")
    for i in range(3):
        _create(store, f"b{i}", "b")
    assert [_take(taker) for _ in range(3)] == ["a0", "b0", "a1"]  # a's list empties: it left
    _run(store, "a0", 1)
    assert _score(r, "a") is None and _score(r, "b") == 110
    assert r.hget(Keys.queue_joined(Q), "a") is None
    _create(store, "a2", "a")  # back at the minimum, with no credit from a0
    assert _score(r, "a") == 110
    _run(store, "a1", 1)  # taken after a left: charged nothing, so nothing to settle
    assert _score(r, "a") == 110


def test_a_job_taken_again_is_settled_once_against_its_last_charge(redis_client):
    store, taker, r = JobStore(redis_client), queues.Taker(redis_client), redis_client
    for i in range(2):
        _create(store, f"a{i}", "a")
        _create(store, f"b{i}", "b")
    taker.give_back(taker.take([Q], 1))  # a0 charged 110 and refunded
    assert _score(r, "a") == 0 and r.hget(Keys.job("a0"), "fair_charge") is None
    assert _take(taker) == "a0"
    status, token, _ = store.acquire("a0", "w", 30)
    assert status == "acquired" and store.requeue("a0", token)  # refunded again
    assert _score(r, "a") == 0
    assert _take(taker) == "a0" and _score(r, "a") == 110
    _run(store, "a0", 1)
    assert _score(r, "a") == 11  # one correction: 110 charged, 11 served


def test_a_taken_job_cancelled_before_it_starts_is_refunded(redis_client):
    store, taker, r = JobStore(redis_client), queues.Taker(redis_client), redis_client
    for i in range(2):
        _create(store, f"a{i}", "a")
        _create(store, f"b{i}", "b")
    assert _take(taker) == "a0" and _score(r, "a") == 110
    assert store.cancel("a0", "a") == "cancelled"
    assert _score(r, "a") == 0


def test_a_job_cancelled_while_held_is_refunded_once(redis_client):
    """Taken (charged), cancelled (refunded), then given back by its worker: the give-back
    refunds what is still recorded on the job (nothing), not the take's charge again."""
    store, taker = JobStore(redis_client), queues.Taker(redis_client)
    for i in range(6):
        _create(store, f"a{i}", "a")
    _create(store, "b0", "b")
    for _ in range(3):  # a's counter well above the one it joined at
        if (job_id := _take(taker)).startswith("a"):
            _run(store, job_id, 100)
    (d,) = taker.take([Q], 1)
    while d.tenant != "a":
        (d,) = taker.take([Q], 1)
    held = d.job().job_id
    before = _score(redis_client, d.tenant)
    assert store.cancel(held, d.tenant) == "cancelled"
    refunded = _score(redis_client, d.tenant)
    taker.give_back([d])
    assert _score(redis_client, d.tenant) == refunded <= before


def test_two_copies_taken_together_are_charged_once(redis_client):
    """A reaped job's message can be queued twice (its requeue and the stranded restore):
    one take of both charges the job once, and its finish settles that charge."""
    store, taker = JobStore(redis_client), queues.Taker(redis_client)
    _create(store, "a0", "a")
    _create(store, "a1", "a")
    message = queues.encode(JobMessage("a0", "short", "interactive", 10, 100), Q)
    redis_client.rpush(f"{Q}:t:a", message)  # a second copy of a0 at the front
    redis_client.incr(f"{Q}:waiting")
    start = _score(redis_client, "a")
    taken = [d.job().job_id for d in taker.take([Q], 2)]
    assert taken == ["a0", "a0"]
    assert _score(redis_client, "a") == start + 110  # one charge
    _run(store, "a0", 100)
    assert _score(redis_client, "a") == start + 110  # settled: 10 + 100 served, as charged
