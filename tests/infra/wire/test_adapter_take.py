"""Adapter-aware takes: a worker takes the jobs of the LoRA adapters it holds first within a
list's front window, else the front; deadlines, tenants and classes keep their order; the
queued jobs per adapter are counted with the backlog."""

from __future__ import annotations

import time

from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.backlog import adapter_backlog, read_backlog
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.new_job import NewJob
from tide_fleet.infra.wire.protocol import JobMessage, backlog_field, queue_name

Q, QB = queue_name("short", "interactive"), queue_name("short", "batch")


def _create(
    store: JobStore, job_id: str, lora: str = "", tenant: str = "t",
    priority: str = "interactive", deadline: float | None = None,
) -> None:  # fmt: skip
    fields = {"id": job_id, "tenant": tenant, "status": "queued", "bucket": "short",
              "priority": priority, "created_at": time.time(), "prompt_tokens": 10,
              "max_tokens": 5}  # fmt: skip
    if lora:
        fields["lora"] = lora
    if deadline is not None:
        fields["deadline"] = fields["expire_at"] = deadline
    queue = queue_name("short", priority)
    message = queues.encode(JobMessage(job_id, "short", priority, 10, 5), queue)
    store.create(NewJob(fields, queue, message, None, 10_000, 10_000, 10_000, 3600))


def _ids(taker: queues.Taker, n: int, held: list[str], names: list[str] | None = None):  # type: ignore[no-untyped-def]
    return [d.job().job_id for _ in range(n) for d in taker.take(names or [Q], 1, held)]


def test_a_worker_holding_a_takes_as_job_ahead_of_an_earlier_b_job(redis_client):
    store, taker = JobStore(redis_client), queues.Taker(redis_client)
    _create(store, "b1", lora="B")
    _create(store, "a1", lora="A")
    (d,) = taker.take([Q], 1, ["A"])
    assert (d.job().job_id, d.lora) == ("a1", "A")
    (d,) = taker.take([Q], 1, ["A"])  # nothing else queued: B's job, not an idle worker
    assert (d.job().job_id, d.lora) == ("b1", "B")
    assert taker.take([Q], 1, ["A"]) == []


def test_base_jobs_count_as_held_and_the_front_is_taken_when_nothing_in_the_window_is(
    redis_client,
):
    store, taker = JobStore(redis_client), queues.Taker(redis_client)
    _create(store, "b1", lora="B")
    _create(store, "base1")
    _create(store, "c1", lora="C")
    assert _ids(taker, 3, []) == ["base1", "b1", "c1"]


def test_the_window_is_bounded(redis_client):
    store, taker = JobStore(redis_client), queues.Taker(redis_client)
    for i in range(queues.ADAPTER_WINDOW):
        _create(store, f"b{i}", lora="B")
    _create(store, "a_far", lora="A")  # just past the window: not seen
    _create(store, "b_last", lora="B")
    assert _ids(taker, 1, ["A"]) == ["b0"]
    assert _ids(taker, 1, ["A"]) == ["a_far"]  # now inside it


def test_deadlines_tenants_and_classes_keep_their_order(redis_client):
    store, taker, now = JobStore(redis_client), queues.Taker(redis_client), time.time()
    _create(store, "x_b", lora="B", tenant="x")
    _create(store, "x_a", lora="A", tenant="x")
    _create(store, "y_b", lora="B", tenant="y")
    _create(store, "dl_b", lora="B", deadline=now + 100)  # never passed over
    _create(store, "batch_a", lora="A", priority="batch")  # a later class: after all of Q
    taken = _ids(taker, 5, ["A"], [Q, QB])
    # x and y alternate by their counters; within x's list A's job goes first.
    assert taken == ["dl_b", "x_a", "y_b", "x_b", "batch_a"]


def test_one_take_returns_held_ones_first_then_the_rest(redis_client):
    store, taker = JobStore(redis_client), queues.Taker(redis_client)
    for job_id, lora in [("b1", "B"), ("a1", "A"), ("base", ""), ("a2", "A"), ("b2", "B")]:
        _create(store, job_id, lora=lora)
    taken = taker.take([Q], 10, ["A"])
    assert [(d.job().job_id, d.lora) for d in taken] == [
        ("a1", "A"), ("base", ""), ("a2", "A"), ("b1", "B"), ("b2", "B")
    ]  # fmt: skip
    taker.give_back(taken)  # back in the order they were taken, at the front
    assert queues.depth(redis_client, Q) == 5
    # Holding nothing, the base job first; then the front each time.
    assert _ids(taker, 5, []) == ["base", "a1", "a2", "b1", "b2"]


def test_queued_jobs_per_adapter_count_with_the_backlog(redis_client):
    store, taker = JobStore(redis_client), queues.Taker(redis_client)
    _create(store, "a1", lora="A")
    _create(store, "a2", lora="A")
    _create(store, "b1", lora="B")
    _create(store, "base")
    assert adapter_backlog(redis_client) == {"A": 2, "B": 1}
    assert read_backlog(redis_client)["short"].jobs == 4  # all in the parent's lane
    (d,) = taker.take([Q], 1, ["B"])
    status, token, record = store.acquire(d.job().job_id, "w", 5)
    assert status == "acquired" and record["lora"] == "B"
    assert adapter_backlog(redis_client) == {"A": 2}
    assert store.requeue("b1", token)  # back in the queue: counted again
    assert adapter_backlog(redis_client) == {"A": 2, "B": 1}
    assert store.cancel("a1", "t") == "cancelled"
    assert adapter_backlog(redis_client) == {"A": 1, "B": 1}


def test_adapter_jobs_scale_their_parent_models_pool(redis_client):
    """An adapter's jobs are in its parent's lane: the parent's backlog (what the controller
    scales a pool by) counts them, tokens included."""
    store, lane = JobStore(redis_client), "parent"
    queue = queue_name("short", "interactive", lane)
    for job_id, lora in [("p1", ""), ("p2", "A")]:
        fields = {"id": job_id, "tenant": "t", "status": "queued", "bucket": "short",
                  "backlog": backlog_field("short", lane), "priority": "interactive",
                  "created_at": time.time(), "prompt_tokens": 10, "max_tokens": 5,
                  "lora": lora}  # fmt: skip
        message = queues.encode(JobMessage(job_id, "short", "interactive", 10, 5), queue)
        store.create(NewJob(fields, queue, message, None, 100, 100, 100, 3600))
    backlog = read_backlog(redis_client, lane=lane)["short"]
    assert (backlog.jobs, backlog.tokens) == (2, 30)
    assert adapter_backlog(redis_client) == {"A": 1}
