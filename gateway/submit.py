"""The gateway's submit path: build the job (infra.submission), write it in one call."""

from __future__ import annotations

import asyncio

from fastapi import HTTPException

from gateway.deps import GatewayState
from gateway.metrics import LIMIT_REASONS, tag_rejection
from infra.jobstore import LimitExceeded
from infra.protocol import Priority
from infra.schemas import JobCreate
from infra.submission import SubmissionError, build_job, limit_error
from infra.webhooks import UnsafeWebhookTarget, check_target


def http_error(e: SubmissionError) -> HTTPException:
    return HTTPException(e.status, detail=e.message, headers=e.headers)


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
    if state.model is None:
        raise HTTPException(503, detail=f"tokenizer not loaded: {state.load_error}")
    try:
        job = build_job(state.settings, state.model, tenant, body, idempotency_key, priority)
    except SubmissionError as e:
        raise http_error(e) from None
    if body.webhook:
        try:
            hosts = state.settings.webhook_allow_hosts
            await asyncio.to_thread(check_target, str(body.webhook.url), hosts)
        except UnsafeWebhookTarget as e:
            raise HTTPException(400, detail=str(e)) from None
    keys, args = job.script_call()
    try:
        return job.result(await state.create_script(keys=keys, args=args))
    except LimitExceeded as e:
        error = http_error(limit_error(state.settings, e.reason, job.queue))
        raise tag_rejection(error, LIMIT_REASONS.get(e.reason, "limit")) from None
