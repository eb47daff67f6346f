"""An exclusive lock on a file that lives only as long as the process holding it.

``held(path, wait_s)`` takes ``fcntl.flock`` on ``path``: the kernel drops the lock when
the holder exits or is killed, so no file left behind can block anyone (torch's own build
lock is a file that merely exists, and outlives a killed build). The holder writes its
pid into the file so that a waiter can say whom it waits for. A wait is bounded: past
``wait_s`` it raises ``TimeoutError`` and the caller decides what to do without the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

POLL_S = 0.2
# A wait shorter than this is a sibling loading what is built (tensor-parallel ranks start
# together) and goes unsaid; past it, the waiter says whom it waits for.
QUIET_S = 2.0


@contextlib.contextmanager
def held(path: Path, wait_s: float) -> Iterator[None]:
    """Hold the lock on ``path`` for the block; TimeoutError after ``wait_s`` of waiting."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _acquire(fd, path, wait_s)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def holder(path: Path) -> str:
    """Who holds the lock on ``path``, as its holder recorded it ("pid 123")."""
    try:
        pid = path.read_text().strip()
    except OSError:
        pid = ""
    return f"pid {pid}" if pid.isdigit() else "an unknown process"


def _acquire(fd: int, path: Path, wait_s: float) -> None:
    start = time.monotonic()
    deadline = start + wait_s
    waiting = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{path} still held by {holder(path)} after {wait_s:g} s")
        if not waiting and time.monotonic() - start >= QUIET_S:
            log.warning("waiting up to %g s for %s, held by %s", wait_s, path, holder(path))
            waiting = True
        time.sleep(POLL_S)
