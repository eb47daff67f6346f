"""The controller's metrics (prometheus-client), on its own registry, and their endpoint.

Every series names the model it is about: backlog series by (model, bucket), pool series
by (pool, model), as each pool serves one model. `model` is the served name (what clients
send), the default model's too (its queues have no lane, infra/wire/models.py).
"""

from __future__ import annotations

import socket
from typing import cast

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from tide_fleet.infra.fleet.fleet_config import FleetConfig

registry = CollectorRegistry()
DESIRED = Gauge(
    "tide:controller_desired_workers", "workers the policy wants per pool", ["pool", "model"],
    registry=registry,
)  # fmt: skip
WORKERS = Gauge(
    "tide:controller_workers", "workers per pool by state (starting, ready, draining)",
    ["pool", "model", "state"], registry=registry,
)  # fmt: skip
BACKLOG_TOKENS = Gauge(
    "tide:controller_backlog_tokens", "prompt + max tokens of queued jobs",
    ["model", "bucket"], registry=registry,
)  # fmt: skip
QUEUE_JOBS = Gauge(
    "tide:controller_queue_jobs", "queued jobs (including taken, not started)",
    ["model", "bucket"], registry=registry,
)  # fmt: skip
OLDEST_AGE = Gauge(
    "tide:controller_oldest_job_age_seconds", "age of the oldest queued job",
    ["model", "bucket"], registry=registry,
)  # fmt: skip
ARRIVAL_RATE = Gauge(
    "tide:controller_arrival_tokens_per_second", "smoothed work tokens arriving per second",
    ["pool", "model"], registry=registry,
)  # fmt: skip
SERVICE_RATE = Gauge(
    "tide:controller_service_tokens_per_second", "work tokens one worker serves per second",
    ["pool", "model"], registry=registry,
)  # fmt: skip
DECISIONS = Counter(
    "tide:controller_decisions", "scaling decisions by action", ["pool", "model", "action"],
    registry=registry,
)  # fmt: skip


def model_names(fleet: FleetConfig, default_path: str) -> dict[str, str]:
    """lane -> the served name its series carry as `model` ('' is the default model's lane)."""
    cat = fleet.catalog(default_path)
    return {m.lane: m.name for m in cat.models}


def start_metrics_server(port: int, host: str = "127.0.0.1") -> str:
    """Serve the registry on a background thread; the URL others can scrape."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    bound_host, bound = cast(tuple[str, int], server.server_address[:2])  # AF_INET(6)
    if bound_host in ("0.0.0.0", "::"):  # advertise an address others can reach
        bound_host = socket.gethostbyname(socket.gethostname())
    return f"http://{bound_host}:{bound}/metrics"
