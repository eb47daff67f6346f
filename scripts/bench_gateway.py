#!/usr/bin/env python3
"""Gateway benchmark: open-loop load on POST /v1/jobs, and worker pickup latency.

Starts an embedded Redis and one uvicorn gateway process on loopback (a real
tokenizer: stories260K when ../shared has it, else dummy:tiny), then
  1. sends --requests jobs at --rate per second (open loop: each request's latency is
     measured from its scheduled send time) after --warmup-seconds of unmeasured traffic
     at the same rate, and reports accepted jobs/s, p50 and p99;
  2. starts one worker, lets it go idle, submits --pickup-jobs one at a time and reports
     submit -> engine admission (the job's started_at - queued_at), p50 and p99.
Traffic stays on loopback and is bounded in count and time. Last line: one JSON object.

    python scripts/bench_gateway.py --rate 1000 --requests 5000
    python scripts/bench_gateway.py --model s=../shared/models/stories260K --model t=dummy:tiny
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import redis

from tide_fleet.infra.bench.open_loop import post_open_loop
from tide_fleet.infra.fleet.fleet_config import split_model_spec
from tide_fleet.infra.fleet.local_fleet import wait_ready
from tide_fleet.infra.fleet.redis_server import EmbeddedRedis, free_port
from tide_fleet.infra.stats import percentile
from tide_fleet.worker.models.resolve import resolve_model_path

ROOT = Path(__file__).resolve().parents[1]

STORIES = ROOT.parent / "shared/models/stories260K"


async def open_loop(
    url: str,
    rate: float,
    n: int,
    concurrency: int,
    warmup: int = 0,
    models: list[str] | None = None,
) -> dict:
    """Open-loop job submissions (infra/bench/open_loop.py's minimal client); with `models`,
    the jobs name each served model in turn."""
    body = {"prompt": "Once upon a time, there was a little girl named Lily.", "max_tokens": 32}
    bodies = [{**body, "model": m} for m in models] if models else [body]
    r = await post_open_loop(url, "/v1/jobs", bodies, rate, n, concurrency, warmup)
    return {
        "offered_rate": rate,
        "requests": n,
        "warmup_requests": warmup,
        "warmup_p99_ms": 1e3 * percentile(r.warm_latencies, 99) if r.warm_latencies else None,
        "accepted_per_s": r.per_s(202),
        "p50_ms": 1e3 * percentile(r.latencies, 50),
        "p99_ms": 1e3 * percentile(r.latencies, 99),
        "codes": r.codes,
    }


def pickup(url: str, r: redis.Redis, n: int) -> dict:
    waits = []
    with httpx.Client(base_url=url, timeout=30) as client:
        for _ in range(n):
            time.sleep(0.05)  # let the worker go idle between jobs
            job = client.post("/v1/jobs", json={"prompt": "Lily wanted to", "max_tokens": 2}).json()
            key = f"tide:job:{job['id']}"
            while not r.hget(key, "started_at"):
                time.sleep(0.0005)
            queued, started = (float(v) for v in r.hmget(key, "queued_at", "started_at"))
            waits.append(started - queued)
    return {
        "jobs": n,
        "p50_ms": 1e3 * statistics.median(waits),
        "p99_ms": 1e3 * percentile(waits, 99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=1000.0, help="offered requests per second")
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=64, help="client connections")
    parser.add_argument("--pickup-jobs", type=int, default=100)
    parser.add_argument(
        "--warmup-seconds", type=float, default=1.0,
        help="send this long at the same rate first, unmeasured (connections, first calls)",
    )  # fmt: skip
    parser.add_argument(
        "--model", action="append", default=None,
        help="HF folder or dummy:PRESET, NAME=PATH to name it; repeat to serve several (the "
        "jobs name each in turn; the first is the default). Default: stories260K, else "
        "dummy:tiny",
    )  # fmt: skip
    args = parser.parse_args()
    specs = args.model or [str(STORIES) if STORIES.is_dir() else "dummy:tiny"]
    named = [split_model_spec(m) for m in specs]
    tmp = Path(tempfile.mkdtemp(prefix="tide-bench-gw-"))
    server = EmbeddedRedis(tmp / "redis").start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ, "REDIS_URL": server.url, "TIDE_MODEL": named[0][1], "PYTHONPATH": str(ROOT),
        "TIDE_MAX_QUEUED_PER_TENANT": "1000000",
        "TIDE_MAX_REQUESTS_PER_SECOND_PER_TENANT": "1000000",
    }  # fmt: skip
    if len(named) > 1:
        env["TIDE_SERVED_MODELS"] = json.dumps([{"name": n, "model": p} for n, p in named])
    for _, path in named:
        if path.startswith("dummy:"):
            resolve_model_path(path)
    gateway = [sys.executable, "-m", "uvicorn", "tide_fleet.gateway.app:app", "--port", str(port),
               "--log-level", "warning", "--no-access-log"]  # fmt: skip
    procs = [subprocess.Popen(gateway, env=env, cwd=ROOT)]
    results: dict = {"models": [n for n, _ in named]}
    try:
        wait_ready(url)
        warmup = int(args.rate * args.warmup_seconds)
        models = [n for n, _ in named] if len(named) > 1 else None
        load = asyncio.run(
            open_loop(url, args.rate, args.requests, args.concurrency, warmup, models)
        )
        results["load"] = load
        print(
            f"POST /v1/jobs at {args.rate:.0f}/s offered, {args.requests} requests: "
            f"{load['accepted_per_s']:.0f} accepted/s, p50 {load['p50_ms']:.1f} ms, "
            f"p99 {load['p99_ms']:.1f} ms, codes {load['codes']} "
            f"(after {warmup} warm-up requests, whose p99 was {load['warmup_p99_ms'] or 0:.1f} ms)"
        )
        r = redis.Redis.from_url(server.url)
        r.flushdb()
        worker = [sys.executable, "-m", "tide_fleet.infra.cli", "worker", "--max-num-seqs", "8"]
        procs.append(subprocess.Popen(worker, env=env, cwd=ROOT))
        while not r.zcard("tide:workers"):
            time.sleep(0.1)
        pick = pickup(url, r, args.pickup_jobs)
        results["pickup"] = pick
        print(f"pickup (submit -> engine admission, idle worker): p50 {pick['p50_ms']:.2f} ms, "
              f"p99 {pick['p99_ms']:.2f} ms over {pick['jobs']} jobs")  # fmt: skip
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
        server.stop()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
