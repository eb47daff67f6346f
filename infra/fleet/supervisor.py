"""What ``tide up`` starts, kept alive: restart with back-off, give up after too many.

Each child is a name and a function that starts it and returns its process. ``check()``
(called every half second) restarts a child that died, after a back-off that doubles
with each restart (RESTART_FIRST_S up to RESTART_MAX_S); a child that dies more than
MAX_RESTARTS times within RESTART_WINDOW_S is given up on, and ``check()`` says so, so
``tide up`` stops the rest and exits non-zero. Threads (the controller) are supervised
the same way through a process-like wrapper.

Every child process is started with a parent-death signal (``setpriv --pdeathsig``
where util-linux has it): if ``tide up`` itself is killed, its children get SIGTERM
instead of living on as orphans.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("tide.up")

RESTART_FIRST_S = 0.5
RESTART_MAX_S = 10.0
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0


def orphan_safe(argv: list[str]) -> list[str]:
    """argv that dies with its parent (SIGTERM on parent death) where the OS allows it."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--", *argv] if setpriv else list(argv)


def spawn(
    argv: list[str],
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    log_file: Path | None = None,
    **popen: Any,
) -> subprocess.Popen[bytes]:
    """Start a child process that dies with its parent (orphan_safe); with `log_file`, its
    stdout and stderr are appended to that file. Every Tide child starts here; `popen` goes
    to subprocess.Popen as it is (e.g. `start_new_session`)."""
    if log_file is None:
        return subprocess.Popen(orphan_safe(argv), env=env, cwd=cwd, **popen)
    with open(log_file, "ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            orphan_safe(argv), env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, **popen
        )


class ThreadProc:
    """A thread that looks like a process to the supervisor (poll/returncode)."""

    def __init__(self, target: Callable[[], Any], name: str) -> None:
        self.returncode: int | None = None
        self.error: BaseException | None = None

        def body() -> None:
            try:
                target()
                self.returncode = 0
            except BaseException as e:  # reported by the supervisor, not swallowed
                self.error = e
                self.returncode = 1
                log.exception("tide up: %s failed", name)

        self.thread = threading.Thread(target=body, name=name, daemon=True)
        self.thread.start()

    def poll(self) -> int | None:
        return None if self.thread.is_alive() else (self.returncode or 0)


@dataclass
class Child:
    name: str
    start: Callable[[], Any]  # returns a Popen (or a ThreadProc)
    proc: Any = None
    deaths: deque[float] = field(default_factory=deque)
    restart_at: float | None = None
    restarts: int = 0


class Supervisor:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.children: dict[str, Child] = {}
        self.clock = clock
        self.gave_up: str | None = None  # why, once it has

    def add(self, name: str, start: Callable[[], Any]) -> Any:
        child = Child(name, start)
        child.proc = start()
        self.children[name] = child
        return child.proc

    def proc(self, name: str) -> Any:
        return self.children[name].proc

    def check(self) -> bool:
        """Restart what died (when its back-off is over); False once it gave up."""
        now = self.clock()
        for child in self.children.values():
            if child.restart_at is None:
                code = child.proc.poll()
                if code is None:
                    continue
                while child.deaths and now - child.deaths[0] > RESTART_WINDOW_S:
                    child.deaths.popleft()
                child.deaths.append(now)
                if len(child.deaths) > MAX_RESTARTS:
                    self.gave_up = (
                        f"{child.name} exited with {code} {len(child.deaths)} times within "
                        f"{RESTART_WINDOW_S:g} s; giving up"
                    )
                    print(f"tide up: {self.gave_up}", flush=True)
                    return False
                delay = min(RESTART_MAX_S, RESTART_FIRST_S * 2 ** (len(child.deaths) - 1))
                child.restart_at = now + delay
                print(f"tide up: {child.name} exited with {code}; restarting in {delay:g} s",
                      flush=True)  # fmt: skip
            elif now >= child.restart_at:
                try:
                    child.proc = child.start()
                    child.restarts += 1
                    child.restart_at = None
                    print(f"tide up: {child.name} restarted", flush=True)
                except Exception as e:  # counts as another death, after the back-off
                    log.warning("tide up: restarting %s failed: %s", child.name, e)
                    child.proc = _Dead()
                    child.restart_at = None
        return True

    def stop(self, names: list[str], timeout: float = 30.0) -> None:
        """SIGTERM the named processes, then wait (SIGKILL after timeout)."""
        procs = [self.children[n].proc for n in names if n in self.children]
        procs = [p for p in procs if isinstance(p, subprocess.Popen)]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()


class _Dead:
    """A start that failed: dead at once, so the next check schedules another try."""

    def poll(self) -> int:
        return 1
