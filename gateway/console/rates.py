"""Arrival rates per (model, bucket) from the monotonic counters of infra/wire/backlog.py.

Each fleet reading adds one point; a rate is the change over the last WINDOW_SECONDS (at
least MIN_SPAN_SECONDS apart, else unknown). Kept in the gateway process, bounded by time.
"""

from __future__ import annotations

from collections import deque

WINDOW_SECONDS = 30.0
MIN_SPAN_SECONDS = 2.0
MIN_STEP_SECONDS = 0.5  # many pages polling at once add at most two points a second

Key = tuple[str, str]  # (served model name, bucket)


class ArrivalRates:
    def __init__(self) -> None:
        self._points: dict[Key, deque[tuple[float, int, int]]] = {}

    def update(self, now: float, key: Key, jobs: int, tokens: int) -> tuple[float, float] | None:
        """(jobs/s, tokens/s) of one model's bucket over the window, or None while it is too
        short."""
        points = self._points.setdefault(key, deque())
        if points and jobs < points[-1][1]:
            points.clear()  # the counters were reset (a new Redis)
        if not points or now - points[-1][0] >= MIN_STEP_SECONDS:
            points.append((now, jobs, tokens))
        while len(points) > 2 and now - points[1][0] >= WINDOW_SECONDS:
            points.popleft()
        t0, jobs0, tokens0 = points[0]
        span = now - t0
        if span < MIN_SPAN_SECONDS:
            return None
        return (jobs - jobs0) / span, (tokens - tokens0) / span
