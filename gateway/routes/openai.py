"""OpenAI-compatible completions and chat completions, riding the job queues."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel
from sse_starlette.sse import EventSourceResponse

from gateway.deps import GatewayState, StateDep, TenantDep
from gateway.errors import ApiError
from gateway.events import job_events
from gateway.routes.jobs import ERRORS
from gateway.submit import submit_job
from infra.jobs.openai_format import chat_body, completion_body, unfinished_job
from infra.jobs.public import ErrorBody
from infra.jobs.schemas import ChatCompletionCreate, CompletionCreate, JobCreate, SamplingFields
from infra.wire.protocol import Priority

router = APIRouter(prefix="/v1", tags=["openai"])


def _job(body: SamplingFields, **input_: Any) -> JobCreate:
    return JobCreate(**body.sampling(), **input_, priority=Priority.INTERACTIVE)


async def _final(state: GatewayState, job_id: str) -> dict[str, str]:
    """Wait for the job's end (following its event stream); its record if completed."""
    async for _ in job_events(state, job_id):
        pass
    record = await state.get_job(job_id) or {}
    if record.get("status") != "completed":
        raise unfinished_job_error(job_id, record)
    return record


def unfinished_job_error(job_id: str, record: dict[str, str]) -> ApiError:
    status, message, code = unfinished_job(job_id, record)
    return ApiError(status, message, code=code)


def _stream(state: GatewayState, job_id: str, chunk: Any) -> EventSourceResponse:
    async def events() -> AsyncIterator[dict[str, str]]:
        async for event in job_events(state, job_id):
            if event["type"] == "delta" and event["text"]:
                yield {"data": json.dumps(chunk(event["text"], None))}
        record = await state.get_job(job_id) or {}
        yield {"data": json.dumps(chunk("", record.get("finish_reason") or "stop"))}
        yield {"data": "[DONE]"}

    return EventSourceResponse(events())


SYNC_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    409: {"model": ErrorBody, "description": "the job was cancelled (or expired) meanwhile"},
    500: {"model": ErrorBody, "description": "the job failed inside the fleet (its id named)"},
}


@router.post("/completions", responses=SYNC_ERRORS)
async def completions(body: CompletionCreate, state: StateDep, tenant: TenantDep) -> Any:
    record = await submit_job(state, tenant, _job(body, prompt=body.prompt), None)
    job_id, created = record["id"], int(time.time())
    base = {
        "id": job_id,
        "object": "text_completion",
        "created": created,
        "model": state.model_name,
    }
    if body.stream:

        def chunk(text: str, finish: str | None) -> dict[str, Any]:
            return {**base, "choices": [{"index": 0, "text": text, "finish_reason": finish}]}

        return _stream(state, job_id, chunk)
    return completion_body(await _final(state, job_id), state.model_name)


@router.post("/chat/completions", responses=SYNC_ERRORS)
async def chat_completions(body: ChatCompletionCreate, state: StateDep, tenant: TenantDep) -> Any:
    record = await submit_job(state, tenant, _job(body, messages=body.messages), None)
    job_id, created = record["id"], int(time.time())
    base = {"id": job_id, "created": created, "model": state.model_name}
    if body.stream:

        def chunk(text: str, finish: str | None) -> dict[str, Any]:
            delta = {"role": "assistant", "content": text} if text else {}
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return {**base, "object": "chat.completion.chunk", "choices": [choice]}

        return _stream(state, job_id, chunk)
    return chat_body(await _final(state, job_id), state.model_name)


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    owned_by: str = "tide"


@router.get("/models")
async def list_models(state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    return {"object": "list", "data": [ModelCard(id=state.model_name).model_dump()]}
