"""OpenAI-compatible completions and chat completions, riding the job queues.

A request becomes its jobs (infra/jobs/openai_request.py: one per prompt), all built and
checked before any is written; the route then waits for them (or streams them,
gateway/openai_stream.py) and renders one OpenAI body (infra/jobs/openai_format.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter

from tide_fleet.gateway.capacity import check_capacity
from tide_fleet.gateway.deps import GatewayState, StateDep, TenantDep
from tide_fleet.gateway.errors import ApiError
from tide_fleet.gateway.events import many_job_events
from tide_fleet.gateway.openai_stream import StreamPlan, stream_response
from tide_fleet.gateway.routes.jobs import ERRORS
from tide_fleet.gateway.submit import Prepared, job_model, prepare, script_call, write_jobs
from tide_fleet.infra.jobs.ceilings import check_work
from tide_fleet.infra.jobs.job_errors import unfinished_job
from tide_fleet.infra.jobs.openai_format import chat_body, completions_body
from tide_fleet.infra.jobs.openai_request import PlannedJob, chat_job, completion_jobs
from tide_fleet.infra.jobs.public import ErrorBody
from tide_fleet.infra.jobs.schemas import ChatCompletionCreate, CompletionCreate
from tide_fleet.infra.jobs.submission import ModelInfo, build_job
from tide_fleet.infra.jobs.targets import Target
from tide_fleet.infra.jobs.tools import ToolRender
from tide_fleet.infra.wire.protocol import Priority

router = APIRouter(prefix="/v1", tags=["openai"])

SYNC_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    404: {"model": ErrorBody, "description": "no model of this fleet goes by that name"},
    409: {"model": ErrorBody, "description": "the job was cancelled meanwhile"},
    500: {"model": ErrorBody, "description": "the job failed inside the fleet (its id named)"},
    503: {"model": ErrorBody, "description": "no worker can take the job; see Retry-After"},
}


def unfinished_job_error(job_id: str, record: dict[str, str] | None) -> ApiError:
    answer = unfinished_job(job_id, record)
    return ApiError(answer.status, answer.message, code=answer.code, headers=answer.headers)


async def _wait(state: GatewayState, tenant: str, job_ids: list[str]) -> list[dict[str, str]]:
    """The jobs' records once all completed; the first that did not is the answer."""
    finals: dict[int, dict[str, str]] = {}
    async for k, event in many_job_events(state, job_ids):
        if event.get("type") != "done":
            continue
        record = await state.get_job(job_ids[k])
        if (record or {}).get("status") != "completed":
            for i, other in enumerate(job_ids):
                if i != k and i not in finals:
                    await asyncio.to_thread(state.store.cancel, other, tenant)
            raise unfinished_job_error(job_ids[k], record)
        assert record is not None
        finals[k] = record
    return [finals[k] for k in range(len(job_ids))]


async def _submit(
    state: GatewayState,
    tenant: str,
    plans_of: Callable[[Target, ModelInfo], list[PlannedJob]],
    chars: int,
    requested: str | None,
) -> tuple[list[Prepared], str]:
    """The request's jobs, for the model or LoRA adapter it names; and the name the answer
    gives as its ``model`` (the served name, or the adapter's)."""

    def build(target: Target, model: ModelInfo) -> list[Prepared]:
        jobs = [
            build_job(state.settings, model, tenant, plan.body, None, extra_fields=plan.fields,
                      tools=plan.tools, served=target.served, lora=target.adapter)
            for plan in plans_of(target, model)
        ]  # fmt: skip
        if len(jobs) > 1:  # each job was checked alone; a list of prompts counts together
            f = [job.fields for job in jobs]
            check_work(state.settings, tenant, [int(j["prompt_tokens"]) for j in f],
                       int(f[0]["n"]), int(f[0]["max_tokens"]))  # fmt: skip
        return [script_call(job) for job in jobs]

    jobs = await prepare(state, build, chars, requested)
    await check_capacity(state, [job for job, _, _ in jobs])
    return jobs, job_model(jobs[0][0]) if jobs else state.model_name


def _include_usage(body: CompletionCreate | ChatCompletionCreate) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


@router.post("/completions", responses=SYNC_ERRORS)
async def completions(body: CompletionCreate, state: StateDep, tenant: TenantDep) -> Any:
    def plans(target: Target, model: ModelInfo) -> list[PlannedJob]:
        return completion_jobs(body, target, model, Priority.INTERACTIVE)

    chars = sum(len(p) for p in body.prompts())
    jobs, name = await _submit(state, tenant, plans, chars, body.model)
    ids = [r["id"] for r in await write_jobs(state, tenant, jobs)]
    if body.stream:
        echo = [job.fields["render"]["echo"] for job, _, _ in jobs] if body.echo else []
        plan = StreamPlan(ids, tenant, body.n, name, chat=False,
                          include_usage=_include_usage(body), echo=echo)  # fmt: skip
        return stream_response(state, plan)
    records = await _wait(state, tenant, ids)
    return await asyncio.to_thread(completions_body, records, name)  # logprobs may be MBs


@router.post("/chat/completions", responses=SYNC_ERRORS)
async def chat_completions(body: ChatCompletionCreate, state: StateDep, tenant: TenantDep) -> Any:
    def plans(target: Target, model: ModelInfo) -> list[PlannedJob]:
        return [chat_job(body, target, model, Priority.INTERACTIVE)]

    chars = sum(len(m.content or "") + 64 for m in body.messages)
    jobs, name = await _submit(state, tenant, plans, chars, body.model)
    ids = [r["id"] for r in await write_jobs(state, tenant, jobs)]
    if body.stream:
        tools = jobs[0][0].fields.get("render", {}).get("tools")
        plan = StreamPlan(ids, tenant, body.n, name, chat=True,
                          include_usage=_include_usage(body),
                          tools=ToolRender.from_dict(tools) if tools else None)  # fmt: skip
        return stream_response(state, plan)
    record = (await _wait(state, tenant, ids))[0]
    return await asyncio.to_thread(chat_body, record, name)  # logprobs may be MBs
