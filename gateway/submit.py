"""From a validated request to an enqueued job: count tokens, pick the bucket, write."""

from __future__ import annotations

import asyncio
import time

import jinja2
from fastapi import HTTPException
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gateway.deps import GatewayState
from infra import queues
from infra.jobstore import LimitExceeded, NewJob, new_job_id
from infra.protocol import JobMessage, JobStatus, Priority, bucket_for, queue_name
from infra.schemas import ChatMessage, JobCreate
from infra.webhooks import UnsafeWebhookTarget, check_target

RETRY_AFTER = {"tenant_full": "5", "queue_full": "5", "rate": "1"}


class TooMany(HTTPException):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(429, detail=message, headers={"Retry-After": RETRY_AFTER[reason]})
        self.reason = reason


def render_chat(state: GatewayState, messages: list[ChatMessage]) -> str:
    tok = state.tokenizer
    assert tok is not None
    if not tok.chat_template:
        raise HTTPException(
            400, detail=f"model {state.model_name!r} has no chat template: send 'prompt' instead"
        )
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(tok.chat_template).render(
            messages=[m.model_dump() for m in messages],
            add_generation_prompt=True,
            bos_token=tok.config.get("bos_token") or "",
            eos_token=tok.config.get("eos_token") or "",
        )
    except jinja2.TemplateError as e:
        raise HTTPException(400, detail=f"messages: the chat template refused them: {e}") from None


def count_tokens(state: GatewayState, body: JobCreate) -> list[int]:
    tok = state.tokenizer
    if tok is None or state.model_config is None:
        raise HTTPException(503, detail=f"tokenizer not loaded: {state.load_error}")
    if body.messages is not None:
        return tok.encode(render_chat(state, body.messages), add_special_tokens=False)
    return tok.encode(body.prompt or "")


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
    ids = count_tokens(state, body)
    assert state.model_config is not None
    context = state.model_config.max_model_len
    if not ids:
        raise HTTPException(400, detail="prompt: encodes to no tokens")
    if len(ids) >= context:
        raise HTTPException(
            400, detail=f"prompt: {len(ids)} tokens, but the model's context is {context} tokens"
        )
    if len(ids) + body.max_tokens > context:
        raise HTTPException(
            400,
            detail=f"max_tokens: prompt ({len(ids)} tokens) + max_tokens ({body.max_tokens}) "
            f"exceeds the model's context of {context} tokens",
        )
    webhook_url = str(body.webhook.url) if body.webhook else ""
    if webhook_url:
        try:
            await asyncio.to_thread(check_target, webhook_url, state.settings.webhook_allow_hosts)
        except UnsafeWebhookTarget as e:
            raise HTTPException(400, detail=str(e)) from None
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= 255:
        raise HTTPException(400, detail="Idempotency-Key header: 1 to 255 characters")
    settings = state.settings
    prio = priority or body.priority
    bucket = bucket_for(
        len(ids) + body.max_tokens, settings.bucket_short_max, settings.bucket_medium_max
    )
    queue = queue_name(bucket, prio)
    job_id = new_job_id()
    now = time.time()
    message = queues.encode(
        JobMessage(job_id, bucket, prio.value, len(ids), body.max_tokens), queue
    )
    fields = {
        "id": job_id,
        "tenant": tenant,
        "status": JobStatus.QUEUED.value,
        "bucket": bucket,
        "priority": prio.value,
        "prompt_tokens": len(ids),
        "max_tokens": body.max_tokens,
        "token_ids": ids,
        "sampling": body.sampling(),
        "webhook_url": webhook_url,
        "metadata": body.metadata or "",
        "created_at": now,
        "queued_at": now,
        "attempts": 0,
    }
    job = NewJob(
        fields, queue, message, idempotency_key, settings.max_queued_per_tenant,
        settings.max_queue_length, settings.max_requests_per_second_per_tenant,
        settings.job_ttl_seconds,
    )  # fmt: skip
    keys, args = job.script_call()
    try:
        return job.result(await state.create_script(keys=keys, args=args))
    except LimitExceeded as e:
        limit = {
            "rate": f"at most {settings.max_requests_per_second_per_tenant} requests per second "
            "per tenant",
            "tenant_full": f"at most {settings.max_queued_per_tenant} unfinished jobs per tenant",
            "queue_full": f"queue {queue} holds its maximum of {settings.max_queue_length} jobs",
        }[e.reason]
        raise TooMany(e.reason, f"limit reached: {limit}") from None
