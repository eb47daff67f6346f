"""OpenAI response bodies built from a finished job record (routes and batch output)."""

from __future__ import annotations

from typing import Any


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
