"""`tide doctor`'s rules about what limits throughput: a worker's KV cache (preemptions),
its memory bandwidth (decode re-reading the weights), the step budget prefills get (judged
per model: its workers' latencies), and the gateway's one core. Pure and torch-free.
"""

from __future__ import annotations

from tide_fleet.infra.doctor.findings import Finding, Thresholds, gauge, quantile, rounded, whose
from tide_fleet.infra.doctor.queues import model_evidence, scraped_by_model, worker_models
from tide_fleet.infra.doctor.scrape import Scrape
from tide_fleet.infra.doctor.snapshot import Snapshot, counter_increase, histogram_counts


def kv_bound(b: Snapshot, a: Snapshot, dt: float, th: Thresholds) -> list[Finding]:
    models = worker_models(a)
    out = []
    for w, s in sorted(a.workers.items()):
        kv = gauge(s, "tide:kv_cache_usage_perc")
        then = b.workers[w].total("tide:num_preemptions_total") if w in b.workers else None
        preempted = counter_increase(then, s.total("tide:num_preemptions_total"))
        if kv >= th.kv_full and preempted > 0:
            evidence = model_evidence(models[w]) | {
                "kv_cache_usage_perc": round(kv, 3),
                "preemptions": preempted,
                "preemptions_per_s": round(preempted / dt, 3),
                "running": gauge(s, "tide:num_requests_running"),
                "max_num_seqs": gauge(s, "tide:engine_max_num_seqs"),
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
    models = worker_models(a)
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
        evidence = model_evidence(models[w]) | {
            "mbu_ema": round(mbu, 3),
            "mfu_ema": round(mfu, 3),
            "tokens_per_step": round(tokens / steps, 1) if steps else None,
            "running": gauge(s, "tide:num_requests_running"),
            "max_num_seqs": gauge(s, "tide:engine_max_num_seqs"),
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
    out = []
    for model, workers in sorted(scraped_by_model(a).items()):
        ttft = histogram_counts(b, a, "tide:time_to_first_token_seconds", True, workers)
        itl = histogram_counts(b, a, "tide:inter_token_latency_seconds", True, workers)
        ttft99, itl99 = quantile(ttft, 0.99, th), quantile(itl, 0.99, th)
        if ttft99 is None or itl99 is None or ttft99 < th.ttft_high_s or itl99 > th.itl_ok_s:
            continue
        prefill = histogram_counts(b, a, "tide:request_prefill_time_seconds", True, workers)
        budgets = {int(gauge(a.workers[w], "tide:engine_max_num_batched_tokens")) for w in workers}
        evidence = model_evidence(model) | {
            "ttft_p50_s": rounded(quantile(ttft, 0.5, th)),
            "ttft_p99_s": rounded(ttft99),
            "itl_p99_s": rounded(itl99),
            "prefill_time_p99_s": rounded(quantile(prefill, 0.99, th)),
            "requests": max(ttft.values(), default=0),
            "max_num_batched_tokens": sorted(budgets),
        }
        out.append(
            Finding(
                "prefill_starvation",
                "first tokens are slow while decoding is fast: prefills wait behind decodes",
                whose(model, "workers"),
                evidence,
                "prefill chunks get the step budget decodes leave: raise --max-num-batched-tokens "
                "(bigger chunks) or lower --max-num-seqs; route long prompts to their own pool "
                "(bucket_short_max / bucket_medium_max and each pool's buckets)",
            )
        )
    return out


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
