"""A real `tide up` for the live tests: started with a test's flags and short leases (a killed
worker's jobs go back to the queue within seconds), its log printed when the test fails,
stopped with SIGINT after; and the checks those tests share on the jobs they submit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

from tests.conftest import ROOT, wait_for
from tests.service.procs import descendants
from tide_fleet.infra.fleet.local_fleet import wait_ready
from tide_fleet.infra.fleet.redis_server import free_port
from tide_fleet.infra.wire.protocol import Keys

# Leases of 2 s, reaped every 0.3 s, heartbeats every 0.5 s; one torch thread per process.
SHORT_LEASES = {"TIDE_LEASE_SECONDS": "2", "TIDE_REAPER_INTERVAL": "0.3",
                "TIDE_WORKER_HEARTBEAT_SECONDS": "0.5", "OMP_NUM_THREADS": "1"}  # fmt: skip
WORKER = "tide_fleet.infra.cli worker"


@dataclass
class LiveUp:
    proc: subprocess.Popen[bytes]
    url: str
    data: Path  # TIDE_DATA_DIR
    log: Path

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url((self.data / "redis.url").read_text())

    def workers(self) -> list[int]:
        """The pids of the `tide worker` processes it runs now."""
        return [p for p, cmd in descendants(self.proc.pid).items() if WORKER in cmd]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> str:
        """Ctrl-C, as a user stops it: asserts it exits 0 within 120 s; returns its log."""
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=120)
        assert self.proc.returncode == 0, self.log_text()[-2000:]
        return self.log_text()


@contextmanager
def tide_up(
    tmp_path: Path, *flags: str, ready_s: float = 120, env: dict[str, str] | None = None
) -> Iterator[LiveUp]:
    """`tide -v up --port P *flags` (its own embedded Redis, data under tmp_path; ``env``
    added to its environment), once its gateway is ready. A failure inside prints the end
    of its log; SIGINT stops it after, unless the test has already stopped it (``stop``)."""
    port = free_port()
    data = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TIDE_DATA_DIR": str(data), **SHORT_LEASES,
           **(env or {})}  # fmt: skip
    env.pop("REDIS_URL", None)
    argv = [sys.executable, "-m", "tide_fleet.infra.cli", "-v", "up", "--port", str(port), *flags]
    log = tmp_path / "up.log"
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    live = LiveUp(proc, f"http://127.0.0.1:{port}", data, log)
    try:
        wait_ready(live.url, timeout=ready_s)
        yield live
    except BaseException:
        print(live.log_text()[-8000:])  # shown by pytest on failure
        raise
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def wait_ended(api: httpx.Client, jobs: Iterable[str], timeout: float) -> dict[str, dict]:
    """Each job's record once none is queued or in progress."""
    ids = list(jobs)

    def ended() -> dict[str, dict] | None:
        got = {j: api.get(f"/v1/jobs/{j}").json() for j in ids}
        running = any(g["status"] in ("queued", "in_progress") for g in got.values())
        return None if running else got

    return wait_for(ended, timeout, interval=0.5, what="every job to end")


def done_statuses(r: redis.Redis, job_id: str) -> list[bytes]:
    """The status of each `done` event in the job's event stream: [b"completed"] for a job
    that completed once."""
    return [f[b"status"] for _, f in r.xrange(Keys.events(job_id)) if f.get(b"type") == b"done"]
