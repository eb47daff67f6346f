"""Request and response bodies of the job API (FastAPI-style suffixes: Create, Public)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator, model_validator

from infra.protocol import JobStatus, Priority


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class WebhookSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: HttpUrl


class SamplingFields(BaseModel):
    """Sampling parameters shared by the job API and the OpenAI-compatible routes."""

    max_tokens: int = Field(64, ge=1, description="tokens to generate, at least 1")
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1, description="-1 disables top-k")
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: list[str] | str | None = None
    ignore_eos: bool = Field(False, description="keep generating past end-of-sequence tokens")

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: list[str] | str | None) -> list[str]:
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > 8:
            raise ValueError(f"at most 8 stop strings, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stops

    def sampling(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop": self.stop or [],
            "ignore_eos": self.ignore_eos,
        }


class JobCreate(SamplingFields):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}]},
    )
    prompt: str | None = Field(None, min_length=1)
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    priority: Priority = Priority.INTERACTIVE
    webhook: WebhookSpec | None = None
    metadata: dict[str, str] | None = Field(None, max_length=16)

    @model_validator(mode="after")
    def _one_input(self) -> JobCreate:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


# OpenAI-compatible request bodies (the routes and the batch API's lines).
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


class JobAccepted(BaseModel):
    id: str
    status: JobStatus
    bucket: str
    created_at: float


class JobResult(BaseModel):
    text: str
    finish_reason: str | None


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


class JobPublic(BaseModel):
    id: str
    object: Literal["job"] = "job"
    status: JobStatus
    bucket: str
    priority: Priority
    created_at: float
    result: JobResult | None = None
    usage: JobUsage
    timings: JobTimings
    attempts: int
    error: str | None = None
    metadata: dict[str, str] | None = None
    webhook: dict[str, Any] | None = None


class ErrorBody(BaseModel):
    error: dict[str, Any]


def _float(record: dict[str, str], key: str) -> float | None:
    value = record.get(key)
    return float(value) if value else None


def job_public(record: dict[str, str]) -> JobPublic:
    """The API view of a job record from Redis."""
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
        ),
        attempts=int(record.get("attempts") or 0),
        error=record.get("error") or None,
        metadata=json.loads(record["metadata"]) if record.get("metadata") else None,
        webhook=webhook,
    )
