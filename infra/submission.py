"""From a validated request to a ``NewJob``: count tokens, check sizes, pick the bucket.

Torch-free and I/O-free, shared by the gateway (one job per request) and the batch
fan-out (thousands per file). Errors carry the HTTP status and a message naming the
field and the limit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from infra import queues
from infra.jobstore import NewJob, new_job_id
from infra.protocol import JobMessage, JobStatus, Priority, bucket_for, queue_name
from infra.schemas import ChatMessage, JobCreate
from infra.settings import Settings
from worker.models.config import ModelConfig
from worker.models.registry import model_folder
from worker.models.tokenizer import Tokenizer

RETRY_AFTER = {"tenant_full": "5", "queue_full": "5", "rate": "1"}


class SubmissionError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


@dataclass
class ModelInfo:
    name: str
    tokenizer: Tokenizer
    config: ModelConfig

    @classmethod
    def load(cls, model: str) -> ModelInfo:
        folder = model_folder(model)
        return cls(model, Tokenizer(folder), ModelConfig.from_folder(folder))


def render_chat(info: ModelInfo, messages: list[ChatMessage]) -> str:
    tok = info.tokenizer
    if not tok.chat_template:
        raise SubmissionError(
            400, f"model {info.name!r} has no chat template: send 'prompt' instead"
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
        raise SubmissionError(400, f"messages: the chat template refused them: {e}") from None


def token_ids(info: ModelInfo, body: JobCreate) -> list[int]:
    if body.messages is not None:
        return info.tokenizer.encode(render_chat(info, body.messages), add_special_tokens=False)
    return info.tokenizer.encode(body.prompt or "")


def build_job(
    settings: Settings,
    info: ModelInfo,
    tenant: str,
    body: JobCreate,
    idempotency_key: str | None,
    priority: Priority | None = None,
    extra_fields: dict[str, Any] | None = None,
) -> NewJob:
    """Everything the create script writes; raises SubmissionError for bad sizes."""
    ids = token_ids(info, body)
    context = info.config.max_model_len
    if not ids:
        raise SubmissionError(400, "prompt: encodes to no tokens")
    if len(ids) >= context:
        raise SubmissionError(
            400, f"prompt: {len(ids)} tokens, but the model's context is {context} tokens"
        )
    if len(ids) + body.max_tokens > context:
        raise SubmissionError(
            400,
            f"max_tokens: prompt ({len(ids)} tokens) + max_tokens ({body.max_tokens}) "
            f"exceeds the model's context of {context} tokens",
        )
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= 255:
        raise SubmissionError(400, "Idempotency-Key header: 1 to 255 characters")
    prio = priority or body.priority
    total = len(ids) + body.max_tokens
    bucket = bucket_for(total, settings.bucket_short_max, settings.bucket_medium_max)
    queue = queue_name(bucket, prio)
    job_id = new_job_id()
    message = queues.encode(
        JobMessage(job_id, bucket, prio.value, len(ids), body.max_tokens), queue
    )
    now = time.time()
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
        "webhook_url": str(body.webhook.url) if body.webhook else "",
        "metadata": body.metadata or "",
        "created_at": now,
        "queued_at": now,
        "attempts": 0,
        **(extra_fields or {}),
    }
    return NewJob(
        fields, queue, message, idempotency_key, settings.max_queued_per_tenant,
        settings.max_queue_length, settings.max_requests_per_second_per_tenant,
        settings.job_ttl_seconds,
    )  # fmt: skip


def limit_error(settings: Settings, reason: str, queue: str) -> SubmissionError:
    limit = {
        "rate": f"at most {settings.max_requests_per_second_per_tenant} requests per second "
        "per tenant",
        "tenant_full": f"at most {settings.max_queued_per_tenant} unfinished jobs per tenant",
        "queue_full": f"queue {queue} holds its maximum of {settings.max_queue_length} jobs",
    }[reason]
    return SubmissionError(429, f"limit reached: {limit}", {"Retry-After": RETRY_AFTER[reason]})
