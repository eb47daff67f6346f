"""What a lost lease costs: only a job that started computing is charged an attempt; one a
dead worker only held goes back free, up to a larger cap that still stops a poison job.
Terminal states the reaper writes end the job's event stream like a worker's would."""

from __future__ import annotations

import time

import redis

from tide_fleet.infra.wire.codec import decode_hash
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.new_job import NewJob
from tide_fleet.infra.wire.protocol import JobStatus, Keys

LATER = 5.0  # seconds past every lease these tests take (1 s)


def _create(store: JobStore, job_id: str = "job_x", batch_id: str = "") -> None:
    fields = {"id": job_id, "tenant": "t", "status": "queued", "bucket": "short",
              "priority": "interactive", "created_at": time.time(),
              "batch_id": batch_id}  # fmt: skip
    store.create(NewJob(fields, "tide.short.interactive", "msg", None, 10, 10, 10, 3600))


def _lose(store: JobStore, job_id: str, started: bool, max_attempts: int = 3) -> str:
    """A worker takes the job (and starts it, or only holds it) and dies; the reaper runs."""
    status, token, _ = store.acquire(job_id, "w", lease_seconds=1)
    assert status == "acquired"
    if started:
        assert store.mark_started(job_id, token)
    return store.reap(max_attempts=max_attempts, now=time.time() + LATER)[job_id]


def test_a_held_job_that_never_started_goes_back_without_a_charge(redis_client):
    store = JobStore(redis_client)
    _create(store)
    for _ in range(5):  # more losses than max_attempts: none of them was the job's fault
        assert _lose(store, "job_x", started=False) == "requeued"
    record = store.get("job_x")
    assert record["status"] == "queued"
    assert record.get("attempts", "0") == "0" and record["lost_unstarted"] == "5"


def test_a_job_that_started_is_charged_one_attempt(redis_client):
    store = JobStore(redis_client)
    _create(store)
    assert _lose(store, "job_x", started=True) == "requeued"
    assert _lose(store, "job_x", started=False) == "requeued"
    assert _lose(store, "job_x", started=True) == "requeued"
    assert _lose(store, "job_x", started=True) == "failed"
    record = store.get("job_x")
    assert record["error"] == (
        "worker lost the job 4 times: 3 while running it (max_attempts 3), "
        "1 before it started (limit 9)"
    )


def test_a_job_lost_before_it_ever_started_fails_after_the_larger_cap(redis_client):
    # A poison job whose first step kills the worker before its start mark is written.
    store = JobStore(redis_client)
    _create(store)
    outcomes = [_lose(store, "job_x", started=False, max_attempts=2) for _ in range(6)]
    assert outcomes == ["requeued"] * 5 + ["failed"]
    record = store.get("job_x")
    assert record["status"] == "failed"
    assert record["error"] == (
        "worker lost the job 6 times: 0 while running it (max_attempts 2), "
        "6 before it started (limit 6)"
    )
    assert redis_client.get(Keys.tenant_active("t")) == b"0"


def test_start_marks_count_once_per_lease_and_only_for_its_holder(redis_client):
    store = JobStore(redis_client)
    _create(store)
    _, token, _ = store.acquire("job_x", "w1", lease_seconds=1)
    assert not store.mark_started("job_x", "someone-else")
    pipe = redis_client.pipeline(transaction=False)
    store.mark_started("job_x", token, client=pipe)
    store.mark_started("job_x", token, client=pipe)  # the worker may send it twice
    assert pipe.execute() == [1, 1]
    assert store.get("job_x")["attempts"] == "1"
    assert store.reap(max_attempts=3, now=time.time() + LATER) == {"job_x": "requeued"}
    assert not store.mark_started("job_x", token)  # a stale holder marks nothing
    assert store.get("job_x")["attempts"] == "1"


def test_a_drained_job_goes_back_uncharged_even_after_it_started(redis_client):
    store = JobStore(redis_client)
    _create(store)
    _, token, _ = store.acquire("job_x", "w1", lease_seconds=1)
    assert store.mark_started("job_x", token)
    assert store.requeue("job_x", token)
    record = store.get("job_x")
    assert record["status"] == "queued" and record["attempts"] == "0"
    _, token, _ = store.acquire("job_x", "w2", lease_seconds=1)
    assert store.requeue("job_x", token)  # held only, handed back: still nothing charged
    assert store.get("job_x")["attempts"] == "0"


def test_a_completed_job_counts_the_attempt_that_produced_it(redis_client):
    store = JobStore(redis_client)
    _create(store)
    _, token, _ = store.acquire("job_x", "w1", lease_seconds=5)
    assert store.finish("job_x", token, "t", JobStatus.COMPLETED, text="ok")  # never marked
    assert store.get("job_x")["attempts"] == "1"
    _create(store, "job_y")
    _, token, _ = store.acquire("job_y", "w1", lease_seconds=5)
    store.mark_started("job_y", token)
    assert store.finish("job_y", token, "t", JobStatus.COMPLETED, text="ok")
    assert store.get("job_y")["attempts"] == "1"  # marked and finished: still one


def _events(client: redis.Redis, job_id: str) -> list[dict[str, str]]:
    return [decode_hash(fields) for _, fields in client.xrange(Keys.events(job_id))]


def test_jobs_the_reaper_ends_publish_a_done_event(redis_client):
    store = JobStore(redis_client)
    for job_id in ("job_f", "job_c", "job_r"):
        _create(store, job_id)
        _, token, _ = store.acquire(job_id, "w", lease_seconds=1)
        store.mark_started(job_id, token)
    assert store.cancel("job_c", "t") == "cancelling"
    store.r.hset(Keys.job("job_r"), "attempts", 0)  # job_r has attempts left
    store.r.hset(Keys.job("job_f"), "attempts", 3)
    out = store.reap(max_attempts=3, now=time.time() + LATER, events_ttl=60)
    assert out == {"job_f": "failed", "job_c": "cancelled", "job_r": "requeued"}
    assert _events(redis_client, "job_f") == [{"type": "done", "status": "failed"}]
    assert _events(redis_client, "job_c") == [{"type": "done", "status": "cancelled"}]
    assert 0 < redis_client.ttl(Keys.events("job_f")) <= 60
    assert _events(redis_client, "job_r") == []  # it will run again: the stream goes on


def test_reaper_failures_and_cancels_count_once_in_their_batch(redis_client):
    store = JobStore(redis_client)
    for job_id in ("job_1", "job_2"):
        _create(store, job_id, batch_id="batch_x")
    for _ in range(3):  # job_1: lost before it started, up to the cap (3 x max_attempts 1)
        _lose(store, "job_1", started=False, max_attempts=1)
    _, _, _ = store.acquire("job_2", "w", lease_seconds=1)
    assert store.cancel("job_2", "t") == "cancelling"
    assert store.reap(max_attempts=1, now=time.time() + LATER) == {"job_2": "cancelled"}
    assert store.get("job_1")["status"] == "failed"
    assert store.reap(max_attempts=1, now=time.time() + LATER) == {}
    batch = redis_client.hgetall(Keys.batch("batch_x"))
    assert batch == {b"jobs_terminal": b"2"}
