"""Webhook delivery against a real Celery worker on an embedded Redis, with local receivers.

No gateway or engine: each test writes a finished job record, as a worker does, and asks
for its webhook. What is measured is the sender: isolation between receivers, Standard
Webhooks' retry guidance, and a retry schedule that survives a Redis kill -9.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis

from tests.conftest import ROOT, wait_for
from tests.service.conftest import SECRET
from tide_fleet.infra.fleet.redis_server import EmbeddedRedis
from tide_fleet.infra.jobs.webhooks import enqueue_webhook

pytestmark = pytest.mark.slow

WEBHOOK_TIMEOUT = 10.0


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False  # hold the request until the receiver closes


class ScriptedReceiver:
    """Answers each POST with the next scripted reply (then 200) and records when it came."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.calls: list[tuple[float, dict[str, str], bytes]] = []
        self.released = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.calls.append((time.monotonic(), headers, body))
                reply = receiver.replies.pop(0) if receiver.replies else Reply()
                if reply.hang:
                    receiver.released.wait(60)
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()


class Sender:
    """An embedded Redis and one Celery worker with the app's own pool configuration."""

    def __init__(self, tmp: Path, schedule: list[float]) -> None:
        self.tmp = tmp
        self.redis = EmbeddedRedis(tmp / "redis")
        self.schedule = schedule
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Sender:
        self.redis.start()
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "REDIS_URL": self.redis.url,
            "TIDE_WEBHOOK_SECRETS": json.dumps({"*": SECRET}),
            "TIDE_WEBHOOK_ALLOW_HOSTS": json.dumps(["127.0.0.1"]),
            "TIDE_WEBHOOK_RETRY_SCHEDULE": json.dumps(self.schedule),
            "TIDE_WEBHOOK_TIMEOUT": str(WEBHOOK_TIMEOUT),
            "TIDE_DATA_DIR": str(self.tmp / "data"),
        }
        # The command line `tide up` and the fleet tests use: pool and concurrency come
        # from the app's configuration, not from flags.
        argv = [sys.executable, "-m", "celery", "-A",
                "tide_fleet.infra.jobs.celery_app:celery_app", "worker",
                "-Q", "tide.webhooks,tide.batches", "--loglevel=INFO", "--without-heartbeat",
                "--without-gossip", "--without-mingle"]  # fmt: skip
        log = open(self.tmp / "celery.log", "ab")  # noqa: SIM115 - lives with the process
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        warmup = ScriptedReceiver()
        try:
            self.send(self.job(warmup.url))
            wait_for(lambda: warmup.calls, timeout=60)
        finally:
            warmup.close()
        return self

    @property
    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis.url, decode_responses=True)

    def job(self, url: str, metadata: dict[str, str] | None = None) -> str:
        """A completed job record, as a worker leaves it."""
        job_id = f"job_{uuid.uuid4().hex[:12]}"
        now = time.time()
        record = {
            "id": job_id, "tenant": "tenant-a", "status": "completed", "bucket": "short",
            "priority": "interactive", "prompt_tokens": 3, "max_tokens": 4, "created_at": now,
            "queued_at": now, "finished_at": now, "text": "once", "finish_reason": "length",
            "attempts": 1, "webhook_url": url,
            "metadata": json.dumps(metadata) if metadata else "",
        }  # fmt: skip
        with redis.Redis.from_url(self.redis.url) as client:
            client.hset(f"tide:job:{job_id}", mapping=record)
        return job_id

    def send(self, job_id: str) -> None:
        with redis.Redis.from_url(self.redis.url) as client:
            enqueue_webhook(job_id, "completed", client=client)

    def webhook(self, job_id: str) -> tuple[str | None, int]:
        with self.client as client:
            status, attempts = client.hmget(
                f"tide:job:{job_id}", "webhook_status", "webhook_attempts"
            )
        return status, int(attempts or 0)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.redis.stop()


@pytest.fixture(scope="module")
def sender(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sender]:
    s = Sender(tmp_path_factory.mktemp("webhook-sender"), schedule=[0.5, 0.5, 0.5])
    try:
        yield s.start()
    finally:
        s.stop()


def test_webhook_to_a_hanging_receiver_delays_no_other_receiver(sender):
    hanging = ScriptedReceiver(*[Reply(hang=True) for _ in range(16)])
    good = ScriptedReceiver()
    try:
        stuck = [sender.job(hanging.url) for _ in range(8)]  # more than a receiver's share
        for job_id in stuck:
            sender.send(job_id)
        wait_for(lambda: hanging.calls, timeout=10)
        job_id = sender.job(good.url)
        sent = time.monotonic()
        sender.send(job_id)
        wait_for(lambda: good.calls, timeout=WEBHOOK_TIMEOUT)
        delay = good.calls[0][0] - sent
        assert delay < 2.0, f"the good receiver waited {delay:.2f}s"
        assert wait_for(lambda: sender.webhook(job_id)[0] == "delivered", timeout=5)
        assert all(sender.webhook(j)[0] is None for j in stuck), "still pending"
        print(f"good receiver's webhook after {delay * 1000:.0f} ms while another hangs")
    finally:
        hanging.close()
        good.close()


def test_410_disables_the_endpoint_for_later_events(sender):
    gone = ScriptedReceiver(Reply(410))
    try:
        first = sender.job(gone.url)
        sender.send(first)
        wait_for(lambda: (sender.webhook(first)[0] or "").startswith("disabled"), timeout=10)
        second = sender.job(gone.url)
        sender.send(second)
        status = wait_for(lambda: sender.webhook(second)[0], timeout=10)
        assert status.startswith("skipped") and "410" in status
        assert len(gone.calls) == 1, "a disabled endpoint got another request"
        assert sender.webhook(first)[1] == 1
    finally:
        gone.close()


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_honoured(sender, status):
    busy = ScriptedReceiver(Reply(status, {"Retry-After": "2"}))
    try:
        job_id = sender.job(busy.url)
        sender.send(job_id)
        wait_for(lambda: sender.webhook(job_id)[0] == "delivered", timeout=15)
        (first, h1, _), (second, h2, _) = busy.calls
        assert second - first >= 2.0, f"retried after {second - first:.2f}s, asked for 2s"
        assert second - first < 4.0
        assert h1["webhook-id"] == h2["webhook-id"]
        assert sender.webhook(job_id)[1] == 2
    finally:
        busy.close()


def test_retries_are_jittered_and_exhaust_to_failed(sender):
    failing = ScriptedReceiver(*[Reply(500) for _ in range(4)])
    try:
        job_id = sender.job(failing.url)
        sender.send(job_id)
        status = wait_for(lambda: (sender.webhook(job_id)[0] or "").startswith("failed") and
                          sender.webhook(job_id)[0], timeout=15)  # fmt: skip
        assert status == "failed: HTTP 500"
        assert len(failing.calls) == 4 and sender.webhook(job_id)[1] == 4
        gaps = [b[0] - a[0] for a, b in zip(failing.calls, failing.calls[1:], strict=False)]
        assert all(0.5 * 0.8 - 0.05 <= g <= 0.5 * 1.2 + 0.5 for g in gaps), gaps
    finally:
        failing.close()


def test_unserialisable_payload_fails_clearly_instead_of_vanishing(sender):
    receiver = ScriptedReceiver()
    try:
        job_id = sender.job(receiver.url, metadata={"note": "\udfff"})
        sender.send(job_id)
        status = wait_for(lambda: sender.webhook(job_id)[0], timeout=10)
        assert status.startswith("failed: payload cannot be serialised"), status
        time.sleep(1.0)
        assert not receiver.calls and sender.webhook(job_id)[0] == status
    finally:
        receiver.close()


def test_a_scheduled_retry_survives_a_redis_kill_9(tmp_path):
    s = Sender(tmp_path, schedule=[4.0, 4.0]).start()
    receiver = ScriptedReceiver(Reply(500))
    try:
        job_id = s.job(receiver.url)
        s.send(job_id)
        wait_for(lambda: s.webhook(job_id)[0] == "retrying: HTTP 500", timeout=10)
        first = receiver.calls[0][0]
        time.sleep(1.5)  # past the AOF's once-a-second fsync
        s.redis.kill()
        s.redis.start()
        wait_for(lambda: len(receiver.calls) >= 2, timeout=30)
        gap = receiver.calls[1][0] - first
        assert 4.0 * 0.8 <= gap < 4.0 * 1.2 + 5.0, f"retried {gap:.1f}s after the first attempt"
        assert wait_for(lambda: s.webhook(job_id) == ("delivered", 2), timeout=5)
        print(f"retry ran {gap:.1f}s after the first attempt, across a Redis kill -9")
    finally:
        receiver.close()
        s.stop()
