"""Results are written beside the engine's step (``tide_fleet.worker.writer``), against a real Redis
behind a loopback proxy that slows every round trip: the engine keeps stepping while a
flush is in flight, every job still ends with its greedy tokens and its events in order,
a connection cut mid-flush is an outage that loses nothing (the failed batch goes back in
front of what was recorded since), and a final write that landed but is not settled yet
does not read as a lost lease. A job's webhook is scheduled by its final write itself,
only when that write won."""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import make_engine, wait_for
from tests.worker.service_driver import events, run, service, settings, submit
from tide_fleet.infra.bench.delay_proxy import DelayProxy
from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.protocol import Keys
from tide_fleet.worker.engine import LLMEngine, RequestOutput, SamplingParams
from tide_fleet.worker.held import Choice, Held, HeldJob
from tide_fleet.worker.results import PendingWrites
from tide_fleet.worker.service import WorkerService

DELAY = 0.15  # added to every round trip through the proxy
PROMPTS = ["once upon a time", "the little dog ran to the park", "lily wanted"]


@pytest.fixture
def proxy(redis_server, request) -> Iterator[DelayProxy]:  # type: ignore[no-untyped-def]
    p = DelayProxy(redis_server.port, getattr(request, "param", DELAY)).start()
    yield p
    p.stop()


def _worker(url: str, model: Path, inline: bool = False) -> WorkerService:
    return WorkerService(make_engine(model), settings(url, model), "p", ["short"],
                         write_inline=inline)  # fmt: skip


def _log_steps(worker: WorkerService, pause: float = 0.0) -> list[tuple[int, bool]]:
    """At the start of every engine step: (flushes started so far, a flush in flight)."""
    log: list[tuple[int, bool]] = []
    real_step = worker.engine.step

    def step() -> list[RequestOutput]:
        log.append((worker.writer.num_flushes, worker.writer.is_busy))
        if pause:
            threading.Event().wait(pause)
        return real_step()

    worker.engine.step = step  # type: ignore[method-assign]
    return log


def _record(client: redis.Redis, job_id: str) -> dict[str, str]:
    return JobStore(client).get(job_id) or {}


def _check(client: redis.Redis, job_id: str, reference: LLMEngine) -> None:
    """Completed once, with the engine's own greedy output, its stream whole and in order."""
    record = _record(client, job_id)
    assert record["status"] == "completed" and record["attempts"] == "1", record
    params = SamplingParams(**json.loads(record["sampling"]))
    alone = reference.generate([json.loads(record["token_ids"])], [params])[0]
    assert record["text"] == alone.text
    assert int(record["completion_tokens"]) == len(alone.token_ids) == params.max_tokens
    stream = events(client, job_id)
    assert [e["type"] for e in stream] == ["delta"] * (len(stream) - 1) + ["done"]
    assert "".join(e["text"] for e in stream[:-1]) == record["text"]
    assert sum(int(e["n"]) for e in stream[:-1]) == params.max_tokens


def _serve(worker: WorkerService) -> threading.Thread:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return thread


# Inline writes make one round trip per step: a shorter delay keeps that run short.
@pytest.mark.parametrize(("proxy", "inline"), [(DELAY, False), (DELAY / 3, True)],
                         ids=["writer", "inline"], indirect=["proxy"])  # fmt: skip
def test_the_engine_steps_while_a_slow_flush_is_in_flight(proxy, redis_client, tiny_path, inline):
    worker = _worker(proxy.url, tiny_path, inline)
    steps = _log_steps(worker)
    ids = [submit(redis_client, tiny_path, p, max_tokens=16, temperature=0, ignore_eos=True)
           for p in PROMPTS]  # fmt: skip
    thread = _serve(worker)
    try:
        wait_for(lambda: all(_record(redis_client, j)["status"] == "completed" for j in ids),
                 what="every job completed")  # fmt: skip
    finally:
        worker.drain()
        thread.join(timeout=30)
    assert not thread.is_alive() and not worker.held
    during = Counter(flush for flush, busy in steps if busy)  # steps begun during each flush
    if inline:
        assert not during, "an inline write overlapped a step"
    else:
        assert max(during.values(), default=0) > 1, f"the step waited for the write: {steps}"
    reference = make_engine(tiny_path)
    for job_id in ids:
        _check(redis_client, job_id, reference)


def test_a_connection_cut_mid_flush_is_an_outage_that_loses_nothing(proxy, redis_client, tiny_path):
    worker = _worker(proxy.url, tiny_path)
    _log_steps(worker, pause=0.005)  # so the job outlives the cut
    restored: list[int] = []
    real_restore = worker.pending.restore

    def restore(*args: Any) -> None:
        restored.append(1)
        real_restore(*args)

    worker.pending.restore = restore  # type: ignore[method-assign]
    flushing = threading.Event()  # the writer began a flush
    real_pipeline = worker.redis.pipeline

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name.startswith("tide-writer"):
            flushing.set()
        return real_pipeline(*args, **kwargs)

    worker.redis.pipeline = pipeline  # type: ignore[method-assign]
    job_id = submit(redis_client, tiny_path, max_tokens=48, temperature=0, ignore_eos=True)
    thread = _serve(worker)
    try:
        wait_for(lambda: _record(redis_client, job_id).get("first_token_at"), what="a token")
        flushing.clear()
        assert flushing.wait(30), "no flush began"
        proxy.cut()  # within its first round trip: every connection dropped, none taken
        wait_for(lambda: worker.outage.is_down, what="the outage seen")
        threading.Event().wait(0.5)
        assert thread.is_alive() and job_id in worker.held
        proxy.resume()
        wait_for(lambda: _record(redis_client, job_id)["status"] == "completed",
                 what="the result written once Redis answered again")  # fmt: skip
    finally:
        worker.drain()
        thread.join(timeout=30)
    assert restored, "the failed flush was not given back"
    assert worker.outage.outages >= 1 and not worker.held
    _check(redis_client, job_id, make_engine(tiny_path))


def _on_final_write(worker: WorkerService, before: Any = None, after: Any = None) -> None:
    """Call `before()` / `after()` around the execute of each pipeline that finishes a job."""
    real_pipeline = worker.redis.pipeline

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = real_pipeline(*args, **kwargs)
        real_execute = pipe.execute

        def execute(*a: Any, **k: Any) -> Any:
            finishing = any(worker.store._finish.sha in str(c[0]) for c in pipe.command_stack)
            if finishing and before:
                before()
            out = real_execute(*a, **k)
            if finishing and after:
                after()
            return out

        pipe.execute = execute
        return pipe

    worker.redis.pipeline = pipeline  # type: ignore[method-assign]


def _iterate_until(worker: WorkerService, done: Any, turns: int = 200) -> None:
    for _ in range(turns):
        worker._iterate()
        if done():
            return
    raise AssertionError("not reached")


def test_a_final_write_that_landed_unsettled_is_not_a_lost_lease(
    redis_server, redis_client, tiny_path, caplog
):
    """The final write clears the lease; a refresh that reads it before the write is settled
    must wait for the settle, not drop the job as reaped."""
    worker = service(redis_server.url, tiny_path)
    landed, release = threading.Event(), threading.Event()
    _on_final_write(worker, after=lambda: (landed.set(), release.wait(10)))
    job_id = submit(redis_client, tiny_path, max_tokens=4, ignore_eos=True)
    _iterate_until(worker, landed.is_set)
    assert _record(redis_client, job_id)["status"] == "completed"
    worker._next_refresh = 0.0  # refresh now: the lease reads as gone
    with caplog.at_level(logging.WARNING, logger="tide_fleet.worker.service"):
        worker._iterate()
        assert job_id in worker.held  # let go only by the settle
        release.set()
        run(worker, redis_client, job_id)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    assert worker.writer.served_work == int(_record(redis_client, job_id)["prompt_tokens"]) + 4
    worker._shutdown()


def test_the_final_write_schedules_the_webhook_itself(redis_server, redis_client, tiny_path):
    """A worker killed just after its final write must not lose the job's webhook (nobody
    runs a completed job again): the delivery is due once that pipeline has run."""
    worker = service(redis_server.url, tiny_path)
    landed, release = threading.Event(), threading.Event()
    _on_final_write(worker, after=lambda: (landed.set(), release.wait(10)))
    job_id = submit(redis_client, tiny_path, max_tokens=4, ignore_eos=True)
    redis_client.hset(Keys.job(job_id), "webhook_url", "http://127.0.0.1:9/hook")
    _iterate_until(worker, landed.is_set)
    msg_id = f"msg_{job_id}_completed"
    try:  # the writer is still inside that execute
        assert redis_client.zscore(Keys.webhooks_due, msg_id) is not None
        delivery = redis_client.hgetall(Keys.webhook(msg_id))
        assert delivery == {b"kind": b"job", b"obj_id": job_id.encode()}
    finally:
        release.set()
    run(worker, redis_client, job_id)
    worker._shutdown()


def test_a_final_write_that_lost_the_lease_schedules_no_webhook(
    redis_server, redis_client, tiny_path
):
    worker = service(redis_server.url, tiny_path)
    job_id = submit(redis_client, tiny_path, max_tokens=4, ignore_eos=True)
    redis_client.hset(Keys.job(job_id), "webhook_url", "http://127.0.0.1:9/hook")
    # Reaped and taken by another worker just before the final write lands.
    _on_final_write(worker, before=lambda: redis_client.hset(Keys.job(job_id), "lease_token", "x"))
    _iterate_until(worker, lambda: job_id not in worker.held)
    assert _record(redis_client, job_id)["status"] == "in_progress"
    assert redis_client.zcard(Keys.webhooks_due) == 0
    assert not redis_client.exists(Keys.webhook(f"msg_{job_id}_completed"))
    worker._shutdown()


def test_a_failed_batch_goes_back_before_what_was_recorded_since():
    held = Held()
    a, b = (HeldJob(j, "token", "t", queues.Delivery("q", j, "{}"), False) for j in "ab")
    for job in (a, b):
        job.choices = [Choice(0, job.job_id)]
        held.add(job)
    pending = PendingWrites()
    pending.record(held, [RequestOutput("a", [5], "x"), RequestOutput("b", [6], "y")])
    batch = pending.take()  # in flight
    assert batch and not pending
    done = RequestOutput("a", [7], "z", finished=True, token_ids=[5, 7], text="xz")
    pending.record(held, [done, RequestOutput("b", [8], "w")])
    held.pop("b")  # its lease was lost meanwhile: nothing of it is written
    pending.forget("b")
    pending.restore(batch, held)  # the flush failed
    assert [(j.job_id, e["text"]) for j, e in pending.deltas] == [("a", "x"), ("a", "z")]
    assert pending.generated == 4  # every token computed counts, b's dropped ones too
    assert pending.first_tokens == [a] and pending.started == []
    assert [(job, fields["text"]) for job, _, fields in pending.finished] == [(a, "xz")]
