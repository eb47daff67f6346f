"""Open-loop load against a Tide gateway: every request starts at its time drawn in advance,
never waiting for earlier ones, so an overloaded fleet shows up as growing queues and latency
instead of a client that politely slows down. Each request is recorded as the client saw it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tide_fleet.infra.bench.workload import WorkItem


@dataclass
class RequestRecord:
    """One request as the client saw it; times are seconds after the run's start."""

    index: int
    kind: str
    max_tokens: int
    sent: float
    ok: bool = False
    error: str | None = None
    job_id: str | None = None
    bucket: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    token_times: list[float] = field(default_factory=list)  # each streamed delta's arrival
    finished: float | None = None
    queue_s: float | None = None  # the gateway's started_at - queued_at
    server_ttft: float | None = None  # the gateway's first_token_at - queued_at

    @property
    def ttft(self) -> float | None:
        """From sending to the first streamed token; batch jobs stream nothing: the server's."""
        return self.token_times[0] - self.sent if self.token_times else self.server_ttft

    @property
    def e2e(self) -> float | None:
        return self.finished - self.sent if self.finished is not None else None

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.token_times)]


@dataclass
class RunConfig:
    url: str
    api: str = "jobs"  # jobs (POST /v1/jobs + SSE events) | completions (OpenAI, stream)
    api_key: str | None = None
    duration: float | None = None  # stop sending after this many seconds
    request_timeout: float = 600.0
    temperature: float = 0.0
    ignore_eos: bool = True
    priority: str = "interactive"  # jobs API: batch jobs skip per-token events
    metrics_interval: float = 0.5
    progress: bool = True


@dataclass
class RunResult:
    records: list[RequestRecord]
    queue_depth: list[dict[str, Any]]  # {t, total, in_flight, by_bucket}
    duration: float  # first send to last finish


def run_load(items: list[WorkItem], config: RunConfig) -> RunResult:
    return asyncio.run(_run(items, config))


async def _run(items: list[WorkItem], cfg: RunConfig) -> RunResult:
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    timeout = httpx.Timeout(cfg.request_timeout, connect=10.0)
    records: list[RequestRecord] = []
    samples: list[dict[str, Any]] = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    async with httpx.AsyncClient(
        base_url=cfg.url, headers=headers, limits=limits, timeout=timeout
    ) as client:
        with Progress(
            *columns, console=Console(stderr=True), disable=not cfg.progress, transient=True
        ) as progress:
            bar = progress.add_task("bench", total=len(items))
            t0 = time.perf_counter()
            clock = lambda: time.perf_counter() - t0  # noqa: E731 - a one-line closure
            poller = asyncio.create_task(_poll_queue(client, cfg, records, samples, clock))

            async def one(item: WorkItem, rec: RequestRecord) -> None:
                try:
                    await asyncio.wait_for(
                        _send(client, cfg, item, rec, clock), cfg.request_timeout
                    )
                except TimeoutError:
                    rec.error = f"no answer within --request-timeout {cfg.request_timeout:g} s"
                except (httpx.HTTPError, ValueError, KeyError) as e:
                    rec.error = f"{type(e).__name__}: {e}"
                rec.finished = clock() if rec.finished is None else rec.finished
                progress.advance(bar)

            tasks = []
            for item in items:
                delay = item.arrival - clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                if cfg.duration is not None and clock() >= cfg.duration:
                    break
                rec = RequestRecord(item.index, item.kind, item.max_tokens, sent=clock())
                records.append(rec)
                tasks.append(asyncio.create_task(one(item, rec)))
                progress.update(bar, description=f"sent {len(records)}")
            progress.update(bar, total=len(records))
            await asyncio.gather(*tasks)
            poller.cancel()
    first = min((r.sent for r in records), default=0.0)
    last = max((r.finished or r.sent for r in records), default=0.0)
    return RunResult(records, samples, last - first)


async def _send(
    client: httpx.AsyncClient, cfg: RunConfig, item: WorkItem, rec: RequestRecord, clock: Any
) -> None:
    body: dict[str, Any] = {
        "prompt": item.prompt,
        "max_tokens": item.max_tokens,
        "temperature": cfg.temperature,
        "ignore_eos": cfg.ignore_eos,
    }
    if cfg.api == "jobs":
        r = await client.post("/v1/jobs", json=body | {"priority": cfg.priority})
        if r.status_code != 202:
            rec.error = f"HTTP {r.status_code}: {r.text[:200]}"
            return
        rec.job_id = r.json()["id"]
        async with client.stream("GET", f"/v1/jobs/{rec.job_id}/events") as resp:
            async for event, data in _sse(resp):
                if event == "delta":
                    rec.token_times.append(clock())
                elif event == "done":
                    rec.finished = clock()
                    _take_job(rec, json.loads(data))
                    return
        rec.error = "the event stream ended before its done event"
        return
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
        if resp.status_code != 200:
            rec.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
            return
        async for _, data in _sse(resp):
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            rec.job_id = chunk["id"]
            if chunk["choices"][0]["text"]:
                rec.token_times.append(clock())
    rec.finished = clock()
    if rec.job_id:  # the completion id is the job id: its record has usage and timings
        _take_job(rec, (await client.get(f"/v1/jobs/{rec.job_id}")).json())


async def _sse(resp: httpx.Response) -> Any:
    """(event, data) pairs of a Server-Sent Events stream."""
    event, data = "message", []
    async for line in resp.aiter_lines():
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())


def _take_job(rec: RequestRecord, job: dict[str, Any]) -> None:
    rec.ok = job.get("status") == "completed"
    if not rec.ok:
        rec.error = f"job {job.get('status')}: {job.get('error')}"
    rec.bucket = job.get("bucket")
    rec.prompt_tokens = int(job["usage"]["prompt_tokens"])
    rec.output_tokens = int(job["usage"]["completion_tokens"])
    rec.queue_s = job.get("timings", {}).get("queue_seconds")
    rec.server_ttft = job.get("timings", {}).get("ttft_seconds")


async def _poll_queue(
    client: httpx.AsyncClient,
    cfg: RunConfig,
    records: list[RequestRecord],
    samples: list[dict[str, Any]],
    clock: Any,
) -> None:
    """Sample the gateway's tide:queue_depth gauges (and requests in flight) while running."""
    while True:
        by_bucket: dict[str, float] = {}
        try:
            text = (await client.get("/metrics", timeout=5)).text
            for line in text.splitlines():
                if line.startswith("tide:queue_depth{"):
                    queue = line.split('queue="', 1)[1].split('"', 1)[0]
                    bucket = queue.split(".")[1] if queue.count(".") >= 2 else queue
                    by_bucket[bucket] = by_bucket.get(bucket, 0.0) + float(line.rsplit(" ", 1)[1])
        except (httpx.HTTPError, IndexError, ValueError):
            pass  # a sample is lost; the run goes on
        in_flight = sum(r.finished is None for r in records)
        samples.append(
            {"t": round(clock(), 3), "total": sum(by_bucket.values()), "in_flight": in_flight,
             "by_bucket": by_bucket}
        )  # fmt: skip
        await asyncio.sleep(cfg.metrics_interval)
