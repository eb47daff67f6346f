"""What to do after one webhook attempt, per Standard Webhooks' guidance. Pure: no I/O.

2xx is delivered. 410 Gone disables the endpoint. Anything else (another status, a
timeout, a refused connection) is retried after the next delay of the schedule, jittered
so that receivers recovering from an outage are not hit by every sender at once; on 429
and 503 a ``Retry-After`` (seconds or an HTTP date) is honoured, up to a cap.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

RETRY_JITTER = 0.2  # each delay is drawn from [d × (1 − j), d × (1 + j)]
RETRY_AFTER_MAX_SECONDS = 3600.0  # a receiver cannot park a delivery for longer than this
RETRY_AFTER_STATUSES = (429, 503)


class Verdict(enum.StrEnum):
    DELIVERED = "delivered"
    RETRY = "retrying"
    FAILED = "failed"  # retries exhausted
    DISABLED = "disabled"  # the endpoint answered 410 Gone


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str
    delay: float | None = None  # seconds until the next attempt, for RETRY

    @property
    def status(self) -> str:
        """The job's ``webhook_status`` after this decision."""
        if self.verdict is Verdict.DELIVERED:
            return "delivered"
        return f"{self.verdict.value}: {self.reason}"


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait per a ``Retry-After`` value (seconds or an HTTP date); None if unusable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(tz=UTC))).total_seconds())


def jittered(delay: float, rng: random.Random | None = None) -> float:
    return delay * (rng or random).uniform(1 - RETRY_JITTER, 1 + RETRY_JITTER)


def retry_delay(
    attempt: int,
    schedule: list[float],
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> float | None:
    """Seconds before the retry after failed ``attempt`` (1-based); None when retries are spent.

    A receiver's ``Retry-After`` is a lower bound: the delay is never shorter than it
    (capped at ``RETRY_AFTER_MAX_SECONDS``), and jitter only lengthens it.
    """
    if attempt > len(schedule):
        return None
    delay = jittered(schedule[attempt - 1], rng)
    if retry_after is not None:
        floor = min(retry_after, RETRY_AFTER_MAX_SECONDS)
        delay = max(delay, floor * (rng or random).uniform(1, 1 + RETRY_JITTER))
    return delay


def decide(
    attempt: int,
    schedule: list[float],
    status_code: int | None,
    error: str = "",
    retry_after: str | None = None,
    rng: random.Random | None = None,
) -> Decision:
    """The decision after ``attempt``: an HTTP status, or ``error`` when there was no answer."""
    if status_code is not None and 200 <= status_code < 300:
        return Decision(Verdict.DELIVERED, f"HTTP {status_code}")
    if status_code == 410:
        return Decision(Verdict.DISABLED, "endpoint answered 410 Gone")
    reason = f"HTTP {status_code}" if status_code is not None else error
    wait = parse_retry_after(retry_after) if status_code in RETRY_AFTER_STATUSES else None
    delay = retry_delay(attempt, schedule, wait, rng)
    if delay is None:
        return Decision(Verdict.FAILED, reason)
    return Decision(Verdict.RETRY, reason, delay)
