"""`tide up` supervises what it starts: kill -9 of its Redis, gateway or Celery process is
followed by a restart and the fleet serves again; SIGINT to `tide up` alone stops the
whole tree; a child that keeps dying makes `tide up` give up and exit non-zero."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, wait_for
from tests.service.procs import descendants, find
from tide_fleet.infra.fleet.local_fleet import wait_ready
from tide_fleet.infra.fleet.redis_server import free_port

pytestmark = pytest.mark.slow


def start_up(
    tmp_path: Path, model: Path, port: int, sigint_ignored: bool = False
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TIDE_DATA_DIR": str(tmp_path / "data")}
    env.pop("REDIS_URL", None)
    argv = [sys.executable, "-m", "tide_fleet.infra.cli", "up", "--workers", "1",
            "--port", str(port),
            "--model", str(model)]  # fmt: skip
    log = open(tmp_path / "up.log", "wb")  # noqa: SIM115 - lives with the process
    if sigint_ignored:
        # As a shell without job control starts `cmd &`: SIGINT ignored, which the exec'd
        # Python inherits (it then installs no KeyboardInterrupt handler of its own).
        argv = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def completes(url: str) -> bool:
    try:
        job = httpx.post(f"{url}/v1/jobs", json={"prompt": "hi", "max_tokens": 4}, timeout=5)
        job_id = job.json()["id"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = httpx.get(f"{url}/v1/jobs/{job_id}", timeout=5).json()
            if got["status"] not in ("queued", "in_progress"):
                return bool(got["status"] == "completed")
            time.sleep(0.1)
    except (httpx.HTTPError, KeyError, ValueError):
        return False
    return False


def sigint_stops_the_tree(up: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGINT to `tide up` alone (not its process group): it exits 0 and every process it
    started is gone."""
    tree = descendants(up.pid)
    os.kill(up.pid, signal.SIGINT)
    assert up.wait(timeout=timeout) == 0
    deadline = time.monotonic() + 30
    while [p for p in tree if Path(f"/proc/{p}").exists()] and time.monotonic() < deadline:
        time.sleep(0.1)
    left = {p: c for p, c in tree.items() if Path(f"/proc/{p}/cmdline").exists()}
    assert not left, f"processes outlived tide up: {left}"


def kill_tree(up: subprocess.Popen[bytes]) -> None:
    """After a failure: kill -9 whatever `tide up` still runs, then tide up."""
    if up.poll() is None:
        for pid in descendants(up.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        up.kill()


def test_kill_9_of_each_child_is_survived_and_sigint_stops_the_tree(tmp_path, tiny_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    up = start_up(tmp_path, tiny_path, port)
    try:
        wait_ready(url, timeout=120)
        wait_for(lambda: completes(url), 90, what="a first job")
        worker = wait_for(
            lambda: find(up.pid, "tide_fleet.infra.cli worker"), 30, what="the worker"
        )
        for needle in ("uvicorn", "celery", "redis-server"):
            victim = wait_for(lambda n=needle: find(up.pid, n), 30, what=needle)
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda n=needle, v=victim: (p := find(up.pid, n)) and p != v, 60,
                     what=f"{needle} restarted")  # fmt: skip
            wait_for(lambda: completes(url), 90, what=f"a job after killing {needle}")
            assert up.poll() is None, f"tide up exited after kill -9 of {needle}"
        # The worker rode out the Redis restart: same process.
        assert find(up.pid, "tide_fleet.infra.cli worker") == worker
        sigint_stops_the_tree(up, timeout=120)
    finally:
        kill_tree(up)
        print((tmp_path / "up.log").read_text()[-4000:])


def test_sigint_stops_a_tide_up_started_with_sigint_ignored(tmp_path, tiny_path):
    """`tide up &` from a script (or `make test` run in the background) inherits SIGINT
    ignored; Ctrl-C's signal must still stop the tree, not be dropped."""
    port = free_port()
    up = start_up(tmp_path, tiny_path, port, sigint_ignored=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, timeout=120)
        wait_for(lambda: completes(url), 90, what="a first job")
        assert find(up.pid, "tide_fleet.infra.cli worker"), "the worker is in the tree that must go"
        sigint_stops_the_tree(up, timeout=60)
    finally:
        kill_tree(up)
        print((tmp_path / "up.log").read_text()[-4000:])


def test_tide_up_gives_up_and_exits_non_zero_when_a_child_keeps_dying(tmp_path, tiny_path):
    with socket.socket() as taken:  # the gateway's port is taken: uvicorn dies every time
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        up = start_up(tmp_path, tiny_path, port)
        try:
            code = up.wait(timeout=180)
        finally:
            if up.poll() is None:
                up.kill()
    log = (tmp_path / "up.log").read_text()
    assert code != 0, log[-3000:]
    assert "giving up" in log and "gateway" in log, log[-3000:]
