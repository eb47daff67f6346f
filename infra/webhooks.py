"""Signed webhook delivery (Standard Webhooks) as a Celery task on the Redis broker.

The same ``webhook-id`` is sent on every retry of one event, so receivers can
deduplicate; attempts are recorded on the job. Targets on private, loopback or
link-local addresses are refused unless allow-listed (SSRF guard).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from datetime import UTC, datetime
from urllib.parse import urlsplit

import httpx
import redis
from standardwebhooks import Webhook

from infra.celery_app import WEBHOOK_QUEUE, celery_app
from infra.protocol import Keys
from infra.schemas import job_public
from infra.settings import Settings, get_settings

log = logging.getLogger(__name__)


class UnsafeWebhookTarget(ValueError):
    pass


def check_target(url: str, allow_hosts: list[str]) -> None:
    """Refuse URLs that resolve to private, loopback, link-local or reserved addresses."""
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
        if ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_reserved or ip.is_multicast:
            raise UnsafeWebhookTarget(
                f"webhook.url host {host!r} resolves to {ip}, a non-public address; "
                "allow-list it in TIDE_WEBHOOK_ALLOW_HOSTS to use it"
            )


def secret_for(settings: Settings, tenant: str) -> str:
    return settings.webhook_secrets.get(tenant) or settings.webhook_secrets["*"]


def event_id(obj_id: str, status: str) -> str:
    return f"msg_{obj_id}_{status}"


def _payload(kind: str, record: dict[str, str]) -> str:
    if kind == "batch":
        import json

        from infra.batches import public_batch

        return json.dumps(public_batch(record))
    return job_public(record).model_dump_json()


@celery_app.task(bind=True, name="tide.deliver_webhook", max_retries=None)
def deliver_webhook(self, obj_id: str, msg_id: str, kind: str = "job") -> str:  # type: ignore[no-untyped-def]
    """POST the job (or batch) object, signed; retried on the configured schedule."""
    settings = get_settings()
    client = redis.Redis.from_url(settings.redis_url)
    key = Keys.batch(obj_id) if kind == "batch" else Keys.job(obj_id)
    record = {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
    if not record or not record.get("webhook_url"):
        return "no-target"
    url = record["webhook_url"]
    body = _payload(kind, record)
    attempt = client.hincrby(key, "webhook_attempts", 1)
    try:
        check_target(url, settings.webhook_allow_hosts)
        signer = Webhook(secret_for(settings, record.get("tenant", "")))
        now = datetime.now(tz=UTC)
        signature = signer.sign(msg_id, now, body)
        headers = {
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": signature,
            "content-type": "application/json",
        }
        response = httpx.post(url, content=body, headers=headers, timeout=settings.webhook_timeout)
        if 200 <= response.status_code < 300:
            client.hset(key, mapping={"webhook_status": "delivered"})
            return "delivered"
        reason = f"HTTP {response.status_code}"
    except UnsafeWebhookTarget as e:
        client.hset(key, mapping={"webhook_status": f"refused: {e}"})
        return "refused"
    except httpx.HTTPError as e:
        reason = f"{type(e).__name__}: {e}"
    schedule = settings.webhook_retry_schedule
    if attempt > len(schedule):
        client.hset(key, mapping={"webhook_status": f"failed: {reason}"})
        return "failed"
    client.hset(key, mapping={"webhook_status": f"retrying: {reason}"})
    log.info("webhook %s for %s: %s; retry in %ss", msg_id, obj_id, reason, schedule[attempt - 1])
    raise self.retry(countdown=schedule[attempt - 1], args=(obj_id, msg_id, kind))


def enqueue_webhook(obj_id: str, status: str, kind: str = "job") -> None:
    """Schedule delivery of a terminal-state event (a no-op task if there is no URL)."""
    deliver_webhook.apply_async(args=(obj_id, event_id(obj_id, status), kind), queue=WEBHOOK_QUEUE)
