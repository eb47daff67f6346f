"""One Prometheus /metrics text, parsed: samples by name, and the arithmetic on them.

Pure and torch-free; `tide doctor` (infra/doctor/rules.py) and the metrics tests read
scrapes through it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

Labels = dict[str, str]


@dataclass
class Scrape:
    """One target's samples, by sample name (`x_total`, `x_bucket`, ...)."""

    samples: dict[str, list[tuple[Labels, float]]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Scrape:
        samples: dict[str, list[tuple[Labels, float]]] = defaultdict(list)
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples[s.name].append((dict(s.labels), float(s.value)))
        return cls(dict(samples))

    def total(self, name: str, **match: str) -> float | None:
        """Sum of the samples whose labels match; None when the series is absent."""
        rows = [v for labels, v in self.samples.get(name, []) if _matches(labels, match)]
        return sum(rows) if rows else None

    def by_label(self, name: str, label: str) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for labels, v in self.samples.get(name, []):
            out[labels.get(label, "")] += v
        return dict(out)

    def by_labels(self, name: str, *labels: str) -> dict[tuple[str, ...], float]:
        """Sums by the values of several labels (a missing label reads as '')."""
        out: dict[tuple[str, ...], float] = defaultdict(float)
        for sample_labels, v in self.samples.get(name, []):
            out[tuple(sample_labels.get(label, "") for label in labels)] += v
        return dict(out)

    def buckets(self, name: str) -> dict[float, float]:
        """A histogram's cumulative counts by upper bound, summed over its label sets."""
        out: dict[float, float] = defaultdict(float)
        for labels, v in self.samples.get(f"{name}_bucket", []):
            out[float(labels["le"])] += v
        return dict(out)


def _matches(labels: Labels, match: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in match.items())


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus's estimate: linear within the bucket holding the q-th observation."""
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in ordered:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le
