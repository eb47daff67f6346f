"""The supervisor behind `tide up`: restart with back-off, give up after too many deaths."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tide_fleet.infra.fleet import supervisor as sv
from tide_fleet.infra.fleet.supervisor import Supervisor, ThreadProc


class FakeProc:
    def __init__(self) -> None:
        self.code: int | None = None

    def poll(self) -> int | None:
        return self.code


def test_a_dead_child_is_restarted_after_a_doubling_back_off():
    now = [0.0]
    started: list[FakeProc] = []

    def start() -> FakeProc:
        started.append(FakeProc())
        return started[-1]

    sup = Supervisor(clock=lambda: now[0])
    sup.add("gateway", start)
    assert sup.check() and len(started) == 1
    started[-1].code = -9  # kill -9
    assert sup.check() and len(started) == 1  # back-off first
    now[0] += sv.RESTART_FIRST_S
    assert sup.check() and len(started) == 2 and sup.children["gateway"].restarts == 1
    started[-1].code = 1
    sup.check()
    now[0] += sv.RESTART_FIRST_S  # the second death waits twice as long
    sup.check()
    assert len(started) == 2
    now[0] += sv.RESTART_FIRST_S
    sup.check()
    assert len(started) == 3


def test_it_gives_up_after_too_many_deaths_within_the_window():
    now = [0.0]
    sup = Supervisor(clock=lambda: now[0])
    procs: list[FakeProc] = []

    def start() -> FakeProc:
        procs.append(FakeProc())
        procs[-1].code = 1  # dies at once, every time
        return procs[-1]

    sup.add("webhooks", start)
    results = []
    for _ in range(200):
        results.append(sup.check())
        if not results[-1]:
            break
        now[0] += 1.0
    assert results[-1] is False and sup.gave_up and "webhooks" in sup.gave_up
    assert len(procs) == sv.MAX_RESTARTS + 1


def test_deaths_far_apart_never_give_up():
    now = [0.0]
    sup = Supervisor(clock=lambda: now[0])
    procs: list[FakeProc] = []
    sup.add("redis", lambda: procs.append(FakeProc()) or procs[-1])
    for _ in range(3 * sv.MAX_RESTARTS):
        procs[-1].code = -9
        assert sup.check()
        now[0] += sv.RESTART_WINDOW_S  # one death a minute: weather
        assert sup.check()
    assert sup.gave_up is None


def test_a_crashed_thread_is_reported_dead():
    def boom() -> None:
        raise RuntimeError("controller crashed")

    t = ThreadProc(boom, "controller")
    t.thread.join(5)
    assert t.poll() == 1 and isinstance(t.error, RuntimeError)


def test_a_child_does_not_outlive_a_parent_killed_with_9():
    code = (
        "import subprocess, sys, time; from tide_fleet.infra.fleet.supervisor import orphan_safe; "
        "p = subprocess.Popen(orphan_safe(['sleep', '60'])); print(p.pid, flush=True); "
        "time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    # setpriv sets the parent-death signal and then execs the command: kill the parent only
    # once `sleep` runs (before that, under load, the signal may not be armed yet).
    deadline = time.monotonic() + 10
    while _cmdline(child)[:1] != ["sleep"] and time.monotonic() < deadline:
        time.sleep(0.01)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the child outlived its parent"


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [Path(a.decode()).name for a in f.read().split(b"\0") if a]
    except FileNotFoundError:
        return []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie (init reaps it) is gone
    except FileNotFoundError:
        return False
