"""Response bodies: the API views of records read from Redis (suffix: Public).

``job_public`` is the job API's view of a job record (also a job webhook's payload);
``public_batch`` is the OpenAI Batch object (also a batch webhook's payload).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel

from tide_fleet.infra.jobs.openai_format import record_choices
from tide_fleet.infra.wire.protocol import JobStatus, Priority


class JobAccepted(BaseModel):
    id: str
    status: JobStatus
    bucket: str
    created_at: float
    deadline: float | None = None
    ttl: float | None = None
    expires_at: float | None = None
    model: str | None = None  # what runs it: a served model's name, or a LoRA adapter's


class JobResult(BaseModel):
    text: str
    finish_reason: str | None


class JobChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None
    completion_tokens: int | None = None
    logprobs: list[dict[str, Any]] | None = None  # {token, bytes, logprob, top_logprobs}


class JobUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int


class JobTimings(BaseModel):
    queued_at: float | None = None
    started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    queue_seconds: float | None = None
    ttft_seconds: float | None = None
    # The worker start it waited through (process start to serving): set when the job was
    # queued before the worker that ran it started, e.g. a pool scaling from zero.
    cold_start_seconds: float | None = None


class JobPublic(BaseModel):
    id: str
    object: Literal["job"] = "job"
    status: JobStatus
    bucket: str
    priority: Priority
    created_at: float
    result: JobResult | None = None
    choices: list[JobChoice] | None = None  # when n > 1 or logprobs were asked
    model: str | None = None  # what runs it: a served model's name, or a LoRA adapter's
    usage: JobUsage
    timings: JobTimings
    attempts: int
    error: str | None = None
    metadata: dict[str, str] | None = None
    webhook: dict[str, Any] | None = None
    deadline: float | None = None  # Unix seconds: asked, or from completion_window
    ttl: float | None = None  # the longest it may wait unstarted, seconds
    expires_at: float | None = None  # expired if not started by then (the sooner of the two)


class ErrorBody(BaseModel):
    error: dict[str, Any]


def _float(record: dict[str, str], key: str) -> float | None:
    value = record.get(key)
    return float(value) if value else None


def _choices_wanted(record: dict[str, str]) -> bool:
    """Choices are shown when the job asked for several or for logprobs."""
    sampling = json.loads(record["sampling"]) if record.get("sampling") else {}
    return int(sampling.get("n") or 1) > 1 or sampling.get("logprobs") is not None


def _choices(record: dict[str, str], finished: bool) -> list[JobChoice] | None:
    if not _choices_wanted(record) or not (finished or record.get("choices")):
        return None
    return [JobChoice.model_validate(c) for c in record_choices(record)]


def delta_public(event: dict[str, Any]) -> dict[str, Any]:
    """A job event stream's delta as the job API shows it: {text}, plus `index` and
    `logprobs` where the worker wrote them."""
    out: dict[str, Any] = {"text": event.get("text", "")}
    if event.get("i"):
        out["index"] = int(event["i"])
    if event.get("lp"):
        out["logprobs"] = json.loads(event["lp"])
    return out


def job_public_json(record: dict[str, str], choices: bytes | None = None) -> bytes:
    """``job_public(record)`` as JSON: ``job_public_parts`` joined."""
    return b"".join(job_public_parts(record, choices))


def job_public_parts(record: dict[str, str], choices: bytes | None = None) -> tuple[bytes, ...]:
    """``job_public(record)`` as JSON in parts that join to it, without parsing a finished
    job's stored choices: the worker writes them in the public shape, in index order
    (worker/held.py), so their JSON is spliced in as it is. ``choices``: the record's
    ``choices`` as read, undecoded, for a record read without them (``None``: the record's
    own field). A job of 16 choices with 20 top logprobs per token is a record of about
    12 MB; parsing and re-encoding it took over a second of the gateway's event loop.
    Left in parts, the choices can be sent from the bytes Redis returned, never joined."""
    raw = choices if choices is not None else record.get("choices", "").encode()
    if not raw or not _choices_wanted(record):
        return (job_public(record).model_dump_json().encode(),)
    head = job_public(record, with_choices=False).model_dump_json().encode()
    # "choices" is a field of JobPublic before any free text: its null is the first match.
    at = head.index(b'"choices":null')
    return head[:at] + b'"choices":', raw, head[at + len(b'"choices":null') :]


def job_accepted(record: dict[str, str]) -> JobAccepted:
    """The 202 answer to a submitted job: where it waits, and until when it may."""
    return JobAccepted(
        id=record["id"],
        status=JobStatus(record["status"]),
        bucket=record["bucket"],
        created_at=float(record["created_at"]),
        deadline=_float(record, "deadline"),
        ttl=_float(record, "ttl"),
        expires_at=_float(record, "expire_at"),
        model=record.get("model") or None,
    )


def job_public(record: dict[str, str], with_choices: bool = True) -> JobPublic:
    """The API view of a job record from Redis (``with_choices=False``: choices left null,
    for ``job_public_json``)."""
    status = JobStatus(record["status"])
    queued_at, started = _float(record, "queued_at"), _float(record, "started_at")
    first = _float(record, "first_token_at")
    result = None
    if status.is_terminal or record.get("text"):
        result = JobResult(
            text=record.get("text", ""), finish_reason=record.get("finish_reason") or None
        )
    webhook = None
    if record.get("webhook_url"):
        webhook = {
            "url": record["webhook_url"],
            "attempts": int(record.get("webhook_attempts") or 0),
            "status": record.get("webhook_status") or "pending",
        }
    return JobPublic(
        id=record["id"],
        status=status,
        bucket=record["bucket"],
        priority=Priority(record["priority"]),
        created_at=float(record["created_at"]),
        result=result,
        choices=_choices(record, status.is_terminal) if with_choices else None,
        model=record.get("lora") or record.get("model") or None,
        usage=JobUsage(
            prompt_tokens=int(record.get("prompt_tokens") or 0),
            completion_tokens=int(record.get("completion_tokens") or 0),
        ),
        timings=JobTimings(
            queued_at=queued_at,
            started_at=started,
            first_token_at=first,
            finished_at=_float(record, "finished_at"),
            queue_seconds=started - queued_at if started and queued_at else None,
            ttft_seconds=first - queued_at if first and queued_at else None,
            cold_start_seconds=_float(record, "cold_start_seconds"),
        ),
        attempts=int(record.get("attempts") or 0),
        error=record.get("error") or None,
        metadata=json.loads(record["metadata"]) if record.get("metadata") else None,
        webhook=webhook,
        deadline=_float(record, "deadline"),
        ttl=_float(record, "ttl"),
        expires_at=_float(record, "expire_at"),
    )


def _int(record: dict[str, str], key: str) -> int | None:
    return int(float(record[key])) if record.get(key) else None


def list_page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """OpenAI's page of a list (files, batches)."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def public_batch(record: dict[str, str]) -> dict[str, Any]:
    """The OpenAI Batch object."""
    errors = json.loads(record["errors"]) if record.get("errors") else None
    return {
        "id": record["id"],
        "object": "batch",
        "endpoint": record["endpoint"],
        "errors": {"object": "list", "data": errors} if errors else None,
        "input_file_id": record["input_file_id"],
        "completion_window": record["completion_window"],
        "status": record["status"],
        "model": record.get("model") or None,  # the served model; set once validated
        "output_file_id": record.get("output_file_id") or None,
        "error_file_id": record.get("error_file_id") or None,
        "created_at": _int(record, "created_at"),
        "in_progress_at": _int(record, "in_progress_at"),
        "expires_at": _int(record, "expires_at"),
        "finalizing_at": _int(record, "finalizing_at"),
        "completed_at": _int(record, "completed_at"),
        "failed_at": _int(record, "failed_at"),
        "expired_at": _int(record, "expired_at"),
        "cancelling_at": _int(record, "cancelling_at"),
        "cancelled_at": _int(record, "cancelled_at"),
        "request_counts": {
            "total": int(record.get("total") or 0),
            "completed": int(record.get("completed") or 0),
            "failed": int(record.get("failed") or 0),
        },
        "metadata": json.loads(record["metadata"]) if record.get("metadata") else None,
    }
