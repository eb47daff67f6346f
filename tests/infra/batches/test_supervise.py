"""The supervisor's pass: counts, cancel, expiry, finalization, and tasks sent again."""

from __future__ import annotations

import pytest

from infra.batches import supervise
from infra.batches.supervise import FULL_PASS_SECONDS, supervise_batches
from infra.batches.validate import validate_batch
from infra.wire.protocol import JobStatus, Keys
from tests.infra.batches.conftest import line

OK = {"prompt": "Once upon a time", "max_tokens": 4}


class Sent:
    def __init__(self) -> None:
        self.ids: list[str] = []

    def delay(self, batch_id: str) -> None:
        self.ids.append(batch_id)


@pytest.fixture
def sent(monkeypatch):
    tasks = {"validate": Sent(), "finalize": Sent()}
    monkeypatch.setattr(supervise, "validate_batch", tasks["validate"])
    monkeypatch.setattr(supervise, "finalize_batch", tasks["finalize"])
    return tasks


def _started(world, n: int, **fields) -> str:
    batch_id = world.new_batch("\n".join(line(f"r{i}", OK) for i in range(n)), **fields)
    assert validate_batch(batch_id) == "in_progress"
    return batch_id


def test_counts_follow_the_jobs_and_a_done_batch_finalizes(world, sent):
    batch_id = _started(world, 3)
    first, second, third = world.job_ids(batch_id)
    world.finish(first)
    world.finish(second, JobStatus.FAILED)
    supervise_batches()
    batch = world.h.batches.get(batch_id)
    assert (batch["completed"], batch["failed"], batch["status"]) == ("1", "1", "in_progress")
    assert sent["finalize"].ids == []
    world.finish(third)
    supervise_batches()
    batch = world.h.batches.get(batch_id)
    assert (batch["completed"], batch["failed"], batch["status"]) == ("2", "1", "finalizing")
    assert sent["finalize"].ids == [batch_id]


def test_counters_between_full_passes(world, sent):
    batch_id = _started(world, 2)
    first, _ = world.job_ids(batch_id)
    supervise_batches(now=1000.0)  # a full pass
    world.h.client.hset(Keys.job(first), "status", "completed")  # behind the counters' back
    supervise_batches(now=1001.0)
    assert world.h.batches.get(batch_id)["completed"] == "0"  # the counters said nothing
    supervise_batches(now=1001.0 + FULL_PASS_SECONDS)
    assert world.h.batches.get(batch_id)["completed"] == "1"


def test_cancel_stops_queued_jobs_and_running_ones_finish(world, sent):
    batch_id = _started(world, 3)
    first, second, third = world.job_ids(batch_id)
    world.finish(first)
    _, token, _ = world.h.jobs.acquire(second, "w1", lease_seconds=30)  # running
    world.h.batches.transition(batch_id, ["in_progress"], status="cancelling")
    supervise_batches()
    batch = world.h.batches.get(batch_id)
    assert (batch["stop"], batch["final_status"]) == ("1", "cancelled")
    assert world.h.jobs.get(third)["status"] == JobStatus.CANCELLED
    assert world.h.jobs.get(second)["status"] == JobStatus.IN_PROGRESS
    assert world.h.jobs.finish(second, token, "t", JobStatus.COMPLETED, text="x")
    supervise_batches()
    assert world.h.batches.get(batch_id)["status"] == "finalizing"
    assert sent["finalize"].ids == [batch_id]


def test_a_batch_past_its_window_expires(world, sent):
    batch_id = _started(world, 2)
    expires_at = float(world.h.batches.get(batch_id)["expires_at"])
    supervise_batches(now=expires_at - 1)
    assert world.h.batches.get(batch_id).get("stop") is None
    supervise_batches(now=expires_at + 1)
    batch = world.h.batches.get(batch_id)
    assert (batch["stop"], batch["final_status"]) == ("1", "expired")
    assert all(
        world.h.jobs.get(j)["status"] == JobStatus.CANCELLED for j in world.job_ids(batch_id)
    )


def test_lost_tasks_are_sent_again(world, sent):
    waiting = world.new_batch(line("a", OK), validate_sent_at=1000.0)
    supervise_batches(now=1030.0)
    assert sent["validate"].ids == []
    supervise_batches(now=1061.0)
    assert sent["validate"].ids == [waiting]
    assert world.h.batches.get(waiting)["validate_sent_at"] == "1061.0"
    done = _started(world, 1)
    world.finish(*world.job_ids(done))
    supervise_batches(now=2000.0)
    assert sent["finalize"].ids == [done]
    supervise_batches(now=2061.0)
    assert sent["finalize"].ids == [done, done]


def test_ended_and_missing_batches_leave_the_active_set(world, sent):
    failed = world.new_batch("not json")
    assert validate_batch(failed) == "failed"
    world.h.client.sadd(Keys.active_batches, "batch_missing")
    supervise_batches()
    assert world.h.client.smembers(Keys.active_batches) == set()
