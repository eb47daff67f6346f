"""`tide doctor`'s diagnosis: rules over two metric snapshots taken a few seconds apart.

Pure and torch-free: `diagnose(before, after, interval_s)` reads parsed Prometheus text
(the gateway's, the controller's and each worker's /metrics) and returns findings, each
with the numbers that triggered it and the knob to turn. Collecting the snapshots (HTTP,
Redis) is infra/doctor/collect.py's job; docs/observability.md explains every rule.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from infra.doctor.scrape import Scrape, histogram_quantile
from infra.doctor.snapshot import (
    Snapshot,
    counter_increase,
    histogram_counts,
    oldest_age,
    queue_jobs,
    served_buckets,
    worker_increase,
)


@dataclass
class Finding:
    rule: str
    title: str
    subject: str  # what it is about: a worker, a bucket, the gateway
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


def _q(buckets: dict[float, float], q: float, th: Thresholds) -> float | None:
    count = max(buckets.values(), default=0.0)
    return histogram_quantile(q, buckets) if count >= th.min_samples else None


def _g(scrape: Scrape, name: str) -> float:
    return scrape.total(name) or 0.0


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


# -- the rules ---------------------------------------------------------------------------------


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


def unserved_bucket(b: Snapshot, a: Snapshot, dt: float, th: Thresholds) -> list[Finding]:
    served = served_buckets(a)
    out = []
    for bucket, jobs in sorted(queue_jobs(a).items()):
        if jobs > 0 and bucket not in served:
            evidence = {
                "queued_jobs": jobs,
                "oldest_job_age_s": _r(oldest_age(a).get(bucket)),
                "workers": len(a.worker_info),
                "served_buckets": sorted(served),
            }
            out.append(
                Finding(
                    "unserved_bucket",
                    f"jobs wait in bucket {bucket!r} and no live worker serves it",
                    bucket,
                    evidence,
                    f"start workers for {bucket!r}: a pool whose buckets include it in fleet.toml "
                    "(min_workers > 0 avoids scale-from-zero waits), or `tide worker --buckets`",
                )
            )
    return out


def admission_too_tight(b: Snapshot, a: Snapshot, dt: float, th: Thresholds) -> list[Finding]:
    served = served_buckets(a) if a.worker_info else set(queue_jobs(a))  # unserved: its own rule
    before_q = sum(v for k, v in queue_jobs(b).items() if k in served)
    after_q = sum(v for k, v in queue_jobs(a).items() if k in served)
    if not a.workers or after_q <= before_q or after_q < 1:
        return []
    kv = {w: _g(s, "tide:kv_cache_usage_perc") for w, s in a.workers.items()}
    slots = {
        w: (_g(s, "tide:num_requests_running"), _g(s, "tide:engine_max_num_seqs"))
        for w, s in a.workers.items()
    }
    if max(kv.values()) >= th.kv_low or any(r >= m for r, m in slots.values()):
        return []
    evidence = {
        "queued_jobs_before": before_q,
        "queued_jobs_after": after_q,
        "queue_growth_per_s": round((after_q - before_q) / dt, 3),
        "kv_cache_usage_max": round(max(kv.values()), 3),
        "running_per_worker": {w: f"{r:g}/{m:g}" for w, (r, m) in slots.items()},
    }
    return [
        Finding(
            "admission_too_tight",
            "the queue grows while workers have free slots and KV room",
            "workers",
            evidence,
            "workers take a job only when engine.can_admit() accepts it: raise --max-num-seqs and "
            "--max-num-batched-tokens, check --kv-cache-memory is not tiny, and check the pools "
            "serve the growing buckets; if all that is fine, add workers (pool min_workers)",
        )
    ]


def kv_bound(b: Snapshot, a: Snapshot, dt: float, th: Thresholds) -> list[Finding]:
    out = []
    for w, s in sorted(a.workers.items()):
        kv = _g(s, "tide:kv_cache_usage_perc")
        then = b.workers[w].total("tide:num_preemptions_total") if w in b.workers else None
        preempted = counter_increase(then, s.total("tide:num_preemptions_total"))
        if kv >= th.kv_full and preempted > 0:
            evidence = {
                "kv_cache_usage_perc": round(kv, 3),
                "preemptions": preempted,
                "preemptions_per_s": round(preempted / dt, 3),
                "running": _g(s, "tide:num_requests_running"),
                "max_num_seqs": _g(s, "tide:engine_max_num_seqs"),
            }
            out.append(
                Finding(
                    "kv_bound",
                    "KV cache full: requests are preempted and recomputed",
                    w,
                    evidence,
                    "lower --max-num-seqs, keep prefix caching on (shared prompts cost one copy), "
                    "give the KV pool more memory (--kv-cache-memory), or add capacity (more "
                    "workers, or a bigger-memory pool for this bucket)",
                )
            )
    return out


def bandwidth_bound(b: Snapshot, a: Snapshot, dt: float, th: Thresholds) -> list[Finding]:
    out = []
    for w, s in sorted(a.workers.items()):
        mbu, mfu = s.total("tide:mbu_ema"), s.total("tide:mfu_ema")
        if mbu is None or mfu is None or mbu < th.mbu_high or mfu > th.mfu_low:
            continue
        then = b.workers.get(w, Scrape())
        steps = counter_increase(
            then.total("tide:iteration_tokens_total_count"),
            s.total("tide:iteration_tokens_total_count"),
        )
        tokens = counter_increase(
            then.total("tide:iteration_tokens_total_sum"),
            s.total("tide:iteration_tokens_total_sum"),
        )
        evidence = {
            "mbu_ema": round(mbu, 3),
            "mfu_ema": round(mfu, 3),
            "tokens_per_step": round(tokens / steps, 1) if steps else None,
            "running": _g(s, "tide:num_requests_running"),
            "max_num_seqs": _g(s, "tide:engine_max_num_seqs"),
        }
        out.append(
            Finding(
                "bandwidth_bound",
                "decode is memory-bandwidth-bound: each step re-reads the weights for few tokens",
                w,
                evidence,
                "batch more sequences per step (raise --max-num-seqs; fewer, fuller workers per "
                "pool), or move fewer bytes: quantised weights and KV cache (fp8/int8)",
            )
        )
    return out


def prefill_starvation(b: Snapshot, a: Snapshot, dt: float, th: Thresholds) -> list[Finding]:
    ttft = histogram_counts(b, a, "tide:time_to_first_token_seconds", window=True)
    itl = histogram_counts(b, a, "tide:inter_token_latency_seconds", window=True)
    ttft99, itl99 = _q(ttft, 0.99, th), _q(itl, 0.99, th)
    if ttft99 is None or itl99 is None or ttft99 < th.ttft_high_s or itl99 > th.itl_ok_s:
        return []
    prefill = histogram_counts(b, a, "tide:request_prefill_time_seconds", window=True)
    budgets = {int(_g(s, "tide:engine_max_num_batched_tokens")) for s in a.workers.values()}
    evidence = {
        "ttft_p50_s": _r(_q(ttft, 0.5, th)),
        "ttft_p99_s": _r(ttft99),
        "itl_p99_s": _r(itl99),
        "prefill_time_p99_s": _r(_q(prefill, 0.99, th)),
        "requests": max(ttft.values(), default=0),
        "max_num_batched_tokens": sorted(budgets),
    }
    return [
        Finding(
            "prefill_starvation",
            "first tokens are slow while decoding is fast: prefills wait behind decodes",
            "workers",
            evidence,
            "prefill chunks get the step budget decodes leave: raise --max-num-batched-tokens "
            "(bigger chunks) or lower --max-num-seqs; route long prompts to their own pool "
            "(bucket_short_max / bucket_medium_max and each pool's buckets)",
        )
    ]


def cold_starts(b: Snapshot, a: Snapshot, dt: float, th: Thresholds) -> list[Finding]:
    queued = sum(queue_jobs(b).values()) + sum(queue_jobs(a).values())
    if not a.workers or queued > 0 or (not queue_jobs(a) and not queue_jobs(b)):
        return []
    running = sum(_g(s, "tide:num_requests_running") for s in a.workers.values())
    generated = worker_increase(b, a, "tide:generation_tokens_total")
    wait = histogram_counts(b, a, "tide:request_queue_time_seconds", window=False)
    wait99 = _q(wait, 0.99, th)
    if running > 0 or generated > 0 or wait99 is None or wait99 < th.cold_latency_s:
        return []
    e2e = histogram_counts(b, a, "tide:e2e_request_latency_seconds", window=False)
    starts = (s.total("process_start_time_seconds") for s in a.workers.values())
    ages = [a.at - t for t in starts if t]
    evidence = {
        "queued_jobs": 0,
        "running": running,
        "workers": len(a.workers),
        "queue_time_p99_s": _r(wait99),
        "queue_time_p50_s": _r(_q(wait, 0.5, th)),
        "e2e_p99_s": _r(_q(e2e, 0.99, th)),
        "youngest_worker_age_s": _r(min(ages), 1) if ages else None,
    }
    return [
        Finding(
            "cold_starts",
            "the fleet is idle now, yet jobs waited long: they waited for workers to start",
            "pools",
            evidence,
            "keep workers warm: raise the pool's min_workers or idle_s in fleet.toml, or a "
            "warm_pool_size of pre-initialised instances on AWS",
        )
    ]


def gateway_cpu_saturated(b: Snapshot, a: Snapshot, dt: float, th: Thresholds) -> list[Finding]:
    if a.gateway is None or b.gateway is None:
        return []
    cpu = (
        counter_increase(
            b.gateway.total("process_cpu_seconds_total"),
            a.gateway.total("process_cpu_seconds_total"),
        )
        / dt
    )
    if cpu < th.cpu_saturated:
        return []
    requests = counter_increase(
        b.gateway.total("tide:gateway_requests_total"),
        a.gateway.total("tide:gateway_requests_total"),
    )
    evidence = {"cpu_cores_used": round(cpu, 3), "requests_per_s": round(requests / dt, 1)}
    return [
        Finding(
            "gateway_cpu_saturated",
            "the gateway spends a whole core: tokenising prompts is the bottleneck",
            "gateway",
            evidence,
            "run more gateway processes (uvicorn --workers N, or more replicas behind the load "
            "balancer); each one tokenises every prompt it accepts",
        )
    ]


RULES = (
    unserved_bucket,
    admission_too_tight,
    kv_bound,
    bandwidth_bound,
    prefill_starvation,
    cold_starts,
    gateway_cpu_saturated,
)
