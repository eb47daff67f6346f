"""The supervisor's pass: counts, cancel, expiry, finalization, and tasks sent again."""

from __future__ import annotations

import threading

import pytest

from tests.conftest import wait_for
from tests.infra.batches.conftest import line
from tide_fleet.infra.batches import supervise, validate
from tide_fleet.infra.batches.finalize import finalize_batch
from tide_fleet.infra.batches.store import FANOUT_CHUNK
from tide_fleet.infra.batches.supervise import FULL_PASS_SECONDS, supervise_batches
from tide_fleet.infra.batches.validate import validate_batch
from tide_fleet.infra.wire.protocol import JobStatus, Keys

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


def test_a_batch_whose_jobs_expired_on_their_own_ends_expired(world, sent):
    """The jobs carry the window as their deadline: past it, workers and the reaper end
    them as expired, which can be before the supervisor's pass sees the window pass."""
    batch_id = _started(world, 3)
    first, _, _ = world.job_ids(batch_id)
    world.finish(first)
    expires_at = float(world.h.batches.get(batch_id)["expires_at"])
    assert len(world.h.jobs.expire_due(now=expires_at + 1)) == 2
    supervise_batches(now=expires_at + 1)  # every line is terminal already
    batch = world.h.batches.get(batch_id)
    assert (batch["status"], batch["final_status"]) == ("finalizing", "expired")
    assert (batch["completed"], batch["failed"]) == ("1", "2")
    assert finalize_batch(batch_id) == "expired"


def test_a_batch_cancelled_after_its_last_line_ended_ends_cancelled(world, sent):
    batch_id = _started(world, 2)
    for job_id in world.job_ids(batch_id):
        world.finish(job_id)
    world.h.batches.transition(batch_id, ["in_progress"], status="cancelling")
    supervise_batches()
    batch = world.h.batches.get(batch_id)
    assert (batch["status"], batch["final_status"]) == ("finalizing", "cancelled")
    assert finalize_batch(batch_id) == "cancelled"


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


def test_a_cancel_while_fanning_out_stops_it_and_leaves_no_job_behind(world, sent):
    lines = 8 * FANOUT_CHUNK
    batch_id = world.new_batch("\n".join(line(f"r{i}", OK) for i in range(lines)))
    result: list[str] = []
    task = threading.Thread(target=lambda: result.append(validate_batch(batch_id)))
    task.start()
    # The route's cancel, once the first pipeline of jobs is written.
    wait_for(lambda: world.h.client.hlen(Keys.batch_lines(batch_id)) > 0, 60)
    assert world.h.batches.transition(batch_id, ["validating"], status="cancelling")
    task.join(60)
    batch = world.h.batches.get(batch_id)
    written = int(batch["total"])
    assert result == ["cancelling"] and batch["status"] == "cancelling", (result, batch)
    assert written < lines and world.h.client.hlen(Keys.batch_lines(batch_id)) == written
    supervise_batches()  # the written lines' queued jobs are cancelled
    statuses = {world.h.jobs.get(j)["status"] for j in world.job_ids(batch_id)}
    assert statuses == {JobStatus.CANCELLED}
    supervise_batches()
    assert world.h.batches.get(batch_id)["status"] == "finalizing"
    assert sent["finalize"].ids == [batch_id]
    assert finalize_batch(batch_id) == "cancelled"
    batch = world.h.batches.get(batch_id)
    assert batch["status"] == "cancelled" and int(batch["total"]) == written


def test_a_cancel_before_fan_out_writes_no_job(world, sent, monkeypatch):
    batch_id = world.new_batch(line("r0", OK))
    checked = validate.check_envelopes

    def check_then_cancel(*args, **kwargs):  # type: ignore[no-untyped-def]
        world.h.batches.transition(batch_id, ["validating"], status="cancelling")
        return checked(*args, **kwargs)

    monkeypatch.setattr(validate, "check_envelopes", check_then_cancel)
    assert validate_batch(batch_id) == "cancelled"
    assert world.h.batches.get(batch_id)["status"] == "cancelled"
    assert not world.h.client.keys("tide:job:*")
