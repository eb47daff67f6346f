"""Streamed OpenAI responses: the jobs' deltas as completion or chat chunks, then `[DONE]`.

Choice index = job position x n + the delta's choice `i`. Each choice ends with a chunk
carrying its finish_reason; with ``stream_options.include_usage`` every chunk has
``"usage": null`` and a last chunk has ``choices: []`` and the usage. A job that ends
without completing sends an error object (the openai client raises it) and no `[DONE]`;
the request's other jobs are cancelled. Chat with tools holds a choice's text back while
it may still be a call (infra/jobs/tools.py), and sends a call as ``delta.tool_calls``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from sse_starlette.sse import EventSourceResponse

from tide_fleet.gateway.deps import GatewayState
from tide_fleet.gateway.events import many_job_events
from tide_fleet.infra.jobs.job_errors import unfinished_job
from tide_fleet.infra.jobs.openai_format import call_id, record_choices, usage_of
from tide_fleet.infra.jobs.openai_logprobs import chat_logprobs, completion_logprobs
from tide_fleet.infra.jobs.tools import ToolRender, ToolStream


@dataclass
class StreamPlan:
    job_ids: list[str]
    tenant: str
    n: int
    model: str
    chat: bool
    include_usage: bool
    echo: list[str] = field(default_factory=list)  # completions: per job
    tools: ToolRender | None = None  # chat


@dataclass
class Choice:
    offset: int = 0  # characters sent (completions' text_offset)
    role_sent: bool = False
    tool: ToolStream | None = None


class Chunks:
    """Builds the chunks of one streamed response."""

    def __init__(self, plan: StreamPlan) -> None:
        self.plan = plan
        self.head = {
            "id": plan.job_ids[0],
            "object": "chat.completion.chunk" if plan.chat else "text_completion",
            "created": int(time.time()),
            "model": plan.model,
            "system_fingerprint": None,
        }
        if plan.include_usage:
            self.head["usage"] = None
        self.choices: dict[int, Choice] = {}

    def state(self, index: int) -> Choice:
        if index not in self.choices:
            tool = ToolStream(self.plan.tools) if self.plan.tools else None
            self.choices[index] = Choice(tool=tool)
        return self.choices[index]

    def chunk(self, choice: dict[str, Any]) -> dict[str, str]:
        return {"data": json.dumps({**self.head, "choices": [choice]})}

    def text(self, index: int, text: str, lp: list[Any] | None, finish: Any = None) -> Any:
        """The chunk for text (and its logprobs) of one choice."""
        st = self.state(index)
        if not self.plan.chat:
            logprobs = completion_logprobs(lp, st.offset) if lp is not None else None
            st.offset += len(text)
            return self.chunk({"index": index, "text": text, "finish_reason": finish,
                               "logprobs": logprobs})  # fmt: skip
        return self.chat(index, {"content": text}, lp, finish)

    def opening(self, index: int) -> list[Any]:
        """Chat: a choice's first chunk, as OpenAI's, carries only the role and empty content."""
        st = self.state(index)
        if not self.plan.chat or st.role_sent:
            return []
        st.role_sent = True
        return [self.chat(index, {"role": "assistant", "content": ""}, None, None)]

    def chat(self, index: int, delta: dict[str, Any], lp: Any, finish: Any) -> Any:
        logprobs = chat_logprobs(lp) if lp else None
        return self.chunk({"index": index, "delta": delta, "finish_reason": finish,
                           "logprobs": logprobs})  # fmt: skip

    def delta(self, index: int, text: str, lp: list[Any] | None) -> list[Any]:
        tool = self.state(index).tool
        if tool is not None:
            text, lp = tool.feed(text, lp)
        return [*self.opening(index), self.text(index, text, lp)] if text or lp else []

    def finish(self, record: dict[str, str], index: int, c: dict[str, Any]) -> list[Any]:
        return [*self.opening(index), *self._finish(record, index, c)]

    def _finish(self, record: dict[str, str], index: int, c: dict[str, Any]) -> list[Any]:
        finish = c.get("finish_reason") or "stop"
        tool = self.state(index).tool
        if tool is None or tool.passing:
            if self.plan.chat:
                return [self.chat(index, {}, None, finish)]
            return [self.text(index, "", None, finish)]
        message, finish = tool.render.message(c.get("text", ""), finish, call_id(record, index))
        lp = tool.logprobs or None
        if message.get("tool_calls"):
            calls = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
            return [self.chat(index, {"content": None, "tool_calls": calls}, lp, finish)]
        return [self.chat(index, {"content": message["content"]}, lp, finish)]

    def usage(self, records: list[dict[str, str]]) -> dict[str, str]:
        return {"data": json.dumps({**self.head, "choices": [], "usage": usage_of(*records)})}


def _error(job_id: str, record: dict[str, str] | None) -> dict[str, str]:
    answer = unfinished_job(job_id, record)
    error = {"message": answer.message, "type": "server_error" if answer.status >= 500
             else "invalid_request_error", "param": None, "code": answer.code}  # fmt: skip
    return {"data": json.dumps({"error": error})}


async def chunks(state: GatewayState, plan: StreamPlan) -> AsyncIterator[dict[str, str]]:
    out = Chunks(plan)
    for k, text in enumerate(plan.echo):
        for j in range(plan.n):
            yield out.text(k * plan.n + j, text, None)
    finals: dict[int, dict[str, str]] = {}
    async for k, event in many_job_events(state, plan.job_ids):
        if event.get("type") == "delta":
            lp = json.loads(event["lp"]) if event.get("lp") else None
            index = k * plan.n + int(event.get("i") or 0)
            for item in out.delta(index, event.get("text", ""), lp):
                yield item
            continue
        record = await state.get_job(plan.job_ids[k])
        if (record or {}).get("status") != "completed":
            others = [j for i, j in enumerate(plan.job_ids) if i != k and i not in finals]
            for job_id in others:
                await asyncio.to_thread(state.store.cancel, job_id, plan.tenant)
            yield _error(plan.job_ids[k], record)
            return
        assert record is not None
        finals[k] = record
        for j, c in enumerate(await asyncio.to_thread(record_choices, record)):
            for item in out.finish(record, k * plan.n + j, c):
                yield item
    if plan.include_usage:
        yield out.usage([finals[k] for k in sorted(finals)])
    yield {"data": "[DONE]"}


def stream_response(state: GatewayState, plan: StreamPlan) -> EventSourceResponse:
    """Framed as OpenAI frames it: ``data: <json>`` events ending in a blank line, LF line
    endings, no comments unless keep-alives are set (``openai_stream_keepalive_seconds``)."""
    keepalive = state.settings.openai_stream_keepalive_seconds
    return EventSourceResponse(chunks(state, plan), ping=keepalive, sep="\n")
