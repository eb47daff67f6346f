"""The Celery app on the Redis broker: webhook delivery and batch orchestration tasks.

The pool is configured here, not on the command line: threads, so that an attempt
waiting on a slow receiver holds one of ``WORKER_CONCURRENCY`` slots and nothing else
(``tide_fleet.infra.jobs.webhooks`` bounds how many one receiver may hold).
"""

from __future__ import annotations

from celery import Celery

from tide_fleet.infra.settings import Settings, get_settings

WEBHOOK_QUEUE = "tide.webhooks"
BATCH_QUEUE = "tide.batches"
WORKER_CONCURRENCY = 16  # threads per Celery worker; attempts mostly wait on the network


def make_celery(settings: Settings) -> Celery:
    app = Celery(
        "tide",
        broker=settings.redis_url,
        include=[
            "tide_fleet.infra.jobs.webhooks",
            "tide_fleet.infra.jobs.webhook_dispatcher",
            "tide_fleet.infra.batches.validate",
            "tide_fleet.infra.batches.finalize",
        ],
    )
    app.conf.update(
        task_acks_late=True,  # a task lost with its worker runs again (all tasks are idempotent)
        task_reject_on_worker_lost=True,
        task_default_queue=WEBHOOK_QUEUE,
        task_routes={"tide.batch.*": {"queue": BATCH_QUEUE}},
        worker_pool="threads",
        worker_concurrency=WORKER_CONCURRENCY,
        worker_prefetch_multiplier=1,
        # Only a backstop: webhook retries live in Redis (infra.jobs.webhook_store), never as
        # ETA messages, which would wait out this timeout after a crash.
        broker_transport_options={"visibility_timeout": 900},
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
    )
    return app


celery_app = make_celery(get_settings())


def use_broker(url: str | None) -> None:
    """Send this process's tasks to the broker at `url` from now on: ``tide up`` learns its
    embedded Redis's URL only after this module (and its app) may have been imported."""
    celery_app.conf.broker_url = url
