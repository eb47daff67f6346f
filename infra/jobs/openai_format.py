"""OpenAI response bodies built from finished job records (the routes and batch output).

A record's choices are its ``choices`` (the worker's list, one per choice), or for a record
without them its ``text``/``finish_reason``/``completion_tokens`` as one choice. Its
``render`` field (JSON, written at submit) says how to show them: ``echo`` (the prompt
text before each completion) and ``tools`` (read tool calls out of chat text).
"""

from __future__ import annotations

import json
from typing import Any

from tide_fleet.infra.jobs.openai_logprobs import chat_logprobs, completion_logprobs
from tide_fleet.infra.jobs.tools import ToolRender

PIECEWISE_CHARS = 1 << 20  # a longer choices list is parsed one choice at a time


def record_choices(record: dict[str, str]) -> list[dict[str, Any]]:
    if record.get("choices"):
        choices = _json_list(record["choices"])
        return sorted(choices, key=lambda c: int(c.get("index", 0)))
    return [{
        "index": 0, "text": record.get("text", ""),
        "finish_reason": record.get("finish_reason") or None,
        "completion_tokens": int(record.get("completion_tokens") or 0), "logprobs": None,
    }]  # fmt: skip


def render_options(record: dict[str, str]) -> dict[str, Any]:
    options: dict[str, Any] = json.loads(record["render"]) if record.get("render") else {}
    return options


def usage_of(*records: dict[str, str]) -> dict[str, int]:
    prompt = sum(int(r.get("prompt_tokens") or 0) for r in records)
    completion = sum(int(r.get("completion_tokens") or 0) for r in records)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _head(record: dict[str, str], model: str, kind: str) -> dict[str, Any]:
    return {
        "id": record["id"],
        "object": kind,
        "created": int(float(record.get("created_at") or 0)),
        "model": model,
        "system_fingerprint": None,
    }


def completion_choices(record: dict[str, str], first_index: int = 0) -> list[dict[str, Any]]:
    echo = render_options(record).get("echo", "")
    return [
        {
            "index": first_index + i,
            "text": echo + c.get("text", ""),
            "finish_reason": c.get("finish_reason") or None,
            "logprobs": completion_logprobs(c["logprobs"]) if c.get("logprobs") is not None
            else None,
        }
        for i, c in enumerate(record_choices(record))
    ]  # fmt: skip


def completions_body(records: list[dict[str, str]], model: str) -> dict[str, Any]:
    """One response for the jobs of a request's prompts: choice index prompt_i * n + j."""
    choices: list[dict[str, Any]] = []
    for record in records:
        choices += completion_choices(record, len(choices))
    return {**_head(records[0], model, "text_completion"), "choices": choices,
            "usage": usage_of(*records)}  # fmt: skip


def completion_body(record: dict[str, str], model: str) -> dict[str, Any]:
    return completions_body([record], model)


def call_id(record: dict[str, str], index: int) -> str:
    return f"call_{record['id'].removeprefix('job_')}_{index}"


def chat_choice(record: dict[str, str], c: dict[str, Any], index: int) -> dict[str, Any]:
    text, finish = c.get("text", ""), c.get("finish_reason") or None
    tools = render_options(record).get("tools")
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tools:
        message, finish = ToolRender.from_dict(tools).message(text, finish, call_id(record, index))
    message.setdefault("refusal", None)
    lp = c.get("logprobs")
    return {"index": index, "message": message, "finish_reason": finish,
            "logprobs": chat_logprobs(lp) if lp is not None else None}  # fmt: skip


def chat_body(record: dict[str, str], model: str) -> dict[str, Any]:
    choices = [chat_choice(record, c, i) for i, c in enumerate(record_choices(record))]
    return {**_head(record, model, "chat.completion"), "choices": choices,
            "usage": usage_of(record)}  # fmt: skip


def _json_list(raw: str) -> list[dict[str, Any]]:
    """A JSON list; a long one element by element, so that a thread parsing megabytes of
    logprobs lets others (the gateway's event loop) run between elements rather than
    holding the interpreter for the whole of one json.loads call."""
    if len(raw) < PIECEWISE_CHARS:
        parsed: list[dict[str, Any]] = json.loads(raw)
        return parsed
    decoder, out = json.JSONDecoder(), []
    i = raw.index("[") + 1
    while True:
        while raw[i] in " \t\r\n,":
            i += 1
        if raw[i] == "]":
            return out
        item, i = decoder.raw_decode(raw, i)
        out.append(item)
