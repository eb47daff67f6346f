"""The job record's Lua transitions: leases, stale holders, reaping and max_attempts."""

from __future__ import annotations

import json
import time

from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.backlog import read_backlog
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.new_job import NewJob
from tide_fleet.infra.wire.protocol import JobMessage, JobStatus, Keys
from tide_fleet.infra.wire.queues import Taker


def _create(store: JobStore, job_id: str = "job_x") -> None:
    fields = {"id": job_id, "tenant": "t", "status": "queued", "bucket": "short",
              "priority": "interactive", "created_at": time.time()}  # fmt: skip
    job = NewJob(fields, "tide.short.interactive", "msg", None, 10, 10, 10, 3600)
    keys, args = job.script_call()
    job.result(store.create_script(keys=keys, args=args))


def test_only_the_current_lease_holder_completes(redis_client):
    store = JobStore(redis_client)
    _create(store)
    status, stale, record = store.acquire("job_x", "w1", lease_seconds=5)
    assert status == "acquired"
    assert record["status"] == "in_progress" and record["lease_owner"] == "w1"
    assert store.mark_started("job_x", stale)
    assert store.reap(max_attempts=3, now=time.time() + 10) == {"job_x": "requeued"}
    listed = redis_client.lrange(Keys.tenant_queue("tide.short.interactive", "t"), 0, -1)
    assert listed.count(b"msg") == 2  # re-queued
    status, fresh, _ = store.acquire("job_x", "w2", lease_seconds=5)
    assert status == "acquired" and fresh != stale
    assert not store.finish("job_x", stale, "t", JobStatus.COMPLETED, text="late")
    assert store.finish("job_x", fresh, "t", JobStatus.COMPLETED, text="on time")
    record = store.get("job_x")
    assert record["status"] == "completed" and record["text"] == "on time"
    assert record["attempts"] == "2"  # one lost while running, one completed (unmarked)
    assert redis_client.get(Keys.tenant_active("t")) == b"0"
    assert store.acquire("job_x", "w3", 5) == (
        "completed",
        "",
        {},
    )  # a duplicate message is skipped


def test_max_attempts_fails_the_job_with_a_reason(redis_client):
    store = JobStore(redis_client)
    _create(store)
    for attempt in range(1, 4):
        status, token, _ = store.acquire("job_x", f"w{attempt}", lease_seconds=1)
        assert status == "acquired" and store.mark_started("job_x", token)
        outcome = store.reap(max_attempts=3, now=time.time() + 5)["job_x"]
        assert outcome == ("requeued" if attempt < 3 else "failed")
    record = store.get("job_x")
    assert record["status"] == "failed"
    assert record["error"] == (
        "worker lost the job 3 times: 3 while running it (max_attempts 3), "
        "0 before it started (limit 9)"
    )


def test_refresh_reports_cancel_requests_and_lost_leases(redis_client):
    store = JobStore(redis_client)
    _create(store)
    _, token, _ = store.acquire("job_x", "w1", lease_seconds=5)
    assert store.refresh({"job_x": token}, 5) == {"job_x": "0"}
    assert store.cancel("job_x", "t") == "cancelling"
    assert store.refresh({"job_x": token}, 5) == {"job_x": "1"}
    assert store.refresh({"job_x": "someone-else"}, 5) == {"job_x": "lost"}


def _queued_with_message(store: JobStore, job_id: str, q: str) -> None:
    fields = {"id": job_id, "tenant": "t", "status": "queued", "bucket": "short",
              "priority": "interactive", "created_at": time.time()}  # fmt: skip
    message = queues.encode(JobMessage(job_id, "short", "interactive", 3, 3), q)
    store.create(NewJob(fields, q, message, None, 10, 10, 10, 3600))


def test_a_message_taken_but_never_started_goes_back(redis_client):
    store = JobStore(redis_client)
    q = "tide.short.interactive"
    _queued_with_message(store, "job_s", q)
    # A worker takes it and dies (no clean close, which would hand it back itself).
    (taken,) = Taker(redis_client).take([q], 4)
    assert taken.job().job_id == "job_s"
    assert queues.depth(redis_client, q) == 0 and redis_client.hlen("unacked") == 1
    assert store.restore_stranded(older_than=10) == []  # too recent
    assert store.restore_stranded(older_than=10, now=time.time() + 11) == ["job_s"]
    assert queues.depth(redis_client, q) == 1 and redis_client.hlen("unacked") == 0
    status, _, _ = store.acquire("job_s", "w1", 5)
    assert status == "acquired"
    Taker(redis_client).take([q], 1)  # a started job's copy stays where it is
    assert store.restore_stranded(older_than=10, now=time.time() + 11) == []


def test_taker_is_kombu_compatible_and_gives_back_in_order(redis_client, redis_server):
    import kombu

    store = JobStore(redis_client)
    q = "tide.short.interactive"
    for i in (0, 1, 3):
        _queued_with_message(store, f"job_{i}", q)
    # A message on the plain list (as kombu publishes it) is taken after the tenants' lists.
    redis_client.lpush(q, queues.encode(JobMessage("job_2", "short", "interactive", 3, 3), q))
    taker = Taker(redis_client)
    first, second = taker.take([q], 2)  # FIFO, as kombu consumes
    assert [first.job().job_id, second.job().job_id] == ["job_0", "job_1"]
    # The unacked entry is what kombu's own channel writes for a message it delivered.
    with kombu.Connection(redis_server.url) as conn:
        msg = kombu.Queue(q, channel=conn.default_channel).get(no_ack=False)
        assert msg is not None and json.loads(msg.body)["job_id"] == "job_2"
        ours = json.loads(redis_client.hget("unacked", first.tag))
        theirs = json.loads(redis_client.hget("unacked", msg.delivery_tag))
        assert [type(x) for x in ours] == [type(x) for x in theirs]
        assert ours[0].keys() == theirs[0].keys() and ours[2] == theirs[2] == q
        msg.reject(requeue=True)  # kombu re-queues at the far end (LPUSH)
    taker.give_back([first, second])  # back to the front, in their order
    order = [d.job().job_id for d in taker.take([q], 10)]
    assert order == ["job_0", "job_1", "job_3", "job_2"]
    assert redis_client.hlen("unacked") == 4


def _create_sized(store: JobStore, job_id: str, bucket: str, prompt: int, max_tokens: int) -> None:
    fields = {
        "id": job_id, "tenant": "t", "status": "queued", "created_at": time.time(),
        "bucket": bucket, "prompt_tokens": prompt, "max_tokens": max_tokens,
    }  # fmt: skip
    store.create(NewJob(fields, f"tide.{bucket}.interactive", "msg", None, 100, 100, 100, 3600))


def test_backlog_counts_queued_work_through_every_transition(redis_client):
    store = JobStore(redis_client)
    _create_sized(store, "job_a", "short", 10, 5)
    _create_sized(store, "job_b", "short", 20, 7)
    _create_sized(store, "job_c", "long", 9000, 100)
    b = read_backlog(redis_client)
    assert (b["short"].jobs, b["short"].tokens) == (2, 42)
    assert (b["long"].jobs, b["long"].tokens) == (1, 9100)
    assert (b["medium"].jobs, b["medium"].tokens) == (0, 0)
    assert b["short"].arrived_jobs == 2 and b["short"].arrived_tokens == 42
    assert 0 <= b["short"].oldest_age_s < 5

    _, token, _ = store.acquire("job_a", "w1", 5)  # started: no longer backlog
    assert (read_backlog(redis_client)["short"].tokens) == 27
    assert store.requeue("job_a", token)  # drained: backlog again, counted once
    assert store.requeue("job_a", token) is False
    assert read_backlog(redis_client)["short"].tokens == 42
    _, token, _ = store.acquire("job_a", "w1", 0.01)
    assert store.reap(max_attempts=3, now=time.time() + 1) == {"job_a": "requeued"}
    assert (
        read_backlog(redis_client)["short"].jobs,
        read_backlog(redis_client)["short"].tokens,
    ) == (
        2,
        42,
    )
    assert store.cancel("job_b", "t") == "cancelled"
    assert store.cancel("job_b", "t") == "cancelled"  # a second cancel changes nothing
    b = read_backlog(redis_client)
    assert (b["short"].jobs, b["short"].tokens) == (1, 15)
    assert b["short"].arrived_jobs == 2  # arrivals are a counter, never decremented


def test_batch_jobs_count_once_in_their_batch_when_terminal(redis_client):
    store = JobStore(redis_client)
    for job_id in ("job_1", "job_2", "job_3"):
        fields = {"id": job_id, "tenant": "t", "status": "queued", "bucket": "short",
                  "created_at": time.time(), "batch_id": "batch_x"}  # fmt: skip
        store.create(NewJob(fields, "tide.short.batch", "msg", None, 10, 10, 10, 3600))
    _, token, _ = store.acquire("job_1", "w", 5)
    assert store.finish("job_1", token, "t", JobStatus.COMPLETED, text="ok")
    assert not store.finish("job_1", token, "t", JobStatus.COMPLETED)  # counted once
    assert store.cancel("job_2", "t") == "cancelled"
    _, token, _ = store.acquire("job_3", "w", 0.01)
    store.mark_started("job_3", token)
    assert store.reap(max_attempts=1, now=time.time() + 1) == {"job_3": "failed"}
    assert store.reap(max_attempts=1, now=time.time() + 1) == {}  # counted once
    batch = redis_client.hgetall("tide:batch:batch_x")
    assert batch == {b"jobs_terminal": b"3", b"jobs_completed": b"1"}


def test_backlog_forgets_queued_jobs_whose_record_expired(redis_client):
    store = JobStore(redis_client)
    _create_sized(store, "job_old", "long", 9000, 100)
    _create_sized(store, "job_live", "short", 10, 5)
    redis_client.delete("tide:job:job_old")  # its TTL ran out while nobody served "long"
    assert store.prune_backlog(job_ttl=3600) == []  # not old enough yet
    assert store.prune_backlog(job_ttl=3600, now=time.time() + 3601) == ["job_old"]
    b = read_backlog(redis_client)
    assert (b["long"].jobs, b["long"].tokens) == (0, 0)
    assert (b["short"].jobs, b["short"].tokens) == (1, 15)  # a live record stays


def test_a_job_of_n_choices_counts_n_times_its_max_tokens_in_the_backlog(redis_client):
    store = JobStore(redis_client)
    fields = {
        "id": "job_n", "tenant": "t", "status": "queued", "created_at": time.time(),
        "bucket": "short", "prompt_tokens": 10, "max_tokens": 5, "n": 4,
    }  # fmt: skip
    store.create(NewJob(fields, "tide.short.interactive", "msg", None, 100, 100, 100, 3600))
    assert read_backlog(redis_client)["short"].tokens == 10 + 4 * 5  # the prompt is shared
    store.acquire("job_n", "w1", 5)
    assert read_backlog(redis_client)["short"].tokens == 0
