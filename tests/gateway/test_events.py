"""Reading several jobs' event streams at once, including the end of a job whose last
events arrive while its record is being read."""

from __future__ import annotations

import asyncio
import json

import redis.asyncio as aredis

from tide_fleet.gateway.events import job_events, many_job_events
from tide_fleet.infra.wire.codec import decode_hash
from tide_fleet.infra.wire.protocol import Keys


class State:
    """What the readers use of GatewayState: the async client and get_job."""

    def __init__(self, url: str, on_get=None) -> None:  # type: ignore[no-untyped-def]
        self.aredis = aredis.Redis.from_url(url)
        self.on_get = on_get

    async def get_job(self, job_id: str) -> dict[str, str] | None:
        if self.on_get is not None:
            await self.on_get(self, job_id)
        raw = await self.aredis.hgetall(Keys.job(job_id))
        return decode_hash(raw) if raw else None


def collect(url: str, job_ids: list[str], on_get=None) -> list:  # type: ignore[no-untyped-def]
    async def run() -> list:
        state = State(url, on_get)
        try:
            return [e async for e in many_job_events(state, job_ids)]  # type: ignore[arg-type]
        finally:
            await state.aredis.aclose()

    return asyncio.run(run())


def test_two_jobs_interleave_and_each_ends_with_its_done(redis_server, redis_client):
    for job_id in ("a", "b"):
        redis_client.hset(Keys.job(job_id), mapping={"status": "completed", "text": "x"})
    redis_client.xadd(Keys.events("a"), {"type": "delta", "text": "1", "i": "0"})
    redis_client.xadd(Keys.events("b"), {"type": "delta", "text": "2", "i": "1"})
    redis_client.xadd(Keys.events("b"), {"type": "done", "status": "completed"})
    redis_client.xadd(Keys.events("a"), {"type": "done", "status": "completed"})
    events = collect(redis_server.url, ["a", "b"])
    for k, text in ((0, "1"), (1, "2")):
        mine = [e for j, e in events if j == k]
        assert [(e["type"], e.get("text")) for e in mine] == [("delta", text), ("done", None)]


def test_events_written_while_the_record_is_read_are_not_lost(redis_server, redis_client):
    redis_client.hset(Keys.job("j"), mapping={"status": "in_progress"})

    async def finish_now(state: State, job_id: str) -> None:  # the worker's finish, racing
        if await state.aredis.hget(Keys.job(job_id), "status") == b"in_progress":
            await state.aredis.xadd(Keys.events(job_id), {"type": "delta", "text": "late"})
            await state.aredis.hset(Keys.job(job_id), mapping={"status": "completed"})
            await state.aredis.xadd(Keys.events(job_id), {"type": "done", "status": "completed"})

    events = [e for _, e in collect(redis_server.url, ["j"], finish_now)]
    assert events == [{"type": "delta", "text": "late"}, {"type": "done", "status": "completed"}]


def test_a_finished_job_without_a_stream_replays_each_choice(redis_server, redis_client):
    choices = [{"index": i, "text": f"c{i}", "finish_reason": "stop", "completion_tokens": 1,
                "logprobs": None} for i in (0, 1)]  # fmt: skip
    redis_client.hset(Keys.job("r"), mapping={"status": "completed", "text": "c0",
                                              "choices": json.dumps(choices)})  # fmt: skip
    events = [e for _, e in collect(redis_server.url, ["r"])]
    assert [(e["type"], e.get("text"), e.get("i")) for e in events] == [
        ("delta", "c0", "0"), ("delta", "c1", "1"), ("done", None, None)]  # fmt: skip


def test_a_missing_record_ends_one_jobs_events_quietly(redis_server, redis_client):
    async def run() -> list:
        state = State(redis_server.url)
        try:
            return [e async for e in job_events(state, "gone")]  # type: ignore[arg-type]
        finally:
            await state.aredis.aclose()

    assert asyncio.run(run()) == []
