"""The controller's metrics (prometheus-client), on its own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

registry = CollectorRegistry()
DESIRED = Gauge(
    "tide:controller_desired_workers", "workers the policy wants per pool", ["pool"],
    registry=registry,
)  # fmt: skip
WORKERS = Gauge(
    "tide:controller_workers", "workers per pool by state (starting, ready, draining)",
    ["pool", "state"], registry=registry,
)  # fmt: skip
BACKLOG_TOKENS = Gauge(
    "tide:controller_backlog_tokens", "prompt + max tokens of queued jobs", ["bucket"],
    registry=registry,
)  # fmt: skip
QUEUE_JOBS = Gauge(
    "tide:controller_queue_jobs", "queued jobs (including taken, not started)", ["bucket"],
    registry=registry,
)  # fmt: skip
OLDEST_AGE = Gauge(
    "tide:controller_oldest_job_age_seconds", "age of the oldest queued job", ["bucket"],
    registry=registry,
)  # fmt: skip
ARRIVAL_RATE = Gauge(
    "tide:controller_arrival_tokens_per_second", "smoothed work tokens arriving per second",
    ["pool"], registry=registry,
)  # fmt: skip
SERVICE_RATE = Gauge(
    "tide:controller_service_tokens_per_second", "work tokens one worker serves per second",
    ["pool"], registry=registry,
)  # fmt: skip
DECISIONS = Counter(
    "tide:controller_decisions", "scaling decisions by action", ["pool", "action"],
    registry=registry,
)  # fmt: skip
