"""Gateway metrics (prometheus-client): requests, latency, rejections, queue depth."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

registry = CollectorRegistry()
REQUESTS = Counter(
    "tide:gateway_requests", "HTTP requests by route and status code", ["route", "code"],
    registry=registry,
)  # fmt: skip
LATENCY = Histogram(
    "tide:gateway_request_seconds", "HTTP request latency", ["route"], registry=registry,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)  # fmt: skip
REJECTIONS = Counter(
    "tide:gateway_rejections", "requests refused, by reason", ["reason"], registry=registry
)
QUEUE_DEPTH = Gauge("tide:queue_depth", "messages waiting per queue", ["queue"], registry=registry)


class RequestMetrics:
    """Pure ASGI middleware (cheaper than BaseHTTPMiddleware on the hot path)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            REQUESTS.labels(path, str(status)).inc()
            LATENCY.labels(path).observe(time.perf_counter() - start)
            if status == 429:
                REJECTIONS.labels("limit").inc()
            elif 400 <= status < 500:
                REJECTIONS.labels(f"http_{status}").inc()
