"""The gateway's submit path: build the job (infra.jobs.submission), write it in one call."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio

from gateway.deps import GatewayState
from gateway.errors import ApiError
from gateway.metrics import LIMIT_REASONS, tag_rejection
from infra.jobs.schemas import JobCreate
from infra.jobs.submission import SubmissionError, build_job, limit_error
from infra.jobs.webhooks import UnsafeWebhookTarget, check_target
from infra.wire.jobstore import LimitExceeded, NewJob
from infra.wire.protocol import Priority

# Below this many characters a request is prepared on the event loop: tokenising it takes
# about as long as the hop to a thread and back (tens of microseconds).
INLINE_MAX_CHARS = 2048


def input_chars(body: JobCreate) -> int:
    if body.prompt is not None:
        return len(body.prompt)
    messages = body.messages or []  # the template adds some text around each one
    return sum(len(m.content) for m in messages) + 64 * len(messages)


def http_error(e: SubmissionError) -> ApiError:
    return ApiError(e.status, e.message, param=e.param, code=e.code, headers=e.headers)


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
    model = state.model
    if model is None:
        raise ApiError(503, f"tokenizer not loaded: {state.load_error}", code="model_not_loaded")

    def prepare() -> tuple[NewJob, list[str], list[Any]]:
        # Tokenising and encoding the record (token ids as JSON) are the heavy parts.
        job = build_job(state.settings, model, tenant, body, idempotency_key, priority)
        return job, *job.script_call()

    try:
        if input_chars(body) <= INLINE_MAX_CHARS:
            job, keys, args = prepare()
        else:
            job, keys, args = await anyio.to_thread.run_sync(
                prepare, limiter=state.tokenize_limiter
            )
    except SubmissionError as e:
        raise http_error(e) from None
    if body.webhook:
        try:
            hosts = state.settings.webhook_allow_hosts
            await asyncio.to_thread(check_target, str(body.webhook.url), hosts)
        except UnsafeWebhookTarget as e:
            raise ApiError(400, str(e), param="webhook.url", code="unsafe_webhook") from None
    try:
        return job.result(await state.create_script(keys=keys, args=args))
    except LimitExceeded as e:
        error = http_error(limit_error(state.settings, e.reason, job.queue))
        raise tag_rejection(error, LIMIT_REASONS.get(e.reason, "limit")) from None
