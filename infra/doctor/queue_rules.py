"""`tide doctor`'s rules about queues and the workers taking from them, judged per model:
jobs of a (model, bucket) nobody serves, a model's queue growing while its workers have
room, and a model's idle workers whose jobs waited long (cold starts). A worker of one
model never counts for another's queues (infra/doctor/queues.py). Pure and torch-free.
"""

from __future__ import annotations

from tide_fleet.infra.doctor.findings import Finding, Thresholds, gauge, quantile, rounded, whose
from tide_fleet.infra.doctor.queues import (
    lane_name,
    model_evidence,
    oldest_age,
    queue_jobs,
    scraped_by_model,
    served_buckets,
    worker_models,
)
from tide_fleet.infra.doctor.snapshot import Snapshot, histogram_counts, worker_increase


def _unserved_knob(model: str, bucket: str) -> str:
    if not model:
        return (
            f"start workers for {bucket!r}: a pool whose buckets include it in fleet.toml "
            "(min_workers > 0 avoids scale-from-zero waits), or `tide worker --buckets`"
        )
    return (
        f"start workers of model {model!r} for {bucket!r}: a pool serving that model (its "
        f"served_name, or its model in a one-model fleet) whose buckets include {bucket!r} in "
        "fleet.toml (min_workers > 0 avoids scale-from-zero waits), or "
        f"`tide worker --served-model {model} --buckets {bucket}`"
    )


def unserved_bucket(b: Snapshot, a: Snapshot, dt: float, th: Thresholds) -> list[Finding]:
    served = served_buckets(a)
    ages = oldest_age(a)
    models = [m for w, m in worker_models(a).items() if w in a.worker_info]  # live ones
    out = []
    for (model, bucket), jobs in sorted(queue_jobs(a).items()):
        if jobs <= 0 or (model, bucket) in served:
            continue
        mine = models.count(model)
        evidence = model_evidence(model) | {
            "queued_jobs": jobs,
            "oldest_job_age_s": rounded(ages.get((model, bucket))),
            "workers": mine,
            "served_buckets": sorted(bk for m, bk in served if m == model),
        }
        if len(models) > mine:
            evidence["workers_of_other_models"] = len(models) - mine
        has = f"model {model!r} has " if model else ""
        title = (
            f"{has}{jobs:g} job{'s' if jobs != 1 else ''} queued in bucket {bucket!r} "
            "and no live worker serves it"
        )
        out.append(
            Finding(
                "unserved_bucket",
                title,
                lane_name(model, bucket),
                evidence,
                _unserved_knob(model, bucket),
            )
        )
    return out


def admission_too_tight(b: Snapshot, a: Snapshot, dt: float, th: Thresholds) -> list[Finding]:
    served = served_buckets(a) if a.worker_info else set(queue_jobs(a))  # unserved: its own rule
    queued_before, queued_after = queue_jobs(b), queue_jobs(a)
    out = []
    for model, workers in sorted(scraped_by_model(a).items()):
        mine = {lane for lane in served if lane[0] == model}
        before_q = sum(v for k, v in queued_before.items() if k in mine)
        after_q = sum(v for k, v in queued_after.items() if k in mine)
        if after_q <= before_q or after_q < 1:
            continue
        kv = {w: gauge(a.workers[w], "tide:kv_cache_usage_perc") for w in workers}
        slots = {
            w: (
                gauge(a.workers[w], "tide:num_requests_running"),
                gauge(a.workers[w], "tide:engine_max_num_seqs"),
            )
            for w in workers
        }
        if max(kv.values()) >= th.kv_low or any(r >= m for r, m in slots.values()):
            continue
        evidence = model_evidence(model) | {
            "queued_jobs_before": before_q,
            "queued_jobs_after": after_q,
            "queue_growth_per_s": round((after_q - before_q) / dt, 3),
            "kv_cache_usage_max": round(max(kv.values()), 3),
            "running_per_worker": {w: f"{r:g}/{m:g}" for w, (r, m) in slots.items()},
        }
        queue = f"model {model!r}'s queue" if model else "the queue"
        out.append(
            Finding(
                "admission_too_tight",
                f"{queue} grows while its workers have free slots and KV room",
                whose(model, "workers"),
                evidence,
                "workers take a job only when engine.can_admit() accepts it: raise "
                "--max-num-seqs and --max-num-batched-tokens, check --kv-cache-memory is not "
                "tiny, and check the pools serve the growing buckets; if all that is fine, add "
                "workers (pool min_workers)",
            )
        )
    return out


def cold_starts(b: Snapshot, a: Snapshot, dt: float, th: Thresholds) -> list[Finding]:
    queued_before, queued_after = queue_jobs(b), queue_jobs(a)
    if not a.workers or (not queued_after and not queued_before):
        return []  # no queue reading: "nothing queued" cannot be told
    out = []
    for model, workers in sorted(scraped_by_model(a).items()):
        readings = (*queued_before.items(), *queued_after.items())
        queued = sum(v for (m, _), v in readings if m == model)
        if queued > 0:
            continue
        running = sum(gauge(a.workers[w], "tide:num_requests_running") for w in workers)
        generated = worker_increase(b, a, "tide:generation_tokens_total", workers)
        wait = histogram_counts(b, a, "tide:request_queue_time_seconds", False, workers)
        wait99 = quantile(wait, 0.99, th)
        if running > 0 or generated > 0 or wait99 is None or wait99 < th.cold_latency_s:
            continue
        e2e = histogram_counts(b, a, "tide:e2e_request_latency_seconds", False, workers)
        starts = (a.workers[w].total("process_start_time_seconds") for w in workers)
        ages = [a.at - t for t in starts if t]
        evidence = model_evidence(model) | {
            "queued_jobs": 0,
            "running": running,
            "workers": len(workers),
            "queue_time_p99_s": rounded(wait99),
            "queue_time_p50_s": rounded(quantile(wait, 0.5, th)),
            "e2e_p99_s": rounded(quantile(e2e, 0.99, th)),
            "youngest_worker_age_s": rounded(min(ages), 1) if ages else None,
        }
        fleet = f"model {model!r}'s workers are" if model else "the fleet is"
        out.append(
            Finding(
                "cold_starts",
                f"{fleet} idle now, yet jobs waited long: they waited for workers to start",
                whose(model, "pools"),
                evidence,
                "keep workers warm: raise the pool's min_workers or idle_s in fleet.toml, or a "
                "warm_pool_size of pre-initialised instances on AWS",
            )
        )
    return out
