"""What a `tide doctor` rule says (a Finding), the thresholds it judges by, and the small
arithmetic every rule shares. Pure and torch-free."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tide_fleet.infra.doctor.scrape import Scrape, histogram_quantile


@dataclass
class Finding:
    rule: str
    title: str
    subject: str  # what it is about: a worker, a (model, bucket), a model's workers, the gateway
    evidence: dict[str, Any]
    knob: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Thresholds:
    kv_low: float = 0.5  # KV usage below this is "plenty of room"
    kv_full: float = 0.9
    mbu_high: float = 0.5
    mfu_low: float = 0.15
    ttft_high_s: float = 1.0
    itl_ok_s: float = 0.25
    cold_latency_s: float = 10.0  # queue-time p99 this high with an idle fleet: cold starts
    cpu_saturated: float = 0.85  # cores one gateway process spends (it is single-threaded)
    min_samples: int = 5  # histogram observations needed before judging a quantile


def quantile(buckets: dict[float, float], q: float, th: Thresholds) -> float | None:
    """A histogram's q-quantile, once it holds at least `th.min_samples` observations."""
    count = max(buckets.values(), default=0.0)
    return histogram_quantile(q, buckets) if count >= th.min_samples else None


def gauge(scrape: Scrape, name: str) -> float:
    return scrape.total(name) or 0.0


def rounded(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def whose(model: str, what: str) -> str:
    """A subject about a model's part of the fleet: "workers of 'b'", or "workers"."""
    return f"{what} of {model!r}" if model else what
