#!/usr/bin/env python3
"""Console benchmark: each console endpoint's latency with 10,000 jobs in Redis, and the
gateway's job-submit rate with and without console pages polling.

Starts an embedded Redis and one uvicorn gateway process on loopback (dummy:tiny's
tokenizer), then
  1. fills Redis through the job scripts with --jobs jobs of one tenant (a third of them
     marked completed), --batches batch records, --workers heartbeats whose metrics
     endpoints (a local server) the fleet view scrapes, and --history controller samples;
  2. times every console endpoint (--samples sequential GETs each after a warm-up) and
     prints p50 / p99 per endpoint;
  3. sends --requests POST /v1/jobs open-loop at --rate per second, alone and while
     --pages console pages poll as an open browser tab does (Fleet every 1 s, Jobs every
     1.5 s), --rounds times each, interleaved, and prints the medians of accepted jobs/s
     and latency side by side with their ratio.
Traffic stays on loopback and is bounded in count and time. Last line: one JSON object.

    python scripts/bench_console.py
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import redis

from tide_fleet.infra.batches.store import BatchStore
from tide_fleet.infra.bench.open_loop import post_open_loop
from tide_fleet.infra.fleet.local_fleet import wait_ready
from tide_fleet.infra.fleet.redis_server import EmbeddedRedis, free_port
from tide_fleet.infra.jobs.schemas import JobCreate
from tide_fleet.infra.jobs.submission import ModelInfo, build_job
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.stats import percentile
from tide_fleet.infra.wire import fleet_status
from tide_fleet.infra.wire.heartbeats import Heartbeat
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.protocol import Keys

ROOT = Path(__file__).resolve().parents[1]

TENANT_KEY, OPERATOR_KEY = "bench-key", "op-key"


def fill(r: redis.Redis, model: str, jobs: int, batches: int, workers: int, history: int,
         metrics_url: str) -> str:  # fmt: skip
    """Write the data set; returns one job id (for the detail endpoint)."""
    big = 10**7  # no limit gets in the way of the fill
    settings = Settings(bucket_short_max=64, bucket_medium_max=256, max_queued_per_tenant=big,
                        max_requests_per_second_per_tenant=big, max_queue_length=big)  # fmt: skip
    info, store = ModelInfo.load(model), JobStore(r)
    now = time.time()
    last = ""
    for start in range(0, jobs, 500):
        pipe = r.pipeline(transaction=False)
        made = []
        for i in range(start, min(start + 500, jobs)):
            body = JobCreate(
                prompt=f"story {i}: once upon a time", max_tokens=(16, 100, 400)[i % 3]
            )
            job = build_job(settings, info, "bench", body, None)
            keys, args = job.script_call()
            store.create_script(keys=keys, args=args, client=pipe)
            made.append(job.fields["id"])
        pipe.execute()
        pipe = r.pipeline(transaction=False)
        for i, job_id in enumerate(made):
            if (start + i) % 3 == 0:  # a third finished, with timings and a result
                pipe.hset(Keys.job(job_id), mapping={
                    "status": "completed", "started_at": now, "first_token_at": now + 0.01,
                    "finished_at": now + 0.2, "completion_tokens": 16, "attempts": 1,
                    "text": "x" * 80, "finish_reason": "length",
                })  # fmt: skip
        pipe.execute()
        last = made[-1]
    batch_store = BatchStore(r)
    for i in range(batches):
        batch_store.create({
            "id": f"batch_{i:04d}", "tenant": "bench", "endpoint": "/v1/completions",
            "input_file_id": "file_x", "completion_window": "24h", "status": "in_progress",
            "created_at": now - 100 + i, "in_progress_at": now - 50, "expires_at": now + 3600,
            "total": 1000, "completed": 10 * i, "failed": i, "jobs_terminal": 11 * i,
            "jobs_completed": 10 * i,
        })  # fmt: skip
    for w in range(workers):
        worker_id = f"w{w:02d}"
        beat = Heartbeat(worker_id=worker_id, pool=("small", "big")[w % 2],
                         buckets=("short",) if w % 2 == 0 else ("medium", "long"), held=w % 3,
                         running=w % 3, tokens_per_s=100.0 + w, at=now,
                         metrics_url=f"{metrics_url}/{worker_id}")  # fmt: skip
        r.hset(Keys.worker(worker_id), mapping=beat.to_hash())
        r.expire(Keys.worker(worker_id), 3600)
        r.zadd(Keys.workers, {worker_id: now})
    for t in range(history):
        pipe = r.pipeline(transaction=False)
        statuses = [fleet_status.PoolStatus(p, "scale_out" if t % 50 == 0 else "hold", 1, 2,
                                            "demand 1.2 workers", now - history + t,
                                            {"ready": 1}) for p in ("small", "big")]  # fmt: skip
        sample = fleet_status.FleetSample(now - history + t, workers, workers, jobs, 1600.0)
        fleet_status.record(pipe, statuses, sample)
        pipe.execute()
    return last


def metrics_server() -> tuple[ThreadingHTTPServer, str]:
    """A stand-in for the workers' Prometheus endpoints (what worker/metrics.py exports)."""
    labels = 'model="m",pool="p"'
    text = "".join(
        f"# TYPE tide:{name} {kind}\ntide:{name}{suffix}{{{labels}}} {value}\n"
        for name, kind, suffix, value in [
            ("kv_cache_usage_perc", "gauge", "", 0.4),
            ("kv_cache_capacity_tokens", "gauge", "", 65536),
            ("mfu_ema", "gauge", "", 0.2), ("mbu_ema", "gauge", "", 0.6),
            ("prefix_cache_queries", "counter", "_total", 1e6),
            ("prefix_cache_hits", "counter", "_total", 3e5),
        ]
    ).encode()  # fmt: skip
    text += b"".join(  # histograms make the real text long: parse that much too
        f'tide:step_time_seconds_bucket{{{labels},kind="decode",le="{le}"}} {i}\n'.encode()
        for i, le in enumerate([0.001 * 2**k for k in range(40)])
    )

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/metrics"


def time_endpoints(url: str, job_id: str, samples: int) -> dict[str, dict[str, float]]:
    endpoints = {
        "/console (page)": ("/console", TENANT_KEY),
        "/console/api/me": ("/console/api/me", TENANT_KEY),
        "/console/api/fleet": ("/console/api/fleet", OPERATOR_KEY),
        "/console/api/fleet?history=1": ("/console/api/fleet?history=1", OPERATOR_KEY),
        "/console/api/jobs": ("/console/api/jobs", TENANT_KEY),
        "/console/api/jobs?status=completed": ("/console/api/jobs?status=completed", TENANT_KEY),
        "/console/api/jobs?status=failed (none)": ("/console/api/jobs?status=failed", TENANT_KEY),
        "/console/api/jobs/{id}": (f"/console/api/jobs/{job_id}", TENANT_KEY),
        "/console/api/batches": ("/console/api/batches", TENANT_KEY),
    }
    out = {}
    with httpx.Client(base_url=url, timeout=30) as client:
        for name, (path, key) in endpoints.items():
            headers = {"Authorization": f"Bearer {key}"}
            for _ in range(10):
                client.get(path, headers=headers).raise_for_status()
            times = []
            for _ in range(samples):
                t0 = time.perf_counter()
                client.get(path, headers=headers).raise_for_status()
                times.append(time.perf_counter() - t0)
            out[name] = {
                "p50_ms": 1e3 * percentile(times, 50),
                "p99_ms": 1e3 * percentile(times, 99),
            }
    return out


async def open_loop(url: str, rate: float, n: int, concurrency: int) -> dict[str, float]:
    """Open-loop job submissions (infra/bench/open_loop.py's minimal client)."""
    body = {"prompt": "Once upon a time, there was a little girl.", "max_tokens": 16}
    auth = {"Authorization": f"Bearer {TENANT_KEY}"}
    r = await post_open_loop(url, "/v1/jobs", body, rate, n, concurrency, headers=auth)
    return {"accepted_per_s": r.per_s(202), "p50_ms": 1e3 * percentile(r.latencies, 50),
            "p99_ms": 1e3 * percentile(r.latencies, 99)}  # fmt: skip


async def console_pages(url: str, pages: int, stop: asyncio.Event) -> int:
    """What `pages` open browser tabs poll: Fleet every 1 s and Jobs every 1.5 s each."""
    polls = 0

    async def tab(path: str, key: str, every: float) -> None:
        nonlocal polls
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"},
                                     timeout=30) as client:  # fmt: skip
            while not stop.is_set():
                (await client.get(path)).raise_for_status()
                polls += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), every)

    tabs = [tab("/console/api/fleet", OPERATOR_KEY, 1.0) for _ in range(pages)]
    tabs += [tab("/console/api/jobs", TENANT_KEY, 1.5) for _ in range(pages)]
    await asyncio.gather(*tabs)
    return polls


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def console_cpu(url: str, pid: int, pages: int, seconds: float) -> tuple[float, float]:
    """The gateway's CPU per second, idle and with the pages polling (no other load): what
    an open console costs the process that also serves the job path."""
    t0, c0 = time.perf_counter(), cpu_seconds(pid)
    await asyncio.sleep(seconds)
    idle = (cpu_seconds(pid) - c0) / (time.perf_counter() - t0)
    stop = asyncio.Event()
    task = asyncio.create_task(console_pages(url, pages, stop))
    await asyncio.sleep(1.0)
    t0, c0 = time.perf_counter(), cpu_seconds(pid)
    await asyncio.sleep(seconds)
    polled = (cpu_seconds(pid) - c0) / (time.perf_counter() - t0)
    stop.set()
    await task
    return idle, polled


async def load_with_pages(url: str, args: argparse.Namespace) -> tuple[dict[str, float], int]:
    stop = asyncio.Event()
    pages = asyncio.create_task(console_pages(url, args.pages, stop))
    await asyncio.sleep(1.0)  # the pages are open before the load starts
    load = await open_loop(url, args.rate, args.requests, args.concurrency)
    stop.set()
    return load, await pages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)  # fmt: skip
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--history", type=int, default=fleet_status.HISTORY_KEPT)
    parser.add_argument("--samples", type=int, default=200, help="GETs per endpoint")
    parser.add_argument("--rate", type=float, default=1000.0, help="offered POSTs per second")
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--pages", type=int, default=1, help="console tabs of each kind open")
    parser.add_argument("--rounds", type=int, default=3, help="load runs of each kind")
    args = parser.parse_args()
    from tide_fleet.worker.models.resolve import resolve_model_path

    model = str(resolve_model_path("dummy:tiny"))
    tmp = Path(tempfile.mkdtemp(prefix="tide-bench-console-"))
    server = EmbeddedRedis(tmp / "redis").start()
    metrics, metrics_url = metrics_server()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ, "REDIS_URL": server.url, "TIDE_MODEL": model, "PYTHONPATH": str(ROOT),
        "TIDE_API_KEYS": json.dumps({TENANT_KEY: "bench", "other-key": "other"}),
        "TIDE_ADMIN_KEYS": json.dumps([OPERATOR_KEY]), "TIDE_BUCKET_SHORT_MAX": "64",
        "TIDE_BUCKET_MEDIUM_MAX": "256", "TIDE_MAX_QUEUED_PER_TENANT": "10000000",
        "TIDE_MAX_REQUESTS_PER_SECOND_PER_TENANT": "10000000",
    }  # fmt: skip
    gateway = [sys.executable, "-m", "uvicorn", "tide_fleet.gateway.app:app", "--port", str(port),
               "--log-level", "warning", "--no-access-log"]  # fmt: skip
    proc = subprocess.Popen(gateway, env=env, cwd=ROOT)
    results: dict = {"jobs": args.jobs}
    try:
        r = redis.Redis.from_url(server.url)
        t0 = time.perf_counter()
        job_id = fill(r, model, args.jobs, args.batches, args.workers, args.history, metrics_url)
        print(f"filled Redis: {args.jobs} jobs, {args.batches} batches, {args.workers} workers, "
              f"{args.history} controller samples in {time.perf_counter() - t0:.1f} s; "
              f"{r.dbsize()} keys")  # fmt: skip
        wait_ready(url)
        timings = time_endpoints(url, job_id, args.samples)
        results["endpoints"] = timings
        print(f"\n{'endpoint':<42} {'p50 ms':>8} {'p99 ms':>8}")
        for name, t in timings.items():
            print(f"{name:<42} {t['p50_ms']:>8.2f} {t['p99_ms']:>8.2f}")
        idle, polled_cpu = asyncio.run(console_cpu(url, proc.pid, args.pages, 10.0))
        results["gateway_cpu"] = {"idle": idle, "with_console": polled_cpu}
        print(f"\ngateway CPU, no load: {1e3 * idle:.1f} ms/s idle, {1e3 * polled_cpu:.1f} ms/s "
              f"with {args.pages}+{args.pages} console pages polling")  # fmt: skip
        rounds: dict[str, list[dict[str, float]]] = {"alone": [], "with_console": []}
        polls = 0
        for _ in range(args.rounds):  # interleaved: a shared machine's load hits both alike
            rounds["alone"].append(
                asyncio.run(open_loop(url, args.rate, args.requests, args.concurrency))
            )
            polled, n = asyncio.run(load_with_pages(url, args))
            rounds["with_console"].append(polled)
            polls += n
        summary = {
            k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in rounds.items()
        }
        ratio = summary["with_console"]["accepted_per_s"] / summary["alone"]["accepted_per_s"]
        results["submit"] = {**summary, "rounds": rounds, "console_polls": polls, "ratio": ratio}
        print(f"\nPOST /v1/jobs at {args.rate:.0f}/s offered, {args.requests} requests a round, "
              f"median of {args.rounds} interleaved rounds:")  # fmt: skip
        print(f"{'':<28} {'accepted/s':>11} {'p50 ms':>8} {'p99 ms':>8}   accepted/s per round")
        labels = {"alone": "no console", "with_console": f"{args.pages}+{args.pages} pages polling"}
        for key, label in labels.items():
            row = summary[key]
            each = " ".join(f"{r['accepted_per_s']:.0f}" for r in rounds[key])
            print(f"{label:<28} {row['accepted_per_s']:>11.0f} {row['p50_ms']:>8.2f} "
                  f"{row['p99_ms']:>8.2f}   {each}")  # fmt: skip
        print(f"ratio (with / without): {ratio:.3f} ({polls} console polls)")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        metrics.shutdown()
        server.stop()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
