"""When a job must be done by, and how long it may wait: ``deadline``, ``completion_window``
and ``ttl``, shared by the job API, the OpenAI routes (as Tide extensions) and batch lines.

The record gets ``deadline`` (unix seconds: the queue takes a job with one before those
without, earliest first) and ``expire_at`` (the deadline, or created_at + ttl, whichever is
sooner): a job not started by then ends as ``expired`` (infra/wire/expiry_scripts.py).
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import BaseModel, Field

from tide_fleet.infra.jobs.errors import bad_request
from tide_fleet.infra.jobs.fields import Text

MAX_WAIT_SECONDS = 7 * 24 * 3600  # the longest deadline, window or ttl a job may ask
WINDOW = re.compile(r"^(\d+)([smh])$")
TIMING_FIELDS = ("deadline", "completion_window", "ttl")


def parse_window(window: str, field: str = "completion_window") -> int:
    """'24h' (OpenAI's form), or any N s|m|h, N at least 1; seconds."""
    m = WINDOW.match(window)
    if not m or int(m.group(1)) < 1:
        raise ValueError(f"{field}: expected a duration like '24h', '1h' or '30m', got {window!r}")
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


class TimingFields(BaseModel):
    deadline: float | None = Field(
        None, strict=True, allow_inf_nan=False,
        description="unix seconds: start it by then or it expires; earliest deadline first",
    )  # fmt: skip
    completion_window: Text | None = Field(
        None, description="relative deadline: '24h', '1h', '30m' (not with deadline)"
    )
    ttl: int | None = Field(
        None, strict=True, description="seconds it may wait unstarted before it expires"
    )

    def timing(self) -> dict[str, Any]:
        """The fields given, to pass on to the job body."""
        return {k: getattr(self, k) for k in TIMING_FIELDS if getattr(self, k) is not None}


def job_timing(body: TimingFields, now: float, deadline: float | None = None) -> dict[str, float]:
    """The record's `deadline`, `ttl` and `expire_at` (each only when set); `deadline`: an
    outer one (a batch's window end), kept when sooner than the body's. Raises a 400
    naming the field and the limit."""
    limit = f"at most {MAX_WAIT_SECONDS} seconds ({MAX_WAIT_SECONDS // 86400} days) ahead"
    own = body.deadline
    if own is not None and body.completion_window is not None:
        raise bad_request("completion_window", "give deadline or completion_window, not both")
    if own is not None:
        if not math.isfinite(own) or own <= now:
            raise bad_request("deadline", f"{own} is not in the future (now is {now:.0f})")
        if own > now + MAX_WAIT_SECONDS:
            raise bad_request("deadline", f"{own} is too far: {limit}")
    if body.completion_window is not None:
        try:
            window = parse_window(body.completion_window)
        except ValueError as e:
            raise bad_request("completion_window", str(e).split(": ", 1)[1]) from None
        if window > MAX_WAIT_SECONDS:
            raise bad_request("completion_window", f"{body.completion_window!r} is {limit}"
                              .replace("is at most", "too long: at most"))  # fmt: skip
        own = now + window
    if body.ttl is not None and not 0 < body.ttl <= MAX_WAIT_SECONDS:
        raise bad_request("ttl", f"{body.ttl}: from 1 to {MAX_WAIT_SECONDS} seconds")
    if deadline is not None:
        own = deadline if own is None else min(own, deadline)
    out: dict[str, float] = {}
    if own is not None:
        out["deadline"] = own
    if body.ttl is not None:
        out["ttl"] = body.ttl
    ends = [t for t in (own, now + body.ttl if body.ttl is not None else None) if t is not None]
    if ends:
        out["expire_at"] = min(ends)
    return out
