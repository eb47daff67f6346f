"""Gateway metrics (prometheus-client): requests, latency, rejections by reason, backlog.

The backlog per served model and bucket (queued jobs, their tokens, the oldest one's age,
arrivals so far) is read from Redis when /metrics is scraped (gateway/routes/health.py), so
it is as fresh as the scrape; its series carry `model` (the served name) and `bucket`. A
process collector exposes the gateway's CPU time: `tide doctor` flags a gateway that
spends a whole core (tokenising) as the bottleneck.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tide_fleet.infra.wire.backlog import BucketBacklog

# Why a request was refused: limits by the job store's reason, the rest by status.
LIMIT_REASONS = {"rate": "rate_limit", "tenant_full": "tenant_queue_full",
                 "queue_full": "queue_full"}  # fmt: skip
STATUS_REASONS = {400: "validation", 422: "validation", 401: "auth", 403: "auth",
                  404: "not_found", 413: "too_large", 429: "limit", 503: "unavailable"}  # fmt: skip
REASON_KEY = "tide_reject_reason"  # in the request's scope state

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
    "tide:gateway_rejections", "requests refused, by reason (rate_limit, tenant_queue_full, "
    "queue_full, validation, auth, not_found, too_large, unavailable, ...)", ["reason"],
    registry=registry,
)  # fmt: skip
QUEUE_DEPTH = Gauge("tide:queue_depth", "messages waiting per queue", ["queue"], registry=registry)
ProcessCollector(registry=registry)


class BacklogCollector(Collector):
    """Exposes the last backlog reading; the /metrics route refreshes it before each scrape."""

    def __init__(self) -> None:
        self.latest: dict[str, dict[str, BucketBacklog]] = {}  # model -> bucket -> backlog

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "bucket"]
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "jobs": GaugeMetricFamily(
                "tide:backlog_jobs", "queued jobs per model and bucket", labels=labels
            ),
            "tokens": GaugeMetricFamily(
                "tide:backlog_tokens", "prompt + max tokens of queued jobs", labels=labels
            ),
            "oldest_age_s": GaugeMetricFamily(
                "tide:backlog_oldest_job_age_seconds", "age of the oldest queued job",
                labels=labels,
            ),
            "arrived_jobs": CounterMetricFamily(
                "tide:arrived_jobs", "jobs ever enqueued per model and bucket", labels=labels
            ),
            "arrived_tokens": CounterMetricFamily(
                "tide:arrived_tokens", "prompt + max tokens ever enqueued", labels=labels
            ),
            "expired_jobs": CounterMetricFamily(
                "tide:expired_jobs", "queued jobs whose deadline or ttl passed before they "
                "started", labels=labels,
            ),
        }  # fmt: skip
        for model, buckets in self.latest.items():
            for bucket, backlog in buckets.items():
                for field, family in families.items():
                    family.add_metric([model, bucket], float(getattr(backlog, field)))
        yield from families.values()


BACKLOG = BacklogCollector()
registry.register(BACKLOG)


def tag_rejection(exc: HTTPException, reason: str) -> HTTPException:
    """Name why a request is refused; the error handler passes it on to the middleware."""
    exc.tide_reason = reason  # type: ignore[attr-defined]
    return exc


def note_rejection(scope: Scope, exc: Exception) -> None:
    """Called by the HTTP error handler: remember a tagged reason for this request."""
    reason = getattr(exc, "tide_reason", None)
    if reason:
        scope.setdefault("state", {})[REASON_KEY] = reason


def rejection_reason(status: int, scope: Scope) -> str | None:
    """The reason label of a refused request; None for successes and server errors."""
    if not 400 <= status < 600 or status in (500, 502, 504):
        return None
    tagged = scope.get("state", {}).get(REASON_KEY)
    return str(tagged) if tagged else STATUS_REASONS.get(status, f"http_{status}")


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
            reason = rejection_reason(status, scope)
            if reason is not None:
                REJECTIONS.labels(reason).inc()
