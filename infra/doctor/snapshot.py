"""What `tide doctor` reads at one moment, and what changed between two such moments.

A snapshot holds the scrapes of the gateway, the controller and each worker, with the
workers' heartbeats (infra/wire/heartbeats.py). Pure and torch-free.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from infra.doctor.scrape import Scrape
from infra.wire.heartbeats import Heartbeat


@dataclass
class Snapshot:
    """Everything read at one moment. worker_info: each worker's heartbeat, by worker id."""

    at: float = 0.0
    gateway: Scrape | None = None
    controller: Scrape | None = None
    workers: dict[str, Scrape] = field(default_factory=dict)
    worker_info: dict[str, Heartbeat] = field(default_factory=dict)


def counter_increase(before: float | None, after: float | None) -> float:
    """Counter increase; a counter that went down restarted, so all of `after` is new."""
    if after is None:
        return 0.0
    if before is None or after < before:
        return after
    return after - before


def worker_increase(before: Snapshot, after: Snapshot, name: str) -> float:
    return sum(
        counter_increase(
            before.workers[w].total(name) if w in before.workers else None, s.total(name)
        )
        for w, s in after.workers.items()
    )


def histogram_counts(
    before: Snapshot, after: Snapshot, name: str, window: bool
) -> dict[float, float]:
    """Histogram counts summed over workers: observed within the interval, or ever."""
    out: dict[float, float] = defaultdict(float)
    for w, scrape in after.workers.items():
        now = scrape.buckets(name)
        then = before.workers[w].buckets(name) if window and w in before.workers else {}
        restarted = any(now.get(le, 0.0) < c for le, c in then.items())
        for le, count in now.items():
            out[le] += count if restarted else count - then.get(le, 0.0)
    return dict(out)


def served_buckets(snap: Snapshot) -> set[str]:
    """The buckets some live worker takes jobs from, by their heartbeats."""
    return {b for beat in snap.worker_info.values() for b in beat.buckets}


def queue_jobs(snap: Snapshot) -> dict[str, float]:
    """Queued jobs per bucket: the gateway's reading, else the controller's."""
    for scrape, name in (
        (snap.gateway, "tide:backlog_jobs"),
        (snap.controller, "tide:controller_queue_jobs"),
    ):
        if scrape is not None and name in scrape.samples:
            return scrape.by_label(name, "bucket")
    return {}


def oldest_age(snap: Snapshot) -> dict[str, float]:
    for scrape, name in (
        (snap.gateway, "tide:backlog_oldest_job_age_seconds"),
        (snap.controller, "tide:controller_oldest_job_age_seconds"),
    ):
        if scrape is not None and name in scrape.samples:
            return scrape.by_label(name, "bucket")
    return {}
