#!/usr/bin/env python3
"""Worker benchmark: results written beside the engine's step (the writer thread) against
written between steps (inline), with Redis behind a proxy that delays every round trip.

One worker on the tiny dummy model (one engine for every run) and an embedded Redis,
reached directly ("local") and through a loopback proxy that holds each chunk the worker
sends for 0, 2 and 10 ms (a remote Redis); the proxies run in processes of their own. Per
row, --repeats pairs of runs (the same jobs, one way of writing then the other, in turn
which first), each timed from the first job taken to the last one durable (its 'done'
event's id: Redis's clock). Prints jobs/s and tokens/s (medians) and the median of the
pairs' writer/inline ratios, each pair's after it, then one JSON line. About 40 s.

    python scripts/bench_worker_redis.py [--jobs 32] [--max-tokens 64] [--delays-ms 0 2 10]

``DelayProxy`` is also the slow Redis of tests/worker/test_slow_redis.py.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis

from tide_fleet.infra.bench.delay_proxy import DelayProxy
from tide_fleet.infra.fleet.redis_server import EmbeddedRedis, free_port
from tide_fleet.infra.jobs.schemas import JobCreate
from tide_fleet.infra.jobs.submission import ModelInfo, build_job
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.protocol import Keys
from tide_fleet.worker.engine import LLMEngine
from tide_fleet.worker.models.resolve import resolve_model_path
from tide_fleet.worker.service import WorkerService

ROOT = Path(__file__).resolve().parents[1]

PROMPTS = ["once upon a time", "the little dog ran", "lily wanted to", "one day a boy",
           "the sun was", "tom and his mom"]  # fmt: skip


def submit(
    client: redis.Redis, settings: Settings, info: ModelInfo, n: int, max_tokens: int
) -> list[str]:
    store = JobStore(client)
    ids = []
    for i in range(n):
        body = JobCreate(prompt=PROMPTS[i % len(PROMPTS)] + f" {i}", max_tokens=max_tokens,
                         temperature=0, ignore_eos=True)  # fmt: skip
        ids.append(store.create(build_job(settings, info, "bench", body, None))["id"])
    return ids


def serve_proxy(upstream_port: int, delay: float, port: int) -> None:
    """A DelayProxy in a process of its own: a proxy thread in the worker's process would
    take the GIL from it, which a real network does not."""
    proxy = DelayProxy(upstream_port, delay)
    proxy.port = port
    proxy.start()
    threading.Event().wait()


def start_proxy(upstream_port: int, delay: float) -> tuple[str, multiprocessing.Process]:
    port = free_port()
    proc = multiprocessing.get_context("fork").Process(
        target=serve_proxy, args=(upstream_port, delay, port), daemon=True
    )
    proc.start()
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return f"redis://127.0.0.1:{port}/0", proc
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def measured(client: redis.Redis, ids: list[str]) -> tuple[float, int]:
    """(Seconds from the first job taken to the last one durable, completion tokens): its
    'done' event's id is Redis's clock when the final write ran."""
    taken, tokens, durable = [], 0, []
    for job_id in ids:
        status, started_at, n = client.hmget(Keys.job(job_id), "status", "started_at",
                                             "completion_tokens")  # fmt: skip
        assert status == b"completed", (job_id, status)
        taken.append(float(started_at or 0))
        tokens += int(n or 0)
        ((event_id, _),) = client.xrevrange(Keys.events(job_id), count=1)
        durable.append(int(event_id.split(b"-")[0]) / 1000)
    return max(durable) - min(taken), tokens


def run_once(
    engine: LLMEngine, url: str, client: redis.Redis, model: Path, args: argparse.Namespace,
    inline: bool,
) -> tuple[float, int]:  # fmt: skip
    """The jobs queued, then one worker on `url` until they completed."""
    client.flushdb()
    settings = Settings(redis_url=url, model=str(model), worker_metrics_port=-1)
    ids = submit(client, settings, ModelInfo.load(str(model)), args.jobs, args.max_tokens)
    service = WorkerService(engine, settings, "bench", ["short"], write_inline=inline)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while int(client.get(Keys.tenant_active("bench")) or 0) > 0:  # 0: all are terminal
        if time.monotonic() > deadline:
            raise SystemExit("the jobs did not complete in 120 s")
        time.sleep(0.05)  # rarely: this process's GIL is the worker's too
    service.drain()
    thread.join(timeout=30)
    return measured(client, ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--delays-ms", type=float, nargs="+", default=[0.0, 2.0, 10.0])
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs per row")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis").start()
        client = redis.Redis.from_url(server.url)
        # The proxies first: forked before the engine exists.
        targets = [("local", server.url)]
        for delay_ms in args.delays_ms:
            url, _ = start_proxy(server.port, delay_ms / 1000)
            targets.append((f"{delay_ms:g} ms", url))
        model = resolve_model_path("dummy:tiny")
        engine = LLMEngine.from_pretrained(str(model), dtype="float32", device=args.device)
        try:
            run_once(engine, server.url, client, model, args, inline=False)  # warm-up
            for name, url in targets:
                runs: dict[bool, list[tuple[float, int]]] = {True: [], False: []}
                for i in range(args.repeats):  # pairs, in turn which goes first
                    for inline in (True, False) if i % 2 == 0 else (False, True):
                        runs[inline].append(run_once(engine, url, client, model, args, inline))
                rows.append(row(name, args.jobs, runs[True], runs[False]))
                print_row(rows[-1], header=len(rows) == 1)
        finally:
            client.close()
            server.stop()
    print(json.dumps({"jobs": args.jobs, "max_tokens": args.max_tokens, "rows": rows}))


def row(
    name: str, jobs: int, inline: list[tuple[float, int]], writer: list[tuple[float, int]]
) -> dict[str, Any]:
    """Medians of each way's rates, and the median of the pairs' ratios (a pair ran back to
    back, so what else loads the machine mostly cancels out)."""
    ratios = [s_in / s_wr for (s_in, _), (s_wr, _) in zip(inline, writer, strict=True)]
    return {
        "redis": name,
        "inline_jobs_s": statistics.median(jobs / s for s, _ in inline),
        "writer_jobs_s": statistics.median(jobs / s for s, _ in writer),
        "inline_tok_s": statistics.median(t / s for s, t in inline),
        "writer_tok_s": statistics.median(t / s for s, t in writer),
        "ratio": statistics.median(ratios),
        "ratios": [round(r, 2) for r in ratios],
    }


def print_row(r: dict[str, Any], header: bool) -> None:
    if header:
        print(f"{'redis':>7} | {'jobs/s inline':>13} {'writer':>7} | {'tok/s inline':>12} "
              f"{'writer':>7} | {'writer/inline':>13}  (each pair)")  # fmt: skip
    print(
        f"{r['redis']:>7} | {r['inline_jobs_s']:>13.1f} {r['writer_jobs_s']:>7.1f} | "
        f"{r['inline_tok_s']:>12.0f} {r['writer_tok_s']:>7.0f} | {r['ratio']:>12.2f}x  "
        f"{' '.join(f'{x:.2f}' for x in r['ratios'])}",
        flush=True,
    )


if __name__ == "__main__":
    main()
