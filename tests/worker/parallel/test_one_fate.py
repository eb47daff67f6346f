"""One worker, one fate: when a rank dies or a step hangs, every rank and rank 0's process
end (exit code EXIT_RANKS_LOST), and a rank never outlives rank 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tide_fleet.worker.engine.ranks import EXIT_RANKS_LOST

ROOT = Path(__file__).resolve().parents[3]


def start(stories_path: Path, **env: str) -> tuple[subprocess.Popen[str], int]:
    """The looping two-rank engine, and rank 1's pid once it serves."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("tp_loop.py")), str(stories_path)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, **env},
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail(f"the engine did not start (exit {proc.wait()})")
    return proc, json.loads(line)["pids"][0]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited
        return f.read().split(") ")[1][0] != "Z"


def wait_gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_a_rank_killed_mid_run_ends_the_worker(stories_path):
    proc, rank1 = start(stories_path)
    time.sleep(1.0)  # steps running
    os.kill(rank1, signal.SIGKILL)
    assert proc.wait(timeout=20) == EXIT_RANKS_LOST


def test_a_hung_rank_ends_the_worker_after_the_step_timeout(stories_path):
    """A rank stopped (SIGSTOP) inside a step: rank 0 waits in a collective, and its
    watchdog ends both after TIDE_TP_STEP_TIMEOUT_S."""
    proc, rank1 = start(stories_path, TIDE_TP_STEP_TIMEOUT_S="2")
    time.sleep(1.0)
    os.kill(rank1, signal.SIGSTOP)
    try:
        assert proc.wait(timeout=30) == EXIT_RANKS_LOST
        assert wait_gone(rank1, 5), "the stopped rank outlived the worker"
    finally:
        if alive(rank1):
            os.kill(rank1, signal.SIGKILL)


def spawned_child(parent: int, within_s: float) -> int:
    """The pid of a rank the process ``parent`` spawned, as soon as there is one."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().split(") ")[1].split()[1])
                cmdline = (entry / "cmdline").read_bytes()
            except (OSError, IndexError, ValueError):
                continue
            if ppid == parent and b"spawn_main" in cmdline:
                return int(entry.name)
        time.sleep(0.02)
    pytest.fail(f"no rank spawned by {parent} within {within_s} s")


def test_a_rank_killed_while_starting_ends_the_worker(stories_path):
    """Rank 1 killed before it joins the group: rank 0, waiting for it in the rendezvous,
    does not wait for good; the worker ends within the start-up grace."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("tp_loop.py")), str(stories_path)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        os.kill(spawned_child(proc.pid, 30), signal.SIGKILL)
        assert proc.wait(timeout=60) == EXIT_RANKS_LOST
    finally:
        if proc.poll() is None:
            proc.kill()


def test_rank_zero_killed_takes_the_other_ranks_with_it(stories_path):
    proc, rank1 = start(stories_path)
    time.sleep(1.0)
    proc.kill()
    proc.wait(timeout=10)
    assert wait_gone(rank1, 10), "rank 1 outlived rank 0"
