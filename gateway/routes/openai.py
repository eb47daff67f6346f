"""OpenAI-compatible completions and chat completions, riding the job queues."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette.sse import EventSourceResponse

from gateway.deps import GatewayState, StateDep, TenantDep
from gateway.events import job_events
from gateway.routes.jobs import ERRORS
from gateway.submit import submit_job
from infra.protocol import Priority
from infra.schemas import ChatMessage, JobCreate, SamplingFields

router = APIRouter(prefix="/v1", tags=["openai"])


class CompletionCreate(SamplingFields):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields Tide ignores
    model: str | None = None
    prompt: str = Field(..., min_length=1)
    max_tokens: int = Field(16, ge=1)
    stream: bool = False


class ChatCompletionCreate(SamplingFields):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int = Field(256, ge=1)
    stream: bool = False


def _job(body: SamplingFields, **input_: Any) -> JobCreate:
    return JobCreate(**body.sampling(), **input_, priority=Priority.INTERACTIVE)


async def _collect(state: GatewayState, job_id: str) -> tuple[str, dict[str, str]]:
    text = []
    async for event in job_events(state, job_id):
        if event["type"] == "delta":
            text.append(event["text"])
    record = await state.get_job(job_id) or {}
    if record.get("status") != "completed":
        raise HTTPException(
            500, detail=f"job {job_id} {record.get('status')}: {record.get('error')}"
        )
    return record.get("text", "".join(text)), record


def _usage(record: dict[str, str]) -> dict[str, int]:
    prompt, completion = (
        int(record.get("prompt_tokens") or 0),
        int(record.get("completion_tokens") or 0),
    )
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _stream(state: GatewayState, job_id: str, chunk: Any, object_name: str) -> EventSourceResponse:
    async def events() -> AsyncIterator[dict[str, str]]:
        async for event in job_events(state, job_id):
            if event["type"] == "delta" and event["text"]:
                yield {"data": json.dumps(chunk(event["text"], None))}
        record = await state.get_job(job_id) or {}
        yield {"data": json.dumps(chunk("", record.get("finish_reason") or "stop"))}
        yield {"data": "[DONE]"}

    return EventSourceResponse(events())


@router.post("/completions", responses=ERRORS)
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

        return _stream(state, job_id, chunk, "text_completion")
    text, final = await _collect(state, job_id)
    choice = {
        "index": 0,
        "text": text,
        "finish_reason": final.get("finish_reason"),
        "logprobs": None,
    }
    return {**base, "choices": [choice], "usage": _usage(final)}


@router.post("/chat/completions", responses=ERRORS)
async def chat_completions(body: ChatCompletionCreate, state: StateDep, tenant: TenantDep) -> Any:
    record = await submit_job(state, tenant, _job(body, messages=body.messages), None)
    job_id, created = record["id"], int(time.time())
    base = {"id": job_id, "created": created, "model": state.model_name}
    if body.stream:

        def chunk(text: str, finish: str | None) -> dict[str, Any]:
            delta = {"role": "assistant", "content": text} if text else {}
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return {**base, "object": "chat.completion.chunk", "choices": [choice]}

        return _stream(state, job_id, chunk, "chat.completion.chunk")
    text, final = await _collect(state, job_id)
    message = {"role": "assistant", "content": text}
    choice = {"index": 0, "message": message, "finish_reason": final.get("finish_reason")}
    return {**base, "object": "chat.completion", "choices": [choice], "usage": _usage(final)}


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    owned_by: str = "tide"


@router.get("/models")
async def list_models(state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    return {"object": "list", "data": [ModelCard(id=state.model_name).model_dump()]}
