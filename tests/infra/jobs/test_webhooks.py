"""Webhook delivery parts: the SSRF guard, the retry policy, the durable schedule, one attempt.

The schedule tests run on the embedded Redis; end-to-end delivery with a Celery worker
and local receivers is in tests/service/test_webhook_delivery.py.
"""

from __future__ import annotations

import json
import logging
import random
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from tide_fleet.infra.jobs.webhook_dispatcher import dispatch_due
from tide_fleet.infra.jobs.webhook_policy import (
    RETRY_AFTER_MAX_SECONDS,
    RETRY_JITTER,
    Verdict,
    decide,
    parse_retry_after,
    retry_delay,
)
from tide_fleet.infra.jobs.webhook_store import Delivery, WebhookStore
from tide_fleet.infra.jobs.webhooks import (
    ReceiverSlots,
    UnsafeWebhookTarget,
    attempt_delivery,
    check_target,
    enqueue_webhook,
    receiver_of,
)
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire.protocol import Keys

LEASE = 30.0


# -- the SSRF guard ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "100.64.0.1",  # shared address space (carrier-grade NAT): not private, not global
        "100.127.255.254",
        "10.0.0.8",
        "127.0.0.1",
        "169.254.169.254",
        "192.0.2.1",  # documentation
        "198.18.0.1",  # benchmarking
        "0.0.0.0",
        "240.0.0.1",
        "224.0.0.1",
        "[::1]",
        "[fc00::1]",
        "[fe80::1]",
        "[::ffff:10.0.0.1]",
        "[64:ff9b::a00:1]",  # NAT64 of 10.0.0.1
        "[2002:a00:1::]",  # 6to4 of 10.0.0.1
    ],
)
def test_check_target_refuses_every_non_global_address(host):
    with pytest.raises(UnsafeWebhookTarget, match="non-public address"):
        check_target(f"http://{host}/hook", [])


@pytest.mark.parametrize("host", ["8.8.8.8", "[2606:4700:4700::1111]", "[::ffff:8.8.8.8]"])
def test_check_target_accepts_global_addresses(host):
    check_target(f"https://{host}/hook", [])


def test_check_target_allow_list_still_wins():
    check_target("http://100.64.0.1/hook", ["100.64.0.1"])
    check_target("http://127.0.0.1:9/hook", ["127.0.0.1"])
    with pytest.raises(UnsafeWebhookTarget, match="http"):
        check_target("ftp://8.8.8.8/hook", [])


# -- the retry policy ----------------------------------------------------------------------


def test_retry_after_seconds_and_http_dates():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after(" 120 ") == 120.0
    assert parse_retry_after(format_datetime(now + timedelta(seconds=30), usegmt=True), now) == 30
    assert parse_retry_after(format_datetime(now - timedelta(seconds=30), usegmt=True), now) == 0
    for unusable in (None, "", "soon", "-1", "1.5"):
        assert parse_retry_after(unusable, now) is None


def test_retry_delays_are_jittered_within_bounds():
    rng = random.Random(7)
    schedule = [10.0, 60.0]
    for attempt, base in enumerate(schedule, start=1):
        delays = [retry_delay(attempt, schedule, rng=rng) for _ in range(2000)]
        assert all(base * (1 - RETRY_JITTER) <= d <= base * (1 + RETRY_JITTER) for d in delays)
        assert max(delays) - min(delays) > base * RETRY_JITTER  # spread, not one value
    assert retry_delay(3, schedule, rng=rng) is None


def test_retry_after_is_a_lower_bound_and_capped():
    rng = random.Random(3)
    delays = [retry_delay(1, [1.0], retry_after=5.0, rng=rng) for _ in range(1000)]
    assert all(5.0 <= d <= 5.0 * (1 + RETRY_JITTER) for d in delays)
    assert all(d >= 5.0 for d in (retry_delay(1, [20.0], 5.0, rng) for _ in range(100)))
    capped = retry_delay(1, [1.0], retry_after=10 * RETRY_AFTER_MAX_SECONDS, rng=rng)
    assert RETRY_AFTER_MAX_SECONDS <= capped <= RETRY_AFTER_MAX_SECONDS * (1 + RETRY_JITTER)


def test_decide_follows_standard_webhooks():
    schedule = [1.0]
    assert decide(1, schedule, 204).status == "delivered"
    gone = decide(1, schedule, 410)
    assert gone.verdict is Verdict.DISABLED
    assert gone.status == "disabled: endpoint answered 410 Gone"
    assert decide(1, schedule, 429, retry_after="30").delay >= 30
    assert decide(1, schedule, 503, retry_after="30").delay >= 30
    assert decide(1, schedule, 500, retry_after="30").delay <= 1.0 * (1 + RETRY_JITTER)
    timeout = decide(1, schedule, None, "ReadTimeout: timed out")
    assert timeout.status == "retrying: ReadTimeout: timed out"
    assert decide(2, schedule, 500).status == "failed: HTTP 500"


def test_receiver_slots_bound_each_receiver_alone():
    slots = ReceiverSlots(2)
    a, b = receiver_of("http://A.example/x"), receiver_of("http://a.example:80/y")
    assert a == b == "http://a.example:80"
    assert slots.try_acquire(a) and slots.try_acquire(a) and not slots.try_acquire(a)
    assert slots.try_acquire(receiver_of("https://a.example/x"))  # another receiver
    slots.release(a)
    assert slots.try_acquire(a)


# -- the durable schedule ------------------------------------------------------------------


def test_claim_leases_and_only_the_ticket_holder_settles(redis_client):
    store = WebhookStore(redis_client, LEASE)
    redis_client.hset("tide:job:j1", mapping={"id": "j1"})
    store.schedule(Delivery("job", "j1", "msg_j1_completed"))
    now = time.time()
    (first,) = store.claim_due(now)
    assert (first.kind, first.obj_id, first.ticket) == ("job", "j1", 1)
    assert store.claim_due(now + LEASE - 1) == []  # leased
    store.schedule(Delivery("job", "j1", "msg_j1_completed"))  # a second enqueue: no reset
    assert store.claim_due(now + 1) == []
    (second,) = store.claim_due(now + LEASE + 1)  # the task was lost: sent again
    assert second.ticket == 2 and not store.holds(first) and store.holds(second)
    assert not store.settle(first, "tide:job:j1", None, webhook_status="delivered")
    assert store.settle(second, "tide:job:j1", now + 5, webhook_status="retrying: HTTP 500")
    assert redis_client.zscore(Keys.webhooks_due, "msg_j1_completed") == pytest.approx(now + 5)
    assert store.settle(second, "tide:job:j1", None, webhook_status="delivered")
    assert store.pending() == 0
    assert not redis_client.exists(Keys.webhook("msg_j1_completed"))
    assert redis_client.hget("tide:job:j1", "webhook_status") == b"delivered"


def test_settle_never_creates_a_record_that_expired(redis_client):
    store = WebhookStore(redis_client, LEASE)
    store.schedule(Delivery("job", "gone", "msg_gone_completed"))
    (d,) = store.claim_due()
    assert store.settle(d, "tide:job:gone", None, webhook_status="delivered")
    assert not redis_client.exists("tide:job:gone")


def test_dispatch_sends_each_due_delivery_once(redis_client):
    store = WebhookStore(redis_client, LEASE)
    for i in range(250):
        enqueue_webhook(f"j{i}", "completed", client=redis_client)
    sent: list[Delivery] = []
    assert dispatch_due(store, sent.append) == 250
    assert len({d.msg_id for d in sent}) == 250
    assert dispatch_due(store, sent.append) == 0


# -- one attempt ---------------------------------------------------------------------------


def _job(redis_client, job_id: str, url: str, metadata: str = "") -> None:
    now = time.time()
    redis_client.hset(f"tide:job:{job_id}", mapping={
        "id": job_id, "tenant": "t", "status": "completed", "bucket": "short",
        "priority": "interactive", "created_at": now, "webhook_url": url, "metadata": metadata,
    })  # fmt: skip


def test_an_unserialisable_payload_fails_once_loudly(redis_client, caplog):
    settings = Settings(redis_url="redis://unused", webhook_allow_hosts=["127.0.0.1"])
    store = WebhookStore(redis_client, LEASE)
    # What a gateway that lets a lone surrogate through would store (json.dumps escapes it).
    _job(redis_client, "j1", "http://127.0.0.1:9/hook", json.dumps({"note": "\udfff"}))
    enqueue_webhook("j1", "completed", client=redis_client)
    (delivery,) = store.claim_due()
    with caplog.at_level(logging.ERROR, logger="tide_fleet.infra.jobs.webhooks"):
        assert attempt_delivery(store, settings, delivery) == "unserialisable"
    status = redis_client.hget("tide:job:j1", "webhook_status").decode()
    assert status.startswith("failed: payload cannot be serialised (PydanticSerializationError")
    assert "msg_j1_completed" in caplog.text and "cannot be serialised" in caplog.text
    assert store.pending() == 0, "not retried"
    assert not redis_client.hget("tide:job:j1", "webhook_attempts")


def test_a_disabled_endpoint_is_skipped_with_its_reason(redis_client):
    settings = Settings(redis_url="redis://unused", webhook_allow_hosts=["127.0.0.1"])
    store = WebhookStore(redis_client, LEASE)
    url = "http://127.0.0.1:9/hook"
    store.disable("t", url, "endpoint answered 410 Gone")
    _job(redis_client, "j2", url)
    _job(redis_client, "j3", url.replace(":9", ":10"))  # another endpoint: not skipped
    enqueue_webhook("j2", "completed", client=redis_client)
    (delivery,) = store.claim_due()
    assert attempt_delivery(store, settings, delivery) == "skipped"
    status = redis_client.hget("tide:job:j2", "webhook_status").decode()
    assert status.startswith("skipped: endpoint disabled (endpoint answered 410 Gone at ")
    assert store.disabled_reason("other-tenant", url) is None
    assert store.enable("t", url) and store.disabled_reason("t", url) is None
