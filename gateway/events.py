"""Reading a job's event stream (token deltas, then a final status) from Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from gateway.deps import GatewayState
from infra.wire.codec import decode_hash
from infra.wire.protocol import JobStatus, Keys


async def job_events(state: GatewayState, job_id: str) -> AsyncIterator[dict[str, Any]]:
    """Yield {"type": "delta", "text", "n"} events, then {"type": "done", "status"}.

    Replays from the start, so it works for finished jobs too; when the stream has
    expired, a finished job's result is replayed as one delta.
    """
    key, last = Keys.events(job_id), "0"
    while True:
        entries = await state.aredis.xread({key: last}, count=100, block=1000)
        for _, items in entries or []:
            for entry_id, raw in items:
                last = entry_id.decode()
                event = decode_hash(raw)
                yield event
                if event.get("type") == "done":
                    return
        if entries:
            continue
        record = await state.get_job(job_id)
        if record is None:
            return
        status = JobStatus(record["status"])
        if status.is_terminal:  # no "done" event (expired stream, never started, reaped)
            if last == "0" and record.get("text"):
                yield {
                    "type": "delta",
                    "text": record["text"],
                    "n": record.get("completion_tokens"),
                }
            yield {"type": "done", "status": status.value}
            return
