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
from tide_fleet.gateway.served import pick
from tide_fleet.infra.jobs.schemas import JobCreate
from tide_fleet.infra.jobs.submission import ModelInfo, SubmissionError, build_job, limit_error
from tide_fleet.infra.jobs.webhooks import UnsafeWebhookTarget, check_target
from tide_fleet.infra.wire.jobstore import LimitExceeded, NewJob
from tide_fleet.infra.wire.models import ServedModel
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


def http_error(e: SubmissionError) -> ApiError:
    return ApiError(e.status, e.message, param=e.param, code=e.code, headers=e.headers)


def script_call(job: NewJob) -> Prepared:
    # Encoding the record (token ids as JSON) is, with tokenising, the heavy part.
    return job, *job.script_call()


async def prepare(
    state: GatewayState,
    build: Callable[[ServedModel, ModelInfo], list[Prepared]],
    chars: int,
    requested: str | None = None,
) -> list[Prepared]:
    """Run `build` (tokenise, check, encode) for the model `requested` names (None: the
    default; unknown: 404) on the loop for small inputs, in a thread for large ones; a
    refusal is answered as its error object."""
    served, model = pick(state, requested)
    try:
        if chars <= INLINE_MAX_CHARS:
            return build(served, model)
        return await anyio.to_thread.run_sync(build, served, model, limiter=state.tokenize_limiter)
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

    Returns {id, status, bucket, created_at}; the same job again for a repeated
    Idempotency-Key of the same tenant.
    """

    def build(served: ServedModel, model: ModelInfo) -> list[Prepared]:
        job = build_job(
            state.settings, model, tenant, body, idempotency_key, priority, served=served
        )
        return [script_call(job)]

    jobs = await prepare(state, build, input_chars(body), body.model)
    if body.webhook:
        try:
            hosts = state.settings.webhook_allow_hosts
            await asyncio.to_thread(check_target, str(body.webhook.url), hosts)
        except UnsafeWebhookTarget as e:
            raise ApiError(400, str(e), param="webhook.url", code="unsafe_webhook") from None
    return (await write_jobs(state, tenant, jobs))[0]
