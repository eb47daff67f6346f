"""Gateway metrics (prometheus-client): requests, latency, rejections, queue depth."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from fastapi import Request, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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


async def record_request(
    request: Request, call_next: Callable[[Request], Awaitable[Response]]
) -> Response:
    start = time.perf_counter()
    response = await call_next(request)
    route = request.scope.get("route")
    path = getattr(route, "path", "unmatched")
    REQUESTS.labels(path, str(response.status_code)).inc()
    LATENCY.labels(path).observe(time.perf_counter() - start)
    if response.status_code == 429:
        REJECTIONS.labels("limit").inc()
    elif 400 <= response.status_code < 500:
        REJECTIONS.labels(f"http_{response.status_code}").inc()
    return response
