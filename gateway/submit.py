"""The gateway's submit path: build the jobs (tide_fleet.infra.jobs), write each in one script call.

Every job of a request is built (tokenised, checked) before any is written, so a refused
request enqueues nothing; a limit met part-way cancels the jobs already written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import anyio

from tide_fleet.gateway.deps import GatewayState
from tide_fleet.gateway.errors import ApiError
from tide_fleet.gateway.metrics import LIMIT_REASONS, tag_rejection
from tide_fleet.gateway.served import pick_target
from tide_fleet.infra.jobs.schemas import JobCreate
from tide_fleet.infra.jobs.submission import ModelInfo, SubmissionError, build_job, limit_error
from tide_fleet.infra.jobs.targets import Target
from tide_fleet.infra.jobs.webhooks import UnsafeWebhookTarget, check_target
from tide_fleet.infra.wire.new_job import LimitExceeded, NewJob
from tide_fleet.infra.wire.protocol import Priority

# Below this many characters a request is prepared on the event loop: tokenising it takes
# about as long as the hop to a thread and back (tens of microseconds).
INLINE_MAX_CHARS = 2048

Prepared = tuple[NewJob, list[str], list[Any]]  # the job and its script call


def input_chars(body: JobCreate) -> int:
    if isinstance(body.prompt, str):
        return len(body.prompt)
    if body.prompt is not None:
        return len(body.prompt)  # token ids: encoding them as JSON is the work
    messages = body.messages or []  # the template adds some text around each one
    return sum(len(m.content or "") for m in messages) + 64 * len(messages)


def job_model(job: NewJob) -> str:
    """What runs the job, as answers name it: its LoRA adapter, else its served model."""
    return str(job.fields.get("lora") or job.fields.get("model") or "")


def http_error(e: SubmissionError) -> ApiError:
    return ApiError(e.status, e.message, param=e.param, code=e.code, headers=e.headers)


def script_call(job: NewJob) -> Prepared:
    # Encoding the record (token ids as JSON) is, with tokenising, the heavy part.
    return job, *job.script_call()


async def prepare(
    state: GatewayState,
    build: Callable[[Target, ModelInfo], list[Prepared]],
    chars: int,
    requested: str | None = None,
) -> list[Prepared]:
    """Run `build` (tokenise, check, encode) for the model or LoRA adapter `requested` names
    (None: the default; unknown: 404) with the tokenizer of the model that runs it, on the
    loop for small inputs, in a thread for large ones; a refusal is answered as its error
    object."""
    target, model = await pick_target(state, requested)
    try:
        if chars <= INLINE_MAX_CHARS:
            return build(target, model)
        return await anyio.to_thread.run_sync(build, target, model, limiter=state.tokenize_limiter)
    except SubmissionError as e:
        raise http_error(e) from None


async def write_jobs(
    state: GatewayState, tenant: str, jobs: list[Prepared]
) -> list[dict[str, str]]:
    """Write each job; {id, status, bucket, created_at} of each."""
    written: list[dict[str, str]] = []
    for job, keys, args in jobs:
        try:
            written.append(job.result(await state.create_script(keys=keys, args=args)))
        except LimitExceeded as e:
            for record in written:  # all of the request or none of it
                await asyncio.to_thread(state.store.cancel, record["id"], tenant)
            error = http_error(limit_error(state.settings, e.reason, job.queue))
            raise tag_rejection(error, LIMIT_REASONS.get(e.reason, "limit")) from None
    return written


async def submit_job(
    state: GatewayState,
    tenant: str,
    body: JobCreate,
    idempotency_key: str | None,
    priority: Priority | None = None,
) -> dict[str, str]:
    """Validate sizes, then write the record and its queue message in one script call.

    Returns {id, status, bucket, created_at, model}; the same job again for a repeated
    Idempotency-Key of the same tenant.
    """

    def build(target: Target, model: ModelInfo) -> list[Prepared]:
        job = build_job(
            state.settings, model, tenant, body, idempotency_key, priority,
            served=target.served, lora=target.adapter,
        )  # fmt: skip
        return [script_call(job)]

    jobs = await prepare(state, build, input_chars(body), body.model)
    if body.webhook:
        try:
            hosts = state.settings.webhook_allow_hosts
            await asyncio.to_thread(check_target, str(body.webhook.url), hosts)
        except UnsafeWebhookTarget as e:
            raise ApiError(400, str(e), param="webhook.url", code="unsafe_webhook") from None
    return (await write_jobs(state, tenant, jobs))[0] | {"model": job_model(jobs[0][0])}
