"""Token-fair tenants within a queue: least weighted service first, new tenants at the
minimum, classes and deadlines first, and every path keeping the tenant lists whole."""

from __future__ import annotations

import time

from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.new_job import NewJob
from tide_fleet.infra.wire.protocol import JobMessage, Keys, queue_name

Q, QB = queue_name("short", "interactive"), queue_name("short", "batch")


def _create(
    store: JobStore, job_id: str, tenant: str, priority: str = "interactive",
    deadline: float | None = None, weight: float = 1.0, ttl: float | None = None,
) -> None:  # fmt: skip
    now = time.time()
    fields = {"id": job_id, "tenant": tenant, "status": "queued", "bucket": "short",
              "priority": priority, "created_at": now, "prompt_tokens": 10, "max_tokens": 5,
              "n": 2}  # fmt: skip
    if weight != 1.0:
        fields["share_weight"] = weight
    if deadline is not None:
        fields["deadline"] = fields["expire_at"] = deadline
    if ttl is not None:
        fields["expire_at"] = now + ttl
    queue = queue_name("short", priority)
    message = queues.encode(JobMessage(job_id, "short", priority, 10, 10), queue)
    store.create(NewJob(fields, queue, message, None, 10_000, 10_000, 10_000, 3600))


def _take_one_by_one(taker: queues.Taker, n: int, names: list[str] | None = None) -> list[str]:
    out = []
    for _ in range(n):
        out += [d.job().job_id for d in taker.take(names or [Q], 1)]
    return out


def test_a_small_tenant_waits_at_most_one_big_tenant_job_per_job(redis_client):
    store, taker = JobStore(redis_client), queues.Taker(redis_client)
    for i in range(500):
        _create(store, f"a{i}", "a")
    for i in range(20):
        _create(store, f"b{i}", "b")
    taken = _take_one_by_one(taker, 60)
    # Equal weights and sizes: B enters at A's counter and the two alternate, so B's k-th
    # job is taken by take 2k; all 20 within 40 takes.
    last_b = max(i for i, j in enumerate(taken, 1) if j.startswith("b"))
    assert last_b <= 40 and sum(j.startswith("b") for j in taken) == 20
    assert [j for j in taken if j.startswith("a")][:5] == ["a0", "a1", "a2", "a3", "a4"]


def test_weights_two_to_one_give_two_to_one_service(redis_client):
    store, taker = JobStore(redis_client), queues.Taker(redis_client)
    for i in range(100):
        _create(store, f"a{i}", "a", weight=2.0)
        _create(store, f"b{i}", "b")
    taken = taker.take([Q], 60)  # many per round trip: the counter moves within the take
    counts = {t: sum(d.job().job_id.startswith(t) for d in taken) for t in "ab"}
    assert abs(counts["a"] - 40) <= 1 and abs(counts["b"] - 20) <= 1


def test_a_new_tenant_gets_no_credit_for_idle_time(redis_client):
    store, taker = JobStore(redis_client), queues.Taker(redis_client)
    for i in range(200):
        _create(store, f"a{i}", "a")
    assert all(j.startswith("a") for j in _take_one_by_one(taker, 100))
    for i in range(50):
        _create(store, f"b{i}", "b")
    later = _take_one_by_one(taker, 20)
    assert 9 <= sum(j.startswith("b") for j in later) <= 11  # a share, not a catch-up


def test_classes_first_then_deadlines_then_the_fairest_tenant(redis_client):
    store, taker, now = JobStore(redis_client), queues.Taker(redis_client), time.time()
    for i in range(3):
        _create(store, f"a{i}", "a")
    _create(store, "b_batch", "b", priority="batch")
    _create(store, "b_late", "b", deadline=now + 300)
    _create(store, "a_soon", "a", deadline=now + 100)
    _create(store, "b0", "b")
    taken = _take_one_by_one(taker, 7, [Q, QB])
    assert taken[:2] == ["a_soon", "b_late"]  # EDF ahead of fairness, charged to the tenant
    assert taken[2:6] == ["a0", "b0", "a1", "a2"] and taken[6] == "b_batch"


def _fair_state(r, q: str = Q) -> tuple[int, int, list[bytes]]:
    tenants = [t for t in r.zrange(Keys.queue_tenants(q), 0, -1)]
    listed = sum(r.llen(Keys.tenant_queue(q, t.decode())) for t in tenants)
    return queues.depth(r, q), listed, tenants


def test_every_path_keeps_the_tenant_lists_whole(redis_client):
    store, taker, r = JobStore(redis_client), queues.Taker(redis_client), redis_client
    for i in range(5):
        _create(store, f"a{i}", "a")
        _create(store, f"b{i}", "b")
    _create(store, "b_exp", "b", ttl=0.01)
    scores = r.zrange(Keys.queue_tenants(Q), 0, -1, withscores=True)
    taker.give_back(taker.take([Q], 4))  # given back: charges refunded, order kept
    assert r.zrange(Keys.queue_tenants(Q), 0, -1, withscores=True) == scores
    assert _fair_state(r)[:2] == (11, 11) and r.hlen("unacked") == 0
    (d,) = taker.take([Q], 1)
    status, token, _ = store.acquire(d.job().job_id, "w", 5)
    assert status == "acquired" and store.requeue(d.job().job_id, token)  # drain hand-back
    taker.ack_now(d)
    (d,) = taker.take([Q], 1)  # the same job again: back at its tenant's front
    assert d.job().job_id == "a0"
    assert store.restore_stranded(older_than=0, now=time.time() + 1) == ["a0"]
    _, token, _ = store.acquire("b1", "w", 1)  # b1 is taken out of turn and its worker dies
    assert store.reap(max_attempts=3, now=time.time() + 5) == {"b1": "requeued"}
    assert store.cancel("a3", "a") == "cancelled"  # its message stays, skipped at pickup
    time.sleep(0.02)
    assert store.expire_due() == ["b_exp"]
    depth, listed, tenants = _fair_state(r)
    assert depth == listed == 12 and sorted(tenants) == [b"a", b"b"]  # b1's copy: 11 + 1
    drained = [d for d in taker.take([Q], 100)]
    ids = [d.job().job_id for d in drained]
    assert sorted(set(ids)) == sorted([f"a{i}" for i in range(5)] + [f"b{i}" for i in range(5)]
                                      + ["b_exp"])  # fmt: skip
    assert ids.count("b1") == 2 and len(ids) == 12  # nothing lost; only the reaped duplicate
    b1_charges = [float(d.charged) for d in drained if d.job().job_id == "b1"]
    assert sorted(b1_charges)[0] == 0 < sorted(b1_charges)[1]  # its two copies: charged once
    charged = {d.job().job_id: d.charged for d in drained}
    assert charged["a3"] == charged["b_exp"] == "0"  # ended jobs cost nothing
    assert _fair_state(r) == (0, 0, []) and r.get(Keys.queue_waiting(Q)) == b"0"
