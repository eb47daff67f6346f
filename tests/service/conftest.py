"""A real local fleet for end-to-end tests: embedded Redis, uvicorn gateway, worker
processes, the Celery webhook worker and the reaper, all as child processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import redis

from tests.conftest import (
    ROOT,
    wait_for,
)
from tide_fleet.infra.fleet.redis_server import EmbeddedRedis, free_port

SECRET = "whsec_" + "dGVzdC13ZWJob29rLXNlY3JldC1mb3ItdGlkZS0xMjM0NQ=="
KEYS = {"key-a": "tenant-a", "key-b": "tenant-b"}
AUTH = {"Authorization": "Bearer key-a"}


# The fleet's services, restarted when they die (Fleet._supervise); not its workers.
SUPERVISED = ("gateway", "webhooks", "reaper")


class Fleet:
    def __init__(self, tmp: Path, model: Path) -> None:
        self.tmp = tmp
        self.redis = EmbeddedRedis(tmp / "redis")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = model
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.argv: dict[str, list[str]] = {}
        self.env: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def start(self) -> Fleet:
        self.redis.start()
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "REDIS_URL": self.redis.url,
            "TIDE_MODEL": str(self.model),
            "TIDE_API_KEYS": json.dumps(KEYS),
            "TIDE_WEBHOOK_SECRETS": json.dumps({"*": SECRET}),
            "TIDE_WEBHOOK_ALLOW_HOSTS": json.dumps(["127.0.0.1"]),
            "TIDE_WEBHOOK_RETRY_SCHEDULE": json.dumps([0.3, 0.3, 0.3]),
            "TIDE_BUCKET_SHORT_MAX": "64",
            "TIDE_BUCKET_MEDIUM_MAX": "256",
            "TIDE_LEASE_SECONDS": "2",
            "TIDE_REAPER_INTERVAL": "0.3",
            "TIDE_DRAIN_TIMEOUT": "30",
            "TIDE_DATA_DIR": str(self.tmp / "data"),
            "TIDE_BATCH_POLL_INTERVAL": "0.3",
            "TIDE_BATCH_RETRY_SECONDS": "3",
            "OMP_NUM_THREADS": "1",
        }
        py = sys.executable
        self.spawn("gateway", [py, "-m", "uvicorn", "tide_fleet.gateway.app:app",
                               "--port", str(self.port), "--log-level", "warning"])  # fmt: skip
        for i in range(2):
            self.spawn_worker(f"worker-{i}")
        celery = [py, "-m", "celery", "-A", "tide_fleet.infra.jobs.celery_app:celery_app", "worker",
                  "-Q", "tide.webhooks,tide.batches", "--loglevel=WARNING", "--without-heartbeat",
                  "--without-gossip", "--without-mingle"]  # fmt: skip
        self.spawn("webhooks", celery)
        self.spawn("reaper", [py, "-m", "tide_fleet.infra.cli", "reaper"])
        self.wait_ready()
        threading.Thread(target=self._supervise, name="fleet-supervisor", daemon=True).start()
        return self

    def _supervise(self) -> None:
        """Restart a service that died, as `tide up`'s supervisor (or systemd) does in a
        real deployment. Needed for Celery: kombu 5.7's Redis transport can die on a Redis
        restart ("Unrecoverable error: AttributeError: 'NoneType' object has no attribute
        'hostname'", in restore_unacked while closing the lost channel), and with no one to
        restart it every later batch in the package stayed "validating". Workers are the
        tests' to kill and are not restarted here."""
        while not self._stopping.wait(0.5):
            with self._lock:
                for name in SUPERVISED:
                    proc = self.procs.get(name)
                    if proc is not None and proc.poll() is not None:
                        with open(self.tmp / f"{name}.log", "a") as log:  # say so in its log
                            log.write(f"[test fleet] exited with {proc.returncode}; restarted\n")
                        self.spawn(name, self.argv[name])

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - lives with the process
        proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.procs[name], self.argv[name] = proc, argv
        return proc

    def kill_and_restart(self, name: str) -> subprocess.Popen[bytes]:
        """kill -9 a process of the fleet and start it again."""
        with self._lock:
            self.procs[name].kill()
            self.procs[name].wait()
            return self.spawn(name, self.argv[name])

    def spawn_worker(self, name: str, *extra: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "tide_fleet.infra.cli", "worker", "--dtype", "float32",
                "--max-num-seqs", "4", *extra]  # fmt: skip
        return self.spawn(name, argv)

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        client = redis.Redis.from_url(self.redis.url)
        while time.monotonic() < deadline:
            try:
                ready = httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200
                if ready and client.zcard("tide:workers") >= 2:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"fleet not ready; logs in {self.tmp}")

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            pass  # a restart under way has finished
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.redis.stop()


# A plain chat template that also renders tools (stories260K ships none): the fleet's model
# answers /v1/chat/completions, and tools requests find a template that uses them.
CHAT_TEMPLATE = (
    "{% if tools %}Tools: {{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture(scope="package")
def fleet_model(tiny_path, tmp_path_factory) -> Path:
    """stories260K when ../shared has it (real text), else dummy:tiny; copied with a chat
    template added."""
    from tests.conftest import STORIES

    source = STORIES if (STORIES / "model.safetensors").is_file() else tiny_path
    folder = tmp_path_factory.mktemp("fleet-model") / source.name
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("llama2c"))
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    config_path.write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE}))
    return folder


@pytest.fixture(scope="package")
def fleet(tmp_path_factory, fleet_model) -> Iterator[Fleet]:
    f = Fleet(tmp_path_factory.mktemp("fleet"), fleet_model)
    try:
        yield f.start()
    finally:
        f.stop()


@pytest.fixture
def api(fleet) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fleet.url, headers=AUTH, timeout=30) as client:
        yield client


@pytest.fixture
def fleet_redis(fleet) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(fleet.redis.url)
    yield client
    client.close()


class Receiver:
    """A local webhook receiver; answers each delivery with the next scripted status."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.statuses = list(statuses or [])
        self.calls: list[tuple[dict[str, str], bytes]] = []
        self.truncated = 0  # requests whose body ended before content-length
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["content-length"])
                body = self.rfile.read(length)
                if len(body) < length:  # the sender died mid-request: no delivery, no answer
                    receiver.truncated += 1
                    self.close_connection = True
                    return
                receiver.calls.append(({k.lower(): v for k, v in self.headers.items()}, body))
                code = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(code)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def wait_done(api: httpx.Client, job_id: str, timeout: float = 60) -> dict:
    def done():  # type: ignore[no-untyped-def]
        job = api.get(f"/v1/jobs/{job_id}").json()
        return job if job["status"] not in ("queued", "in_progress") else None

    return wait_for(done, timeout)
