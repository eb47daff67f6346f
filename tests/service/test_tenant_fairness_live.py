"""Token-fair tenants on a live fleet: tenant A queues 500 small jobs, then tenant B 20.
B's jobs wait for their share (about one A job per B job, plus the jobs already in the
workers' slots), not behind A's backlog; all of A's jobs still complete."""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.service.conftest import AUTH

A_JOBS, B_JOBS = 500, 20
JOB = {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 1.0}
SLOTS = 2 * 4  # two workers x --max-num-seqs 4: jobs already taken when B arrives


def _submit(url: str, key: str, n: int, threads: int = 1) -> list[str]:
    """n jobs from `threads` clients at once (A's backlog builds faster than it drains)."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:

        def one(_: int) -> str:
            r = c.post("/v1/jobs", json=JOB)
            assert r.status_code == 202, r.text
            return str(r.json()["id"])

        with ThreadPoolExecutor(threads) as pool:
            return list(pool.map(one, range(n)))


def _records(r, ids: list[str]) -> list[dict[bytes, bytes]]:
    pipe = r.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(f"tide:job:{job_id}", "status", "created_at", "started_at")
    return [dict(zip((b"status", b"created_at", b"started_at"), v, strict=True))
            for v in pipe.execute()]  # fmt: skip


def test_a_tenant_with_a_backlog_cannot_push_another_past_its_share(fleet, fleet_redis):
    assert AUTH["Authorization"] == "Bearer key-a"
    a_ids = _submit(fleet.url, "key-a", A_JOBS, threads=4)
    b_ids = _submit(fleet.url, "key-b", B_JOBS)
    a_left = sum(rec[b"status"] == b"queued" for rec in _records(fleet_redis, a_ids))
    deadline = time.monotonic() + 100
    while time.monotonic() < deadline:
        recs = _records(fleet_redis, a_ids + b_ids)
        if all(rec[b"status"] == b"completed" for rec in recs):
            break
        time.sleep(0.5)
    assert all(rec[b"status"] == b"completed" for rec in recs), "not all jobs completed"
    starts = sorted(float(rec[b"started_at"]) for rec in recs)
    rate = (len(starts) - 1) / (starts[-1] - starts[0])  # jobs started per second
    b_waits = [float(rec[b"started_at"]) - float(rec[b"created_at"]) for rec in recs[A_JOBS:]]
    b_p99 = statistics.quantiles(b_waits, n=100, method="inclusive")[98]
    # The share rule: with equal weights and sizes B waits at most one A job per B job, after
    # the jobs already in the workers' slots; 1 s for the submission of B's 20 and jitter.
    bound = (2 * B_JOBS + SLOTS) / rate + 1.0
    a_drain = a_left / rate  # what B would wait behind A's queue in one FIFO
    print(
        f"rate {rate:.1f} jobs/s; A queued at B's arrival {a_left} (FIFO wait {a_drain:.1f} s);"
        f" B p99 wait {b_p99:.2f} s, max {max(b_waits):.2f} s; bound {bound:.2f} s"
    )
    assert a_left >= 2 * B_JOBS + SLOTS, "A's backlog drained before B came: nothing shared"
    assert b_p99 <= bound, (b_p99, bound)
