"""A worker's cold start: from its process starting to its serving the first job.

The cold start a user waits through is the worker's launch (the controller's decision and
the spawn, or an instance boot on AWS), then this: Python and torch imports, loading the
weights, the profiling run that sizes the KV pool. The process start is read from Linux's
/proc (its start tick against the system uptime, 10 ms resolution), so the imports count;
elsewhere it is when this module was first imported.
"""

from __future__ import annotations

import os
import time

_IMPORTED_AT = time.time()


def process_started_at() -> float:
    """Unix time this process started (Linux /proc), else when this module was imported."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime
        started = time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return _IMPORTED_AT
    return min(started, _IMPORTED_AT)


class Boot:
    """When this worker started and when it became ready to serve."""

    def __init__(self) -> None:
        self.started_at = process_started_at()
        self.ready_at: float | None = None

    def ready(self) -> float:
        """Mark it ready (once); returns the cold start in seconds."""
        if self.ready_at is None:
            self.ready_at = time.time()
        return self.seconds or 0.0

    @property
    def seconds(self) -> float | None:
        return None if self.ready_at is None else round(self.ready_at - self.started_at, 3)

    def waited_for(self, queued_at: float) -> float | None:
        """The cold start a job queued at `queued_at` waited through: this worker's, when the
        job was queued before the process started (it waited for a worker to be launched)."""
        if not queued_at or queued_at >= self.started_at:
            return None
        return self.seconds
