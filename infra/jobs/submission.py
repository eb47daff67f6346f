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
from tokenizers import Tokenizer as HFTokenizer

from tide_fleet.infra.contract import chat_template
from tide_fleet.infra.contract.model_config import ModelConfig
from tide_fleet.infra.contract.registry import model_folder
from tide_fleet.infra.contract.tokenizer import Tokenizer
from tide_fleet.infra.jobs.ceilings import check_work
from tide_fleet.infra.jobs.deadlines import job_timing
from tide_fleet.infra.jobs.errors import SubmissionError as SubmissionError
from tide_fleet.infra.jobs.messages import ChatMessage
from tide_fleet.infra.jobs.request_checks import check_sampling, check_token_ids
from tide_fleet.infra.jobs.schemas import JobCreate
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.models import ServedModel
from tide_fleet.infra.wire.new_job import NewJob, new_job_id
from tide_fleet.infra.wire.protocol import (
    JobMessage,
    JobStatus,
    Priority,
    backlog_field,
    bucket_for,
    queue_name,
)

RETRY_AFTER = {"tenant_full": "5", "queue_full": "5", "rate": "1"}
LIMIT_CODES = {"tenant_full": "tenant_queue_full", "queue_full": "queue_full",
               "rate": "rate_limit_exceeded"}  # fmt: skip


@dataclass
class ModelInfo:
    """What the gateway needs of a model: its tokenizer, context, and a GIL-free counter.

    `Tokenizer.encode` holds the GIL for the whole Rust call, so a thread counting a long
    prompt would still stall the event loop; `encode_batch_fast` releases it (and skips the
    offsets nobody here reads). `encode` gives the ids `Tokenizer.encode` gives (tested).
    """

    name: str
    tokenizer: Tokenizer
    config: ModelConfig
    counter: HFTokenizer
    max_token_chars: int  # the longest vocabulary entry: no token covers more characters

    @classmethod
    def load(cls, model: str) -> ModelInfo:
        folder = model_folder(model)
        tokenizer = Tokenizer(folder)
        counter = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        longest = max(map(len, counter.get_vocab(with_added_tokens=True)), default=1)
        return cls(model, tokenizer, ModelConfig.from_folder(folder), counter, longest)

    @property
    def max_prompt_chars(self) -> int:
        """Longer text cannot fit the context, whatever it says: each token covers at most
        max_token_chars characters (byte-level vocabularies spell a byte as one character,
        and a character is at least one byte)."""
        return self.config.max_model_len * self.max_token_chars

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        encoding = self.counter.encode_batch_fast([text], add_special_tokens=add_special_tokens)
        ids: list[int] = encoding[0].ids
        bos = self.tokenizer.bos_token_id
        if add_special_tokens and self.tokenizer.add_bos and bos is not None and ids[:1] != [bos]:
            ids.insert(0, bos)
        return ids


def render_chat(
    info: ModelInfo, messages: list[ChatMessage], tools: list[dict[str, Any]] | None = None
) -> str:
    tok = info.tokenizer
    if not tok.chat_template:
        raise SubmissionError(
            400, f"model {info.name!r} has no chat template: send 'prompt' instead",
            param="messages", code="no_chat_template",
        )  # fmt: skip
    try:
        return chat_template.render(tok, [m.for_template() for m in messages], tools)
    except jinja2.TemplateError as e:
        raise SubmissionError(
            400, f"messages: the chat template refused them: {e}", param="messages",
            code="invalid_messages",
        ) from None  # fmt: skip


def token_ids(
    info: ModelInfo, body: JobCreate, tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """The prompt's ids; a text too long for the context is refused before it is tokenised."""
    if isinstance(body.prompt, list):
        check_token_ids(body.prompt, info.config.vocab_size, "prompt")
        return list(body.prompt)
    if body.messages is None:
        field, text = "prompt", body.prompt or ""
    else:
        field, text = "messages", render_chat(info, body.messages, tools)
    if len(text) > info.max_prompt_chars:
        raise SubmissionError(
            400, f"{field}: {len(text)} characters cannot fit the model's context of "
            f"{info.config.max_model_len} tokens (a token of this tokenizer covers at most "
            f"{info.max_token_chars} characters: at most {info.max_prompt_chars} characters)",
            param=field, code="context_length_exceeded",
        )  # fmt: skip
    return info.encode(text, add_special_tokens=body.messages is None)


def record_sampling(body: JobCreate) -> dict[str, Any]:
    """The record's `sampling`: the engine's fields, plus `n` (popped by the worker) when
    more than one choice is asked."""
    sampling = body.sampling()
    return sampling | {"n": body.n} if body.n > 1 else sampling


def build_job(
    settings: Settings,
    info: ModelInfo,
    tenant: str,
    body: JobCreate,
    idempotency_key: str | None,
    priority: Priority | None = None,
    extra_fields: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    served: ServedModel | None = None,
    deadline: float | None = None,
    lora: str = "",
) -> NewJob:
    """Everything the create script writes; raises SubmissionError for bad sizes. `tools`
    (OpenAI's form) go to the chat template with the messages. `served`: the model it is
    for (its bucket rules, queues and backlog; the record names it); None: the default
    model of a one-model fleet, as always. `deadline`: an outer one (a batch's window end).
    `lora`: the LoRA adapter on `served` that runs the job (its name, recorded as ``lora``;
    '': the base).
    """
    if idempotency_key is not None:
        check_idempotency_key(idempotency_key)
    now = time.time()
    timing = job_timing(body, now, deadline)
    check_sampling(body, info.config.vocab_size)
    ids = token_ids(info, body, tools)
    context = info.config.max_model_len
    field = "prompt" if body.messages is None else "messages"
    if not ids:
        raise SubmissionError(
            400, f"{field}: encodes to no tokens", param=field, code="empty_prompt"
        )
    if len(ids) >= context:
        raise SubmissionError(
            400, f"{field}: {len(ids)} tokens, but the model's context is {context} tokens",
            param=field, code="context_length_exceeded",
        )  # fmt: skip
    if len(ids) + body.max_tokens > context:
        raise SubmissionError(
            400,
            f"max_tokens: prompt ({len(ids)} tokens) + max_tokens ({body.max_tokens}) "
            f"exceeds the model's context of {context} tokens",
            param="max_tokens", code="context_length_exceeded",
        )  # fmt: skip
    check_work(settings, tenant, [len(ids)], body.n, body.max_tokens)
    prio = priority or body.priority
    total = len(ids) + body.max_tokens
    if served is None:
        bucket = bucket_for(total, settings.bucket_short_max, settings.bucket_medium_max)
    else:
        bucket = served.bucket(total, settings)
    lane = served.lane if served is not None else ""
    queue = queue_name(bucket, prio, lane)
    job_id = new_job_id()
    message = queues.encode(
        JobMessage(job_id, bucket, prio.value, len(ids), body.n * body.max_tokens), queue
    )
    fields = {
        "id": job_id,
        "tenant": tenant,
        "status": JobStatus.QUEUED.value,
        "bucket": bucket,
        "priority": prio.value,
        "prompt_tokens": len(ids),
        "max_tokens": body.max_tokens,  # per choice
        "n": body.n,
        "token_ids": ids,
        "sampling": record_sampling(body),
        "webhook_url": str(body.webhook.url) if body.webhook else "",
        "metadata": body.metadata or "",
        "created_at": now,
        "queued_at": now,
        "attempts": 0,
        **({"model": served.name} if served is not None else {}),
        **({"lora": lora} if lora else {}),
        **({"backlog": backlog_field(bucket, lane)} if lane else {}),
        **share_weight(settings, tenant),
        **timing,
        **(extra_fields or {}),
    }
    return NewJob(
        fields, queue, message, idempotency_key, settings.max_queued_per_tenant,
        settings.max_queue_length, settings.max_requests_per_second_per_tenant,
        settings.job_ttl_seconds,
    )  # fmt: skip


def share_weight(settings: Settings, tenant: str) -> dict[str, float]:
    """The tenant's fair-share weight as a record field; none for the default weight 1."""
    weight = settings.tenant_weights.get(tenant, 1.0)
    return {} if weight == 1.0 else {"share_weight": weight}


def check_idempotency_key(key: str) -> None:
    if not 1 <= len(key) <= 255:
        raise SubmissionError(
            400, "Idempotency-Key header: 1 to 255 characters", param="Idempotency-Key",
            code="invalid_idempotency_key",
        )  # fmt: skip
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise SubmissionError(
            400, "Idempotency-Key header: cannot be encoded as UTF-8", param="Idempotency-Key",
            code="invalid_idempotency_key",
        ) from None  # fmt: skip


def limit_error(settings: Settings, reason: str, queue: str) -> SubmissionError:
    limit = {
        "rate": f"at most {settings.max_requests_per_second_per_tenant} requests per second "
        "per tenant",
        "tenant_full": f"at most {settings.max_queued_per_tenant} unfinished jobs per tenant",
        "queue_full": f"queue {queue} holds its maximum of {settings.max_queue_length} jobs",
    }[reason]
    return SubmissionError(
        429, f"limit reached: {limit}", {"Retry-After": RETRY_AFTER[reason]},
        code=LIMIT_CODES[reason],
    )  # fmt: skip
