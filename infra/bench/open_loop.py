"""Open-loop POSTs at a fixed rate over keep-alive connections, with a minimal HTTP/1.1
client: the load generator shares the cores with the server it measures, so it must cost
little per request (httpx costs several times more per request than this). Used by the
gateway and console benchmarks (scripts/)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class OpenLoopResult:
    latencies: list[float] = field(default_factory=list)  # seconds from each request's slot
    warm_latencies: list[float] = field(default_factory=list)  # the first `warmup` requests
    codes: dict[int, int] = field(default_factory=dict)  # HTTP status -> count, after warm-up
    elapsed: float = 0.0  # seconds, after warm-up

    def per_s(self, code: int) -> float:
        return self.codes.get(code, 0) / self.elapsed if self.elapsed > 0 else 0.0


async def post_open_loop(
    url: str,
    path: str,
    body: dict[str, Any] | list[dict[str, Any]],
    rate: float,
    n: int,
    concurrency: int,
    warmup: int = 0,
    headers: dict[str, str] | None = None,
) -> OpenLoopResult:
    """`warmup + n` POSTs of `body` to `url + path`, request i scheduled at i / rate; a list
    of bodies is sent in turn (request i sends body i mod its length)."""
    host, port = url.removeprefix("http://").split(":")
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())

    def encode(one: dict[str, Any]) -> bytes:
        payload = json.dumps(one).encode()
        return (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"{extra}Content-Length: {len(payload)}\r\n\r\n"
        ).encode() + payload

    requests = [encode(b) for b in (body if isinstance(body, list) else [body])]
    start = time.perf_counter() + 0.2
    todo: asyncio.Queue[tuple[int, float]] = asyncio.Queue()
    for i in range(warmup + n):
        todo.put_nowait((i, start + i / rate))
    result = OpenLoopResult()

    async def connection() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        while not todo.empty():
            i, scheduled = todo.get_nowait()
            await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
            writer.write(requests[i % len(requests)])
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            took = time.perf_counter() - scheduled
            if i < warmup:
                result.warm_latencies.append(took)
                continue
            result.latencies.append(took)
            code = int(head.split(b" ", 2)[1])
            result.codes[code] = result.codes.get(code, 0) + 1
        writer.close()

    await asyncio.gather(*(connection() for _ in range(concurrency)))
    result.elapsed = time.perf_counter() - start - warmup / rate
    return result
