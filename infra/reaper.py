"""The lease reaper: re-queues in-progress jobs whose worker stopped refreshing its lease.

A small loop; ``tide up`` runs it, and the controller will host it. It also runs the
batch supervisor (``infra.batches.supervise_batches``) every ``batch_poll_interval``.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from infra.jobstore import JobStore
from infra.settings import Settings

log = logging.getLogger(__name__)


STRANDED_SECONDS = 10.0  # a message taken but not started for this long goes back


def reap_once(store: JobStore, settings: Settings) -> dict[str, str]:
    for job_id in store.prune_backlog(settings.job_ttl_seconds):
        log.warning("queued job %s expired before it ran: dropped from the backlog", job_id)
    for job_id in store.restore_stranded(STRANDED_SECONDS):
        log.warning("message of %s was taken but never started: back in its queue", job_id)
    results = store.reap(settings.max_attempts)
    for job_id, outcome in results.items():
        if outcome in ("requeued", "failed", "cancelled"):
            log.warning("lease expired on %s: %s", job_id, outcome)
        if outcome == "failed":
            record = store.get(job_id) or {}
            if record.get("webhook_url"):
                from infra.webhooks import enqueue_webhook

                enqueue_webhook(job_id, "failed")
    return results


def run_reaper(settings: Settings, stop: threading.Event) -> None:
    assert settings.redis_url, "the reaper needs REDIS_URL"
    store = JobStore(redis.Redis.from_url(settings.redis_url))
    next_batches = 0.0
    while not stop.wait(settings.reaper_interval):
        try:
            reap_once(store, settings)
            if time.monotonic() >= next_batches:
                from infra.batches import supervise_batches

                next_batches = time.monotonic() + settings.batch_poll_interval
                supervise_batches()
        except redis.RedisError as e:
            log.warning("reaper: Redis unavailable (%s); retrying", e)
        except Exception:  # the loop must outlive any one bad record
            log.exception("reaper: pass failed; retrying")
