"""The per-tenant recent-jobs index the create script keeps for the console's job list:
written with the job, batch lines left out, capped, expiring with the job TTL."""

from __future__ import annotations

import time

from tide_fleet.infra.wire.job_scripts import RECENT_JOBS_PER_TENANT, RECENT_JOBS_SLACK
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.new_job import NewJob
from tide_fleet.infra.wire.protocol import Keys

BIG = 10**6  # limits (tenant, queue, rate) out of the way


def _fields(job_id: str, tenant: str, created_at: float, **extra: object) -> dict[str, object]:
    return {"id": job_id, "tenant": tenant, "status": "queued", "bucket": "short",
            "priority": "interactive", "created_at": created_at, **extra}  # fmt: skip


def _create(store: JobStore, job_id: str, tenant: str = "t", created_at: float | None = None,
            idempotency_key: str | None = None, **extra: object) -> dict[str, str]:  # fmt: skip
    fields = _fields(job_id, tenant, created_at or time.time(), **extra)
    return store.create(NewJob(fields, "q", "msg", idempotency_key, BIG, BIG, BIG, 3600))


def test_a_new_job_is_listed_for_its_tenant_only(redis_client):
    store = JobStore(redis_client)
    _create(store, "job_a1", "a", created_at=100.0)
    _create(store, "job_a2", "a", created_at=200.0)
    _create(store, "job_b1", "b", created_at=150.0)
    assert redis_client.zrevrange(Keys.tenant_jobs("a"), 0, -1) == [b"job_a2", b"job_a1"]
    assert redis_client.zrange(Keys.tenant_jobs("b"), 0, -1, withscores=True) == [
        (b"job_b1", 150.0)
    ]
    assert 3500 < redis_client.ttl(Keys.tenant_jobs("a")) <= 3600  # the job TTL


def test_batch_lines_and_idempotent_repeats_are_not_listed(redis_client):
    store = JobStore(redis_client)
    _create(store, "job_line", batch_id="batch_1", batch_line=0)
    _create(store, "job_once", idempotency_key="k")
    assert _create(store, "job_again", idempotency_key="k")["id"] == "job_once"
    assert redis_client.zrange(Keys.tenant_jobs("t"), 0, -1) == [b"job_once"]


def test_the_index_keeps_the_newest_jobs_within_its_cap(redis_client):
    store = JobStore(redis_client)
    total = RECENT_JOBS_PER_TENANT + RECENT_JOBS_SLACK + 1
    pipe = redis_client.pipeline(transaction=False)
    for i in range(total):
        fields = _fields(f"job_{i:05d}", "t", float(i))
        keys, args = NewJob(fields, "q", "m", None, BIG, BIG, BIG, 3600).script_call()
        store.create_script(keys=keys, args=args, client=pipe)
    pipe.execute()
    key = Keys.tenant_jobs("t")
    assert redis_client.zcard(key) == RECENT_JOBS_PER_TENANT  # trimmed once over the slack
    newest = redis_client.zrevrange(key, 0, 0)[0].decode()
    oldest = redis_client.zrange(key, 0, 0)[0].decode()
    assert newest == f"job_{total - 1:05d}"
    assert oldest == f"job_{total - RECENT_JOBS_PER_TENANT:05d}"
    for i in range(RECENT_JOBS_SLACK):  # below the slack again: no trim, the set grows
        _create(store, f"job_more_{i}", created_at=10**6 + i)
    assert redis_client.zcard(key) == RECENT_JOBS_PER_TENANT + RECENT_JOBS_SLACK
