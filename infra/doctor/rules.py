"""`tide doctor`'s diagnosis: rules over two metric snapshots taken a few seconds apart.

Pure and torch-free: `diagnose(before, after, interval_s)` reads parsed Prometheus text
(the gateway's, the controller's and each worker's /metrics) and returns findings, each
with the numbers that triggered it and the knob to turn. The rules about queues and the
workers taking from them are judged per served model (infra/doctor/queue_rules.py), those
about what limits throughput per worker, model or gateway (infra/doctor/bottleneck_rules.py).
Collecting the snapshots (HTTP, Redis) is infra/doctor/collect.py's job;
docs/observability.md explains every rule.
"""

from __future__ import annotations

from tide_fleet.infra.doctor.bottleneck_rules import (
    bandwidth_bound,
    gateway_cpu_saturated,
    kv_bound,
    prefill_starvation,
)
from tide_fleet.infra.doctor.findings import Finding, Thresholds
from tide_fleet.infra.doctor.queue_rules import admission_too_tight, cold_starts, unserved_bucket
from tide_fleet.infra.doctor.snapshot import Snapshot

__all__ = ["RULES", "Finding", "Thresholds", "diagnose"]

RULES = (
    unserved_bucket,
    admission_too_tight,
    kv_bound,
    bandwidth_bound,
    prefill_starvation,
    cold_starts,
    gateway_cpu_saturated,
)


def diagnose(
    before: Snapshot, after: Snapshot, interval_s: float, th: Thresholds | None = None
) -> list[Finding]:
    """Every rule over the two snapshots; an empty list means nothing looks wrong."""
    if interval_s <= 0:
        raise ValueError(f"interval_s must be positive, got {interval_s}")
    th = th or Thresholds()
    findings: list[Finding] = []
    for rule in RULES:
        findings.extend(rule(before, after, interval_s, th))
    return findings
