"""OpenAI response bodies built from a finished job record (routes and batch output)."""

from __future__ import annotations

from typing import Any

REJECTED_PREFIX = "rejected by the worker"  # worker/service.py: the request itself was bad


def usage_of(record: dict[str, str]) -> dict[str, int]:
    prompt = int(record.get("prompt_tokens") or 0)
    completion = int(record.get("completion_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completion_body(record: dict[str, str], model: str) -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": record.get("text", ""),
        "finish_reason": record.get("finish_reason") or None,
        "logprobs": None,
    }
    return {
        "id": record["id"],
        "object": "text_completion",
        "created": int(float(record.get("created_at") or 0)),
        "model": model,
        "choices": [choice],
        "usage": usage_of(record),
    }


def chat_body(record: dict[str, str], model: str) -> dict[str, Any]:
    message = {"role": "assistant", "content": record.get("text", "")}
    choice = {"index": 0, "message": message, "finish_reason": record.get("finish_reason") or None}
    return {
        "id": record["id"],
        "object": "chat.completion",
        "created": int(float(record.get("created_at") or 0)),
        "model": model,
        "choices": [choice],
        "usage": usage_of(record),
    }


def unfinished_job(job_id: str, record: dict[str, str]) -> tuple[int, str, str]:
    """(HTTP status, message, code) for a synchronous request whose job did not complete:
    409 when it was cancelled or expired meanwhile, 400 when a worker rejected the request,
    500 (with the job id, to look it up) for a fault inside the fleet."""
    status, error = record.get("status") or "missing", record.get("error") or ""
    if status in ("cancelled", "expired"):
        return 409, f"job {job_id} was {status} before it completed", f"job_{status}"
    if status == "failed" and error.startswith(REJECTED_PREFIX):
        return 400, f"job {job_id} failed: {error}", "job_rejected"
    detail = f": {error}" if error else ""
    return 500, f"job {job_id} {status}{detail}", "job_failed"
