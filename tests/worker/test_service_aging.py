"""Batch work yields to interactive work but is never starved (worker queue order)."""

from __future__ import annotations

from tests.conftest import make_engine
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.protocol import JobMessage, queue_name
from tide_fleet.worker.intake import BATCH_EVERY, TAKE_AT_MOST
from tide_fleet.worker.service import WorkerService


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
    while polled := service.intake.poll(TAKE_AT_MOST):  # as many per round trip as it may
        for message, job in polled:
            taken.append(job.job_id)
            service.taker.ack_now(message)
    service._shutdown()
    assert len(taken) == 33
    first_batch = taken.index("b0")
    assert first_batch == BATCH_EVERY, taken  # interactive first, but not forever
    gaps = [taken.index(f"b{i + 1}") - taken.index(f"b{i}") for i in range(2)]
    assert all(g == BATCH_EVERY + 1 for g in gaps), taken


def test_a_redis_error_while_saving_results_loses_nothing(redis_server, redis_client, tiny_path):
    import pytest
    import redis

    from tide_fleet.infra.jobs.schemas import JobCreate
    from tide_fleet.infra.jobs.submission import ModelInfo, build_job
    from tide_fleet.infra.wire.jobstore import JobStore

    settings = Settings(redis_url=redis_server.url, model=str(tiny_path))
    store = JobStore(redis_client)
    body = JobCreate(prompt="once upon a time", max_tokens=6, ignore_eos=True)
    job_id = store.create(build_job(settings, ModelInfo.load(str(tiny_path)), "t", body, None))[
        "id"
    ]
    service = WorkerService(make_engine(tiny_path), settings, "p", ["short"])
    real_pipeline, failures = service.redis.pipeline, []

    def flaky_pipeline(*args, **kwargs):  # the first write of the result hits an outage
        pipe = real_pipeline(*args, **kwargs)
        real_execute = pipe.execute

        def execute(*a, **k):
            if not failures and any(
                "EVALSHA" in c[0] and service.store._finish.sha in c[0] for c in pipe.command_stack
            ):
                failures.append(1)
                raise redis.ConnectionError("Redis went away")
            return real_execute(*a, **k)

        pipe.execute = execute
        return pipe

    service.redis.pipeline = flaky_pipeline  # type: ignore[method-assign]
    service._come_back()  # connected (the run loop does this first)
    with pytest.raises(redis.ConnectionError):
        for _ in range(100):
            service._iterate()
    assert failures and job_id in service.held  # still held: its lease keeps being refreshed
    assert store.get(job_id)["status"] == "in_progress"  # type: ignore[index]
    service._come_back()  # Redis is back: leases refreshed, the unsaved result written
    record = store.get(job_id)
    assert record is not None and record["status"] == "completed", record
    assert record["completion_tokens"] == "6" and not service.held
    assert redis_client.hlen("unacked") == 0  # and its message acknowledged
    service._shutdown()
