"""The Celery app on the Redis broker: webhook delivery and batch orchestration tasks."""

from __future__ import annotations

from celery import Celery

from infra.settings import Settings, get_settings

WEBHOOK_QUEUE = "tide.webhooks"
BATCH_QUEUE = "tide.batches"


def make_celery(settings: Settings) -> Celery:
    app = Celery("tide", broker=settings.redis_url, include=["infra.webhooks", "infra.batches"])
    app.conf.update(
        task_acks_late=True,  # a task lost with its worker runs again (all tasks are idempotent)
        task_reject_on_worker_lost=True,
        task_default_queue=WEBHOOK_QUEUE,
        task_routes={"tide.batch.*": {"queue": BATCH_QUEUE}},
        worker_prefetch_multiplier=1,
        broker_transport_options={"visibility_timeout": 900},
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
    )
    return app


celery_app = make_celery(get_settings())
