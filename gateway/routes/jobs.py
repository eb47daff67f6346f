"""The job API: submit, poll, stream events, cancel."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Response
from fastapi.responses import StreamingResponse
from sse_starlette.sse import EventSourceResponse

from tide_fleet.gateway.deps import GatewayState, StateDep, TenantDep
from tide_fleet.gateway.errors import shown
from tide_fleet.gateway.events import job_events
from tide_fleet.gateway.submit import submit_job
from tide_fleet.infra.jobs.public import (
    ErrorBody,
    JobAccepted,
    JobPublic,
    delta_public,
    job_accepted,
    job_public_json,
    job_public_parts,
)
from tide_fleet.infra.jobs.schemas import JobCreate

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "invalid request (the message names the field)"},
    401: {"model": ErrorBody},
    404: {"model": ErrorBody},
    413: {"model": ErrorBody, "description": "the body is over TIDE_MAX_BODY_BYTES"},
    429: {"model": ErrorBody, "description": "a limit was reached; see Retry-After"},
}


async def owned_job(
    state: GatewayState, tenant: str, job_id: str
) -> tuple[dict[str, str], bytes | None]:
    """The tenant's job: its record without ``choices``, and those as stored (undecoded: with
    logprobs they can be megabytes); 404 for another tenant's or a missing job."""
    parts = await state.get_job_parts(job_id)
    if parts is None or parts[0].get("tenant") != tenant:
        raise HTTPException(404, detail=f"job {shown(job_id)} not found")
    return parts


@router.post("", status_code=202, response_model=JobAccepted, responses=ERRORS)
async def create_job(
    body: JobCreate,
    state: StateDep,
    tenant: TenantDep,
    idempotency_key: Annotated[str | None, Header()] = None,
) -> JobAccepted:
    record = await submit_job(state, tenant, body, idempotency_key)
    return job_accepted(record)


# A body over this is sent in slices of it, each awaiting the socket: one large job's bytes
# then never hold the event loop for more than a slice's write.
SLICE = 1 << 20


async def public_job(state: GatewayState, tenant: str, job_id: str) -> Response:
    """The job as JSON, its stored choices passed through unparsed and never joined into one
    body (infra/jobs/public.py job_public_parts)."""
    parts = job_public_parts(*await owned_job(state, tenant, job_id))
    size = sum(map(len, parts))
    if size <= SLICE:
        return Response(b"".join(parts), media_type="application/json")

    async def slices() -> AsyncIterator[memoryview]:
        for part in parts:
            view = memoryview(part)
            for at in range(0, len(view), SLICE):
                yield view[at : at + SLICE]

    return StreamingResponse(slices(), media_type="application/json",
                             headers={"Content-Length": str(size)})  # fmt: skip


@router.get("/{job_id}", response_model=JobPublic, responses=ERRORS)
async def get_job(job_id: str, state: StateDep, tenant: TenantDep) -> Response:
    return await public_job(state, tenant, job_id)


@router.delete("/{job_id}", response_model=JobPublic, responses=ERRORS)
async def cancel_job(job_id: str, state: StateDep, tenant: TenantDep) -> Response:
    await owned_job(state, tenant, job_id)
    await asyncio.to_thread(state.store.cancel, job_id, tenant)
    return await public_job(state, tenant, job_id)


@router.get("/{job_id}/events", responses=ERRORS)
async def stream_job(job_id: str, state: StateDep, tenant: TenantDep) -> EventSourceResponse:
    """Server-Sent Events: `delta` events ({text}, with `index` and `logprobs` when the job
    asked for choices or logprobs), then one `done` with the final job."""
    await owned_job(state, tenant, job_id)

    async def events():  # type: ignore[no-untyped-def]
        async for event in job_events(state, job_id):
            if event["type"] == "delta":
                yield {"event": "delta", "data": json.dumps(delta_public(event))}
            else:
                final = job_public_json(*await owned_job(state, tenant, job_id))
                yield {"event": "done", "data": final.decode()}

    return EventSourceResponse(events())
