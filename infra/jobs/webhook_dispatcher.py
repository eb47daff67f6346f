"""The webhook dispatcher: sends the schedule's due deliveries as Celery tasks.

A thread in every Celery worker (started on ``worker_ready``), so no other process has
to host it. Claims are atomic, so several workers dispatch side by side without sending
one delivery twice. A Redis outage only pauses it: it backs off, and when Redis is back
(with its AOF) it sends whatever fell due meanwhile, at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import redis
from celery.signals import worker_ready, worker_shutdown
from kombu.exceptions import OperationalError

from tide_fleet.infra.jobs.celery_app import WEBHOOK_QUEUE
from tide_fleet.infra.jobs.webhook_store import Delivery, WebhookStore
from tide_fleet.infra.jobs.webhooks import default_store, deliver_webhook

log = logging.getLogger(__name__)

DISPATCH_INTERVAL = 0.1  # seconds between looks at the schedule: the latency of a new event
MAX_BACKOFF = 2.0
CLAIM_LIMIT = 100


def send_task(delivery: Delivery) -> None:
    args = (delivery.obj_id, delivery.msg_id, delivery.kind, delivery.ticket)
    deliver_webhook.apply_async(args=args, queue=WEBHOOK_QUEUE)


def dispatch_due(store: WebhookStore, send: Callable[[Delivery], None] = send_task) -> int:
    """Claim and send every delivery due now; returns how many were sent.

    One whose send fails stays claimed: its lease runs out and it is claimed again.
    """
    sent = 0
    while True:
        claimed = store.claim_due(limit=CLAIM_LIMIT)
        for delivery in claimed:
            send(delivery)
        sent += len(claimed)
        if len(claimed) < CLAIM_LIMIT:
            return sent


def run_dispatcher(
    store: WebhookStore, stop: threading.Event, send: Callable[[Delivery], None] = send_task
) -> None:
    wait, failing = DISPATCH_INTERVAL, False
    while not stop.wait(wait):
        try:
            dispatch_due(store, send)
        except (redis.RedisError, OperationalError) as e:
            if not failing:
                log.warning("webhook dispatcher: broker unavailable (%s); retrying", e)
            wait, failing = min(MAX_BACKOFF, wait * 2), True
            continue
        except Exception:  # the loop must outlive any one bad delivery
            log.exception("webhook dispatcher: pass failed; retrying")
            wait = MAX_BACKOFF
            continue
        if failing:
            log.warning("webhook dispatcher: broker back; dispatching")
        wait, failing = DISPATCH_INTERVAL, False


_stop = threading.Event()


@worker_ready.connect
def _start(**_: Any) -> None:
    _stop.clear()
    thread = threading.Thread(
        target=run_dispatcher, args=(default_store(), _stop), name="webhook-dispatcher", daemon=True
    )
    thread.start()


@worker_shutdown.connect
def _shutdown(**_: Any) -> None:
    _stop.set()
