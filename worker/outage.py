"""A worker's view of its Redis link: up, or down since when and when to try again.

Reconnection backs off exponentially with full jitter (so a fleet of workers does not
reconnect in lockstep when Redis comes back), from BACKOFF_FIRST_S up to BACKOFF_MAX_S.
A worker starts "down": its first loop turn connects, so one started before Redis waits
for it instead of dying in its constructor.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

log = logging.getLogger("tide_fleet.worker.service")

BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 5.0


class Outage:
    def __init__(self, worker_id: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.worker_id = worker_id
        self.clock = clock
        self.down_since: float | None = clock()
        self.retry_at = 0.0  # the first attempt is at once
        self.attempts = 0
        self.started = False  # connected at least once
        self.outages = 0  # ended outages, for tests and logs

    @property
    def is_down(self) -> bool:
        return self.down_since is not None

    def waiting(self) -> bool:
        """Down, and the next attempt is not due yet."""
        return self.is_down and self.clock() < self.retry_at

    def until_retry(self) -> float:
        return max(0.0, self.retry_at - self.clock())

    def failed(self, error: BaseException, held: int) -> None:
        now = self.clock()
        if self.down_since is None:
            self.down_since = now
            self.attempts = 0
            log.warning(
                "worker %s: Redis unavailable (%s); generating the %d jobs held, "
                "reconnecting with back-off", self.worker_id, error, held,
            )  # fmt: skip
        elif self.attempts == 0 and not self.started:
            log.warning("worker %s: waiting for Redis (%s)", self.worker_id, error)
        self.attempts += 1
        ceiling = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** min(self.attempts, 16))
        self.retry_at = now + random.uniform(BACKOFF_FIRST_S, ceiling)

    def recovered(self, held: int) -> None:
        if self.down_since is None:
            return
        if self.started:
            self.outages += 1
            log.warning(
                "worker %s: Redis back after %.1f s; %d jobs held, results written",
                self.worker_id, self.clock() - self.down_since, held,
            )  # fmt: skip
        self.started = True
        self.down_since = None
        self.attempts = 0
