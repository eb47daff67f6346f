"""Reading jobs' event streams (token deltas, then a final status) from Redis."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from tide_fleet.gateway.deps import GatewayState
from tide_fleet.infra.jobs.openai_format import record_choices
from tide_fleet.infra.wire.codec import decode_hash
from tide_fleet.infra.wire.protocol import JobStatus, Keys

MISSING = "missing"  # the job's record is gone
RECHECK_SECONDS = 3.0  # records read while streams are busy, for jobs that end silently


def _replay(record: dict[str, str]) -> list[dict[str, Any]]:
    """A finished job's result as deltas, one per choice (its stream has expired)."""
    out = []
    for c in record_choices(record):
        if c.get("text") or c.get("logprobs"):
            delta = {"type": "delta", "text": c.get("text", ""), "i": str(c.get("index", 0)),
                     "n": c.get("completion_tokens")}  # fmt: skip
            if c.get("logprobs") is not None:
                delta["lp"] = json.dumps(c["logprobs"])
            out.append(delta)
    return out


async def many_job_events(
    state: GatewayState, job_ids: list[str]
) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    """(job's position, event) for several jobs at once, in one XREAD: each job's
    {"type": "delta", "text", "n", "i", "lp"} events, then its {"type": "done", "status"}
    (status "missing" when the record is gone). Replays from the start, so it works for
    finished jobs too; when a stream has expired, a finished job's result is replayed.

    A job that ends without a "done" event (never started, reaped) is found by reading
    the records: after a second with no event on any stream, and every few seconds."""
    position = {Keys.events(j): k for k, j in enumerate(job_ids)}
    last = {key: "0" for key in position}
    checked = time.monotonic()
    while last:
        streams: dict[Any, Any] = dict(last)
        entries: Any = await state.aredis.xread(streams, count=100, block=1000)
        for raw_key, items in entries or []:
            for k, event in _take(last, position, raw_key.decode(), items):
                yield k, event
        if entries and time.monotonic() - checked < RECHECK_SECONDS:
            continue
        checked = time.monotonic()
        for key in list(last):
            k = position[key]
            record = await state.get_job(job_ids[k])
            if record is None:
                del last[key]
                yield k, {"type": "done", "status": MISSING}
                continue
            status = JobStatus(record["status"])
            if not status.is_terminal:
                continue
            # Ended: whatever its stream holds past what was read comes first.
            rest: Any = await state.aredis.xread({key: last[key]}, count=100_000)
            for _, items in rest or []:
                for item in _take(last, position, key, items):
                    yield item
            if key in last:  # no "done" event (expired stream, never started, reaped)
                if last.pop(key) == "0":
                    for delta in await asyncio.to_thread(_replay, record):
                        yield k, delta
                yield k, {"type": "done", "status": status.value}


def _take(
    last: dict[str, str], position: dict[str, int], key: str, items: list[Any]
) -> list[tuple[int, dict[str, Any]]]:
    """A stream's new entries as events, up to its "done" (then the stream is finished)."""
    out = []
    for entry_id, raw in items:
        if key not in last:
            break
        last[key] = entry_id.decode()
        event = decode_hash(raw)
        out.append((position[key], event))
        if event.get("type") == "done":
            del last[key]
    return out


async def job_events(state: GatewayState, job_id: str) -> AsyncIterator[dict[str, Any]]:
    """One job's events (as ``many_job_events``); nothing more once its record is gone."""
    async for _, event in many_job_events(state, [job_id]):
        if event.get("type") == "done" and event.get("status") == MISSING:
            return
        yield event
