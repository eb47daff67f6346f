"""What `tide doctor` reads at one moment, and what changed between two such moments.

A snapshot holds the scrapes of the gateway, the controller and each worker, with the
workers' heartbeats (infra/wire/heartbeats.py); what is queued per model and who serves it
is infra/doctor/queues.py. Pure and torch-free.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from tide_fleet.infra.doctor.scrape import Scrape
from tide_fleet.infra.wire.heartbeats import Heartbeat


@dataclass
class Snapshot:
    """Everything read at one moment. worker_info: each worker's heartbeat, by worker id;
    adapter_queue: queued jobs per LoRA adapter (Redis, infra/wire/backlog.py)."""

    at: float = 0.0
    gateway: Scrape | None = None
    controller: Scrape | None = None
    workers: dict[str, Scrape] = field(default_factory=dict)
    worker_info: dict[str, Heartbeat] = field(default_factory=dict)
    adapter_queue: dict[str, int] = field(default_factory=dict)


def counter_increase(before: float | None, after: float | None) -> float:
    """Counter increase; a counter that went down restarted, so all of `after` is new."""
    if after is None:
        return 0.0
    if before is None or after < before:
        return after
    return after - before


def _chosen(after: Snapshot, workers: Iterable[str] | None) -> dict[str, Scrape]:
    if workers is None:
        return after.workers
    return {w: after.workers[w] for w in workers if w in after.workers}


def worker_increase(
    before: Snapshot, after: Snapshot, name: str, workers: Iterable[str] | None = None
) -> float:
    """A counter's increase summed over the workers (all, or those named)."""
    return sum(
        counter_increase(
            before.workers[w].total(name) if w in before.workers else None, s.total(name)
        )
        for w, s in _chosen(after, workers).items()
    )


def histogram_counts(
    before: Snapshot,
    after: Snapshot,
    name: str,
    window: bool,
    workers: Iterable[str] | None = None,
) -> dict[float, float]:
    """Histogram counts summed over the workers (all, or those named): observed within the
    interval, or ever."""
    out: dict[float, float] = defaultdict(float)
    for w, scrape in _chosen(after, workers).items():
        now = scrape.buckets(name)
        then = before.workers[w].buckets(name) if window and w in before.workers else {}
        restarted = any(now.get(le, 0.0) < c for le, c in then.items())
        for le, count in now.items():
            out[le] += count if restarted else count - then.get(le, 0.0)
    return dict(out)
