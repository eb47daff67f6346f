"""Batch work yields to interactive work but is never starved (worker queue order)."""

from __future__ import annotations

from infra import queues
from infra.protocol import JobMessage, queue_name
from infra.settings import Settings
from tests.conftest import make_engine
from worker.service import BATCH_EVERY, TAKE_AT_MOST, WorkerService


def test_batch_jobs_age_past_a_stream_of_interactive_ones(redis_server, redis_client, tiny_path):
    for i in range(30):
        q = queue_name("short", "interactive")
        redis_client.lpush(q, queues.encode(JobMessage(f"i{i}", "short", "interactive", 3, 3), q))
    for i in range(3):
        q = queue_name("short", "batch")
        redis_client.lpush(q, queues.encode(JobMessage(f"b{i}", "short", "batch", 3, 3), q))
    service = WorkerService(
        make_engine(tiny_path), Settings(redis_url=redis_server.url), "p", ["short"]
    )
    taken = []
    while polled := service._poll(TAKE_AT_MOST):  # as many per round trip as it may
        for message, job in polled:
            taken.append(job.job_id)
            service.taker.ack_now(message)
    service._shutdown()
    assert len(taken) == 33
    first_batch = taken.index("b0")
    assert first_batch == BATCH_EVERY, taken  # interactive first, but not forever
    gaps = [taken.index(f"b{i + 1}") - taken.index(f"b{i}") for i in range(2)]
    assert all(g == BATCH_EVERY + 1 for g in gaps), taken
