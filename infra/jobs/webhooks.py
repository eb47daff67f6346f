"""Signed webhook delivery (Standard Webhooks): one attempt per Celery task.

``enqueue_webhook`` writes the event to the delivery schedule in Redis
(``tide_fleet.infra.jobs.webhook_store``); the dispatcher in each Celery worker
(``tide_fleet.infra.jobs.webhook_dispatcher``) sends due deliveries here. An attempt's outcome is
decided by ``infra.jobs.webhook_policy`` and written back as the next due time, so retries
are never broker ETA messages. The same ``webhook-id`` is sent on every attempt of one
event, so receivers can deduplicate; attempts and the last outcome are on the job.

One slow receiver delays nobody else: the Celery pool runs attempts in threads, and one
receiver holds at most ``RECEIVER_CONCURRENCY`` of them; a delivery finding its
receiver at its share waits a moment in the schedule (not an attempt). Targets on
non-global addresses are refused unless allow-listed (SSRF guard).
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
import random
import socket
import threading
import time
from datetime import UTC, datetime
from urllib.parse import urlsplit

import httpx
import redis
from standardwebhooks import Webhook

from tide_fleet.infra.jobs.celery_app import celery_app
from tide_fleet.infra.jobs.public import job_public, public_batch
from tide_fleet.infra.jobs.webhook_policy import Decision, Verdict, decide
from tide_fleet.infra.jobs.webhook_store import Delivery, WebhookStore
from tide_fleet.infra.settings import Settings, get_settings
from tide_fleet.infra.wire.protocol import Keys

log = logging.getLogger(__name__)

RECEIVER_CONCURRENCY = 4  # attempts in flight per receiver in one sender process
BUSY_RECEIVER_WAIT = (0.5, 1.5)  # seconds, drawn at random: a delivery whose receiver is full
LEASE_MARGIN_SECONDS = 5.0
SETTLE_RETRY_SECONDS = 15.0  # how long an attempt keeps trying to record its outcome


class UnsafeWebhookTarget(ValueError):
    pass


NAT64 = ipaddress.ip_network("64:ff9b::/96")  # IPv6 names for IPv4 addresses


def is_public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Globally routable unicast. ``is_global`` rather than a list of ranges: it also
    excludes shared address space (100.64.0.0/10, carrier-grade NAT), documentation and
    benchmarking ranges; an IPv6 address that embeds an IPv4 one is judged by that."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or ip.sixtofour
        if inner is None and ip in NAT64:
            inner = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if inner is not None and not is_public(inner):
            return False
    return ip.is_global and not ip.is_multicast


def check_target(url: str, allow_hosts: list[str]) -> None:
    """Refuse URLs that resolve to an address that is not public, unless allow-listed."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UnsafeWebhookTarget(f"webhook.url must be an http(s) URL, got {url!r}")
    host = parts.hostname
    if host in allow_hosts:
        return
    try:
        infos = socket.getaddrinfo(host, parts.port or 443, proto=socket.IPPROTO_TCP)
    except socket.gaierror:
        raise UnsafeWebhookTarget(f"webhook.url host {host!r} does not resolve") from None
    for info in infos:
        ip = ipaddress.ip_address(info[4][0])
        if str(ip) in allow_hosts:
            continue
        if not is_public(ip):
            raise UnsafeWebhookTarget(
                f"webhook.url host {host!r} resolves to {ip}, a non-public address; "
                "allow-list it in TIDE_WEBHOOK_ALLOW_HOSTS to use it"
            )


def secret_for(settings: Settings, tenant: str) -> str:
    return settings.webhook_secrets.get(tenant) or settings.webhook_secrets["*"]


def event_id(obj_id: str, status: str) -> str:
    return f"msg_{obj_id}_{status}"


def lease_seconds(settings: Settings) -> float:
    """Longest an attempt may take (connect, write and read each up to the timeout)."""
    return 3 * settings.webhook_timeout + LEASE_MARGIN_SECONDS


def record_key(delivery: Delivery) -> str:
    return Keys.batch(delivery.obj_id) if delivery.kind == "batch" else Keys.job(delivery.obj_id)


@functools.cache
def default_store() -> WebhookStore:
    settings = get_settings()
    return WebhookStore(redis.Redis.from_url(settings.redis_url or ""), lease_seconds(settings))


def enqueue_webhook(
    obj_id: str, status: str, kind: str = "job", client: redis.Redis | None = None
) -> None:
    """Schedule delivery of a terminal-state event, due now (a no-op if there is no URL)."""
    store = default_store() if client is None else WebhookStore(client, 0.0)
    store.schedule(Delivery(kind, obj_id, event_id(obj_id, status)))


class ReceiverSlots:
    """Attempts in flight per receiver in this process, at most ``limit`` each."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._busy: dict[str, int] = {}

    def try_acquire(self, receiver: str) -> bool:
        with self._lock:
            if self._busy.get(receiver, 0) >= self.limit:
                return False
            self._busy[receiver] = self._busy.get(receiver, 0) + 1
            return True

    def release(self, receiver: str) -> None:
        with self._lock:
            left = self._busy.pop(receiver) - 1
            if left:
                self._busy[receiver] = left


SLOTS = ReceiverSlots(RECEIVER_CONCURRENCY)


def receiver_of(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


def _payload(kind: str, record: dict[str, str]) -> bytes:
    if kind == "batch":
        return json.dumps(public_batch(record)).encode()
    return job_public(record).model_dump_json().encode()


def _post(
    url: str, body: bytes, msg_id: str, secret: str, timeout: float
) -> tuple[int, str | None]:
    """(status code, Retry-After header) of one signed POST; the body is not read."""
    now = datetime.now(tz=UTC)
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, now, body.decode()),
        "content-type": "application/json",
    }
    with httpx.stream("POST", url, content=body, headers=headers, timeout=timeout) as response:
        return response.status_code, response.headers.get("retry-after")


def attempt_delivery(store: WebhookStore, settings: Settings, delivery: Delivery) -> str:
    """Make one attempt as the holder of ``delivery.ticket``; returns what happened."""
    if not store.holds(delivery):
        return "stale"  # a duplicate task, or one whose lease ran out and was sent again
    key = record_key(delivery)
    record = store.record(key)
    url = record.get("webhook_url", "")
    if not url:
        store.settle(delivery, key, None)
        return "no-target"
    tenant = record.get("tenant", "")
    disabled = store.disabled_reason(tenant, url)
    if disabled is not None:
        log.warning("webhook %s skipped: %s is disabled (%s)", delivery.msg_id, url, disabled)
        store.settle(delivery, key, None, webhook_status=f"skipped: endpoint disabled ({disabled})")
        return "skipped"
    try:
        check_target(url, settings.webhook_allow_hosts)
    except UnsafeWebhookTarget as e:
        store.settle(delivery, key, None, webhook_status=f"refused: {e}")
        return "refused"
    try:
        body = _payload(delivery.kind, record)
    except Exception as e:  # a record that cannot be a payload never will be: do not retry
        why = f"payload cannot be serialised ({type(e).__name__}: {e})"
        log.error("webhook %s for %s %s failed: %s", delivery.msg_id, delivery.kind,
                  delivery.obj_id, why)  # fmt: skip
        store.settle(delivery, key, None, webhook_status=f"failed: {why}")
        return "unserialisable"
    receiver = receiver_of(url)
    if not SLOTS.try_acquire(receiver):
        store.settle(delivery, key, time.time() + random.uniform(*BUSY_RECEIVER_WAIT))
        return "deferred"
    try:
        attempt = int(store.r.hincrby(key, "webhook_attempts", 1))
        code, error, retry_after = None, "", None
        try:
            secret = secret_for(settings, tenant)
            code, retry_after = _post(url, body, delivery.msg_id, secret, settings.webhook_timeout)
        except httpx.HTTPError as e:
            error = f"{type(e).__name__}: {e}"
        except Exception as e:  # a bug must cost an attempt, not the delivery
            log.exception("webhook %s: attempt %d raised", delivery.msg_id, attempt)
            error = f"{type(e).__name__}: {e}"
    finally:
        SLOTS.release(receiver)
    decision = decide(attempt, settings.webhook_retry_schedule, code, error, retry_after)
    return _record(store, delivery, key, attempt, decision, tenant, url)


def _record(
    store: WebhookStore,
    delivery: Delivery,
    key: str,
    attempt: int,
    decision: Decision,
    tenant: str,
    url: str,
) -> str:
    if decision.verdict is Verdict.DISABLED:
        store.disable(tenant, url, decision.reason)
        log.warning("webhook endpoint %s of tenant %r disabled: %s", url, tenant, decision.reason)
    next_due = time.time() + decision.delay if decision.delay is not None else None
    deadline = time.monotonic() + SETTLE_RETRY_SECONDS
    while True:  # Redis may be restarting: the outcome is worth waiting for
        try:
            won = store.settle(delivery, key, next_due, webhook_status=decision.status)
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    if not won:
        log.warning("webhook %s: attempt %d outlived its lease; outcome dropped",
                    delivery.msg_id, attempt)  # fmt: skip
    elif decision.verdict is Verdict.RETRY:
        log.info("webhook %s for %s: %s; retry %d in %.1fs", delivery.msg_id, delivery.obj_id,
                 decision.reason, attempt, decision.delay)  # fmt: skip
    elif decision.verdict is Verdict.FAILED:
        log.warning("webhook %s for %s failed after %d attempts: %s", delivery.msg_id,
                    delivery.obj_id, attempt, decision.reason)  # fmt: skip
    return decision.verdict.value


@celery_app.task(name="tide.deliver_webhook", ignore_result=True)
def deliver_webhook(obj_id: str, msg_id: str, kind: str = "job", ticket: int = 0) -> str:
    """One attempt at one delivery, sent by the dispatcher with its ticket."""
    store = default_store()
    delivery = Delivery(kind, obj_id, msg_id, ticket)
    if not ticket:  # a message from a sender that did not know the schedule yet
        store.schedule(delivery)
        return "scheduled"
    return attempt_delivery(store, get_settings(), delivery)
