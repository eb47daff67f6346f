"""OpenAI streams framed as OpenAI frames them, read by a deliberately naive client.

Many clients written against OpenAI's API (vLLM's `bench serve` among them) split the body
on a blank line and expect each piece to be `data: <json>` or `data: [DONE]`: an SSE comment
or CRLF line endings make them misparse everything after. A live gateway on loopback, jobs
left waiting in the queue past sse-starlette's default keep-alive interval (15 s) before a
fake worker answers them.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
import pytest

from tests.gateway.live import live_fleet

AUTH = {"Authorization": "Bearer key-a"}
WAIT_SECONDS = 16.0  # past 15 s, when a keep-alive comment would be due on a waiting stream


def naive_events(body: bytes) -> list[Any]:
    """Split on a blank line; every piece must be exactly one `data:` line."""
    assert b"\r" not in body, body[:200]
    pieces = body.split(b"\n\n")
    assert pieces[-1] == b"", body[-200:]  # the body ends with a blank line
    events = []
    for piece in pieces[:-1]:
        text = piece.decode()
        assert text.startswith("data: ") and "\n" not in text, text[:200]
        payload = text[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def text_of(events: list[Any], chat: bool) -> dict[int, str]:
    out: dict[int, str] = {}
    for event in events[:-1]:
        for c in event["choices"]:
            piece = (c["delta"].get("content") or "") if chat else c["text"]
            out[c["index"]] = out.get(c["index"], "") + piece
    return out


async def _stream(client: httpx.AsyncClient, url: str, model: str, chat: bool, k: int) -> bytes:
    body: dict[str, Any] = {"model": model, "max_tokens": 8, "stream": True}
    if chat:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": f"request {k}"}]
        body["stream_options"] = {"include_usage": True}
    else:
        path, body["prompt"] = "/v1/completions", f"request {k}"
    async with client.stream("POST", url + path, json=body, headers=AUTH) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        return await r.aread()


async def _many(url: str, model: str, count: int) -> list[bytes]:
    limits = httpx.Limits(max_connections=count + 8)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        streams = (_stream(client, url, model, k % 2 == 1, k) for k in range(count))
        return await asyncio.gather(*streams)


@pytest.fixture
def served(redis_server, redis_client, tiny_path):  # type: ignore[no-untyped-def]
    def start(delay: float, **overrides: Any):  # type: ignore[no-untyped-def]
        fleet = live_fleet(redis_server.url, str(tiny_path), with_worker=False, **overrides)
        gateway, worker = fleet.__enter__()
        timer = threading.Timer(delay, worker.run)
        timer.daemon = True
        timer.start()
        opened.append((fleet, worker, timer))
        return gateway.url, str(tiny_path)

    opened: list[Any] = []
    yield start
    for fleet, worker, timer in opened:
        timer.cancel()
        worker.stop.set()
        fleet.__exit__(None, None, None)


def test_many_streams_waiting_in_the_queue_parse_with_a_naive_client(served):
    url, model = served(WAIT_SECONDS)
    start = time.monotonic()
    bodies = asyncio.run(_many(url, model, 64))
    assert time.monotonic() - start >= WAIT_SECONDS  # every stream waited for the worker
    for k, body in enumerate(bodies):
        chat = k % 2 == 1
        events = naive_events(body)
        assert events[-1] == "[DONE]"
        assert text_of(events, chat) == {0: "choice 0 says hi"}
        if chat:
            first, finish, usage = events[0], events[-3], events[-2]
            assert first["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "finish_reason": None, "logprobs": None}]  # fmt: skip
            assert first["object"] == "chat.completion.chunk" and first["usage"] is None
            assert finish["choices"][0]["delta"] == {}
            assert finish["choices"][0]["finish_reason"] == "stop"
            assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
        else:
            assert events[-2]["choices"][0]["finish_reason"] == "stop"


def test_keepalives_are_a_setting_and_framed_with_lf(served):
    url, model = served(1.6, openai_stream_keepalive_seconds=0.5)
    body = asyncio.run(_many(url, model, 1))[0]
    assert b"\r" not in body
    comments = [line for line in body.split(b"\n") if line.startswith(b":")]
    assert len(comments) >= 2 and all(c.startswith(b": ping") for c in comments), body[:300]
    data = b"\n\n".join(p for p in body.split(b"\n\n") if not p.startswith(b":"))
    assert naive_events(data)[-1] == "[DONE]"
