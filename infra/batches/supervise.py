"""Following active batches: counts, cancel, expiry, and the start of finalization.

The reaper (later the controller) calls ``supervise_batches`` on every pass. Counts come
from the counters the job scripts keep on the batch, checked against every line's job
record at least every ``FULL_PASS_SECONDS``. A batch to stop (cancelled, or past its
window) has its queued jobs cancelled; running ones finish. When every line is terminal
the batch moves to ``finalizing`` and the finalize task is sent. A validate or finalize
task lost with a killed Celery worker is sent again after ``batch_retry_seconds``.
"""

from __future__ import annotations

import time

from tide_fleet.infra.batches.finalize import finalize_batch
from tide_fleet.infra.batches.store import FANOUT_CHUNK, REFUSED, BatchStore, handles
from tide_fleet.infra.batches.validate import validate_batch
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.protocol import JobStatus, Keys

FULL_PASS_SECONDS = 30.0  # read every line's status at least this often (counters' check)
_last_full_pass: dict[str, float] = {}


def _line_states(batches: BatchStore, batch_id: str, total: int) -> list[str]:
    """Per line, in input order: a job status, or 'error' for a line refused at fan-out."""
    lines = batches.lines(batch_id)
    ids = [lines.get(i, REFUSED) for i in range(total)]
    pipe = batches.r.pipeline(transaction=False)
    for v in ids:
        if not v.startswith(REFUSED):
            pipe.hget(Keys.job(v), "status")
    statuses = iter(pipe.execute())
    out = []
    for v in ids:
        if v.startswith(REFUSED):
            out.append("error")
        else:
            st = next(statuses)
            out.append(st.decode() if st else "expired")
    return out


def _cancel_queued(batches: BatchStore, jobs: JobStore, batch_id: str, tenant: str) -> None:
    """Cancel the batch's jobs that have not started; running ones finish."""
    lines = [raw.decode() for raw in batches.r.hvals(Keys.batch_lines(batch_id))]
    jobs.cancel_queued([j for j in lines if not j.startswith(REFUSED)], tenant, FANOUT_CHUNK)


def _forget(batch_id: str) -> None:
    handles().client.srem(Keys.active_batches, batch_id)
    _last_full_pass.pop(batch_id, None)


def supervise_batches(now: float | None = None) -> None:
    """One pass over active batches: counts, cancel, expiry, and the start of finalization."""
    h = handles()
    client, batches = h.client, h.batches
    now = time.time() if now is None else now
    retry = h.settings.batch_retry_seconds
    for raw in client.smembers(Keys.active_batches):
        batch_id = raw.decode()
        batch = batches.get(batch_id)
        if batch is None:
            _forget(batch_id)
            continue
        status = batch["status"]
        if status in ("validating", "cancelling") and not batch.get("total"):
            # Not fanned out yet. A validate task lost with a killed Celery worker would
            # only come back after the broker's visibility timeout: send it again.
            if now - float(batch.get("validate_sent_at") or now) > retry:
                batches.update(batch_id, validate_sent_at=now)
                validate_batch.delay(batch_id)
            continue
        if status in ("failed", "cancelled"):
            _forget(batch_id)
            continue
        total = int(batch.get("total") or 0)
        counted = int(batch.get("jobs_terminal") or 0) + int(batch.get("refused") or 0)
        if counted < total and now - _last_full_pass.get(batch_id, 0.0) < FULL_PASS_SECONDS:
            # The job scripts count terminal jobs: no need to read every line's status.
            completed, terminal = int(batch.get("jobs_completed") or 0), counted
        else:  # done by the counters, or time to check them against the records
            _last_full_pass[batch_id] = now
            states = _line_states(batches, batch_id, total)
            completed = states.count("completed")
            terminal = sum(1 for s in states if s == "error" or JobStatus(s).is_terminal)
        batches.update(batch_id, completed=completed, failed=terminal - completed)
        if terminal == total and status in ("in_progress", "cancelling"):
            # A cancel ends the batch cancelled even when its last line had ended first.
            # Lines carry the window as their deadline: ended by it, they make the batch
            # expired even when no pass saw the window pass first.
            final = {}
            if not batch.get("final_status"):
                if status == "cancelling":
                    final = {"final_status": "cancelled"}
                elif JobStatus.EXPIRED in states:  # every line was read: terminal == total
                    final = {"final_status": "expired"}
            moved = batches.transition(
                batch_id, [status], status="finalizing", finalizing_at=now,
                finalize_sent_at=now, **final,
            )  # fmt: skip
            if moved:
                finalize_batch.delay(batch_id)
        elif status in ("cancelling", "in_progress") and batch.get("stop") != "1":
            expired = status == "in_progress" and now > float(batch["expires_at"])
            if status == "cancelling" or expired:
                final = "cancelled" if status == "cancelling" else "expired"
                batches.update(batch_id, stop="1", final_status=final)
                _cancel_queued(batches, h.jobs, batch_id, batch["tenant"])
        elif status == "finalizing" and now - float(batch.get("finalize_sent_at") or now) > retry:
            batches.update(batch_id, finalize_sent_at=now)
            finalize_batch.delay(batch_id)  # a finalize task was lost: run it again
