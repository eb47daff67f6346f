"""Deadlines and expiry on the wire: earliest-deadline-first takes, requeues into the
deadline zset, expiry in the take path and the reaper's pass, the deadline backlog."""

from __future__ import annotations

import time

from tide_fleet.infra.fleet.reaper import OutageGrace, Reaper
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.backlog import deadline_backlog, read_backlog
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.new_job import NewJob
from tide_fleet.infra.wire.protocol import JobMessage, Keys, queue_name

Q, QB = queue_name("short", "interactive"), queue_name("short", "batch")


def _create(
    store: JobStore, job_id: str, deadline: float | None = None, ttl: float | None = None,
    priority: str = "interactive", webhook: str = "",
) -> None:  # fmt: skip
    now = time.time()
    fields = {"id": job_id, "tenant": "t", "status": "queued", "bucket": "short",
              "priority": priority, "created_at": now, "prompt_tokens": 10, "max_tokens": 5,
              "n": 2, "webhook_url": webhook}  # fmt: skip
    ends = [t for t in (deadline, now + ttl if ttl else None) if t is not None]
    if deadline is not None:
        fields["deadline"] = deadline
    if ends:
        fields["expire_at"] = min(ends)
    queue = queue_name("short", priority)
    message = queues.encode(JobMessage(job_id, "short", priority, 10, 10), queue)
    store.create(NewJob(fields, queue, message, None, 100, 100, 100, 3600))


def _taken_ids(taker: queues.Taker, names: list[str], limit: int = 10) -> list[str]:
    return [d.job().job_id for d in taker.take(names, limit)]


def test_earliest_deadline_first_within_a_class_then_fifo_and_classes_first(redis_client):
    store, now = JobStore(redis_client), time.time()
    _create(store, "plain1")
    _create(store, "late", deadline=now + 300)
    _create(store, "plain2")
    _create(store, "soon", deadline=now + 100)
    _create(store, "batch_soon", deadline=now + 10, priority="batch")
    _create(store, "mid", deadline=now + 200)
    assert queues.depth(redis_client, Q) == 5 and redis_client.zcard(Keys.deadline_queue(Q)) == 3
    taken = _taken_ids(queues.Taker(redis_client), [Q, QB])
    assert taken == ["soon", "mid", "late", "plain1", "plain2", "batch_soon"]


def test_give_back_and_requeue_put_a_deadline_job_back_in_its_zset(redis_client):
    store, taker, now = JobStore(redis_client), queues.Taker(redis_client), time.time()
    _create(store, "d", deadline=now + 100)
    _create(store, "p")
    taker.give_back(taker.take([Q], 2))
    assert _taken_ids(taker, [Q], 1) == ["d"]
    status, token, _ = store.acquire("d", "w", 5)
    assert status == "acquired" and deadline_backlog(redis_client, "short") == []
    assert store.requeue("d", token)
    assert redis_client.zscore(Keys.deadline_queue(Q), store.get("d")["message"]) == now + 100
    assert deadline_backlog(redis_client, "short") == [(now + 100, 20)]
    tenant_list = redis_client.lrange(Keys.tenant_queue(Q, "t"), 0, -1)
    assert tenant_list == [store.get("p")["message"].encode()]


def test_restore_stranded_puts_a_deadline_job_back_in_its_zset(redis_client):
    store, taker, now = JobStore(redis_client), queues.Taker(redis_client), time.time()
    _create(store, "d", deadline=now + 100)
    assert _taken_ids(taker, [Q]) == ["d"]
    assert redis_client.zcard(Keys.deadline_queue(Q)) == 0
    assert store.restore_stranded(older_than=0, now=time.time() + 1) == ["d"]
    assert redis_client.zcard(Keys.deadline_queue(Q)) == 1 and queues.depth(redis_client, Q) == 1
    assert _taken_ids(taker, [Q]) == ["d"]


def test_deadline_backlog_lists_queued_jobs_and_drops_taken_cancelled_expired(redis_client):
    store, now = JobStore(redis_client), time.time()
    for i, job_id in enumerate(["a", "b", "c", "d"]):
        _create(store, job_id, deadline=now + 100 - 10 * i)
    _create(store, "plain")
    want = [(now + 70, 20), (now + 80, 20), (now + 90, 20), (now + 100, 20)]
    assert deadline_backlog(redis_client, "short") == want  # prompt 10 + 2 x 5 each
    assert store.acquire("d", "w", 5)[0] == "acquired"
    assert store.cancel("c", "t") == "cancelled"
    assert redis_client.zcard(Keys.deadline_queue(Q)) == 3  # c's message went with it
    assert store.expire_due(now=now + 95) == ["b"]  # d is running, c cancelled
    assert deadline_backlog(redis_client, "short") == [(now + 100, 20)]
    assert read_backlog(redis_client)["short"].jobs == 2  # a and plain
    assert read_backlog(redis_client)["short"].expired_jobs == 1


def test_a_job_past_its_deadline_is_expired_when_a_worker_takes_it(redis_client):
    store, now = JobStore(redis_client), time.time()
    _create(store, "late", deadline=now + 0.2)
    time.sleep(0.3)
    [d] = queues.Taker(redis_client).take([Q], 5)
    assert store.acquire("late", "w", 5, events_ttl=60) == ("expired", "", {})
    record = store.get("late")
    assert record["status"] == "expired" and "deadline" in record["error"]
    assert "started_lease" not in record and "attempts" not in record
    assert redis_client.get(Keys.tenant_active("t")) == b"0"
    assert redis_client.xrange(Keys.events("late"))[-1][1][b"status"] == b"expired"
    assert d.deadline == now + 0.2


def test_a_job_with_ttl_not_taken_expires_in_the_reaper_pass(redis_client):
    store = JobStore(redis_client)
    _create(store, "waits", ttl=1, webhook="https://example.com/hook")
    _create(store, "plenty", ttl=600)
    reaper = Reaper(redis_client, Settings(), grace=OutageGrace(0, margin=0))
    reaper.reap_once()
    assert store.get("waits")["status"] == "queued"
    time.sleep(1.1)
    reaper.reap_once()
    record = store.get("waits")
    assert record["status"] == "expired" and "ttl" in record["error"]
    assert "attempts" not in record and "usage" not in record and "choices" not in record
    assert store.get("plenty")["status"] == "queued"
    assert redis_client.get(Keys.tenant_active("t")) == b"1"
    events = redis_client.xrange(Keys.events("waits"))
    assert [e[1][b"status"] for e in events] == [b"expired"]
    msg = "msg_waits_expired"
    assert redis_client.hgetall(Keys.webhook(msg)) == {b"kind": b"job", b"obj_id": b"waits"}
    assert redis_client.zscore(Keys.webhooks_due, msg) is not None
    assert read_backlog(redis_client)["short"].jobs == 1
    # Its message is still on the list: a worker taking it skips it.
    assert store.acquire("waits", "w", 5)[0] == "expired"


def test_only_queued_jobs_stay_listed_for_expiry(redis_client):
    """tide:expiries holds what may still expire: a started or cancelled job leaves it at
    once (a requeue lists it again), so a 24 h window does not keep a day of jobs there."""
    store, now = JobStore(redis_client), time.time()
    for job_id in ("a", "b", "c"):
        _create(store, job_id, deadline=now + 3600)
    assert redis_client.zcard(Keys.expiries) == 3
    status, token, _ = store.acquire("a", "w", 5)
    assert status == "acquired" and store.cancel("b", "t") == "cancelled"
    assert [m.decode() for m in redis_client.zrange(Keys.expiries, 0, -1)] == ["c"]
    assert store.requeue("a", token)
    assert sorted(m.decode() for m in redis_client.zrange(Keys.expiries, 0, -1)) == ["a", "c"]
