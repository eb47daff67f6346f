"""Open-loop load against a Tide gateway: arrivals, requests, statistics and plots.

Open loop: every request starts at a time drawn in advance (Poisson or gamma gaps),
never waiting for earlier ones, so an overloaded fleet shows up as growing queues and
latency instead of a client that politely slows down. ``tide bench`` and the scenario
presets (infra/bench/scenarios.py) drive it; torch is never imported here.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

PERCENTILES = (50, 90, 99)
SLO_METRICS = ("ttft", "tpot", "e2e")
TRACE_FIELDS = {"prompt", "prompt_len", "max_tokens", "offset"}
# Plain words for synthetic prompts: common English keeps subword tokenizers near one
# token per word, and any tokenizer can cut them to an exact length.
_WORD_TEXT = (
    "the a little girl boy cat dog sun tree house ball red blue big small happy sad day "
    "night park friend mom dad play run jump see look find went said was had and then "
    "with in on under over very one time once upon bird fish water sky green box toy"
)
WORDS = tuple(_WORD_TEXT.split(" "))


# -- workload ----------------------------------------------------------------------


@dataclass
class WorkItem:
    """One request to send ``arrival`` seconds after the start."""

    index: int
    arrival: float
    prompt: str
    max_tokens: int
    kind: str = "short"  # the length class (statistics are also reported per kind)


@dataclass(frozen=True)
class LengthClass:
    """Lognormal prompt and output lengths (medians in tokens), capped in total."""

    name: str
    share: float
    prompt_median: int
    output_median: int
    max_total: int


def arrival_offsets(n: int, rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """Start times with gamma gaps: mean 1/rate, CV 1/sqrt(burstiness); 1 is Poisson.

    rate = inf sends everything at once. The first request starts at 0.
    """
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"rate and burstiness must be positive, got {rate} and {burstiness}")
    if math.isinf(rate):
        return [0.0] * n
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return out


def draw_lengths(
    classes: list[LengthClass], sigma: float, rng: random.Random
) -> tuple[str, int, int]:
    """(class name, prompt tokens, output tokens) for one request."""
    cls = rng.choices(classes, weights=[c.share for c in classes])[0]
    prompt = _lognormal(rng, cls.prompt_median, sigma, 2, cls.max_total - 1)
    output = _lognormal(rng, cls.output_median, sigma, 1, cls.max_total - prompt)
    return cls.name, prompt, output


def _lognormal(rng: random.Random, median: int, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(rng.lognormvariate(math.log(median), sigma))))


class PromptMaker:
    """Prompt texts of a given token count for the served model's tokenizer.

    Without a tokenizer it counts one token per word, which is only an estimate.
    """

    def __init__(self, tokenizer: Any | None, rng: random.Random) -> None:
        self.tokenizer = tokenizer
        self.rng = rng
        self.num_special = (
            len(tokenizer.encode("x")) - len(tokenizer.encode("x", False)) if tokenizer else 0
        )

    def make(self, num_tokens: int, first: bool = True) -> str:
        """A text of num_tokens tokens; first=False for text that follows a prefix (no BOS)."""
        words = [self.rng.choice(WORDS) for _ in range(max(1, num_tokens))]
        if self.tokenizer is None:
            return " ".join(words)
        want = max(1, num_tokens - (self.num_special if first else 0))
        ids = self.tokenizer.encode(" ".join(words), False)
        while len(ids) < want:  # a tokenizer with fewer tokens than words (never in practice)
            words += words
            ids = self.tokenizer.encode(" ".join(words), False)
        return str(self.tokenizer.decode(ids[:want]))


class TraceError(ValueError):
    pass


@dataclass
class TraceRow:
    max_tokens: int
    prompt: str | None = None
    prompt_len: int | None = None
    offset: float | None = None


def load_trace(path: Path) -> list[TraceRow]:
    """Parse a JSONL trace: {prompt | prompt_len, max_tokens, offset?} per line."""
    from infra.jsonl import iter_objects

    rows: list[TraceRow] = []
    try:
        for n, item in iter_objects(path, TRACE_FIELDS):
            rows.append(_trace_row(item, path, n))
    except TraceError:
        raise
    except ValueError as e:
        raise TraceError(str(e)) from None
    if not rows:
        raise TraceError(f"{path}: the trace has no requests")
    with_offset = sum(r.offset is not None for r in rows)
    if 0 < with_offset < len(rows):
        raise TraceError(
            f"{path}: give offset on every line or on none ({with_offset} of {len(rows)} have it)"
        )
    return rows


def _trace_row(item: Any, path: Path, n: int) -> TraceRow:
    where = f"{path}:{n}"
    if ("prompt" in item) == ("prompt_len" in item):
        raise TraceError(f"{where}: give exactly one of prompt or prompt_len")
    if "prompt" in item and (not isinstance(item["prompt"], str) or not item["prompt"]):
        raise TraceError(f"{where}: prompt must be a non-empty string")
    for key in ("prompt_len", "max_tokens"):
        if key in item and (type(item[key]) is not int or item[key] < 1):
            raise TraceError(f"{where}: {key} must be an integer >= 1, got {item[key]!r}")
    if "max_tokens" not in item:
        raise TraceError(f"{where}: max_tokens is required")
    offset = item.get("offset")
    if offset is not None and (
        isinstance(offset, bool) or not isinstance(offset, int | float) or offset < 0
    ):
        raise TraceError(f"{where}: offset must be a number of seconds >= 0, got {offset!r}")
    return TraceRow(item["max_tokens"], item.get("prompt"), item.get("prompt_len"), offset)


@dataclass
class WorkloadSpec:
    """What to send; the same spec and seed give the same requests at the same times."""

    num_requests: int = 50
    request_rate: float = 5.0
    burstiness: float = 1.0
    seed: int = 0
    classes: list[LengthClass] = field(default_factory=list)
    sigma: float = 0.6
    shared_prefix_len: int = 0  # every prompt starts with the same text this long
    trace: list[TraceRow] | None = None


def build_workload(spec: WorkloadSpec, tokenizer: Any | None) -> list[WorkItem]:
    rng = random.Random(spec.seed)
    maker = PromptMaker(tokenizer, random.Random(spec.seed + 1))
    prefix = maker.make(spec.shared_prefix_len) + " " if spec.shared_prefix_len else ""

    def prompt(num_tokens: int) -> str:
        return prefix + maker.make(num_tokens, first=not prefix)

    if spec.trace is not None:
        rows = spec.trace[: spec.num_requests]
        times = arrival_offsets(len(rows), spec.request_rate, spec.burstiness, rng)
        if rows[0].offset is not None:
            times = [float(r.offset or 0.0) for r in rows]
        items = [
            WorkItem(i, t, r.prompt or prompt(r.prompt_len or 1), r.max_tokens, "trace")
            for i, (r, t) in enumerate(zip(rows, times, strict=True))
        ]
        return sorted(items, key=lambda w: w.arrival)
    times = arrival_offsets(spec.num_requests, spec.request_rate, spec.burstiness, rng)
    items = []
    for i, t in enumerate(times):
        kind, prompt_len, output_len = draw_lengths(spec.classes, spec.sigma, rng)
        items.append(WorkItem(i, t, prompt(prompt_len), output_len, kind))
    return items


# -- the client ----------------------------------------------------------------------


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
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

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


# -- statistics ----------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    s = sorted(values)
    rank = p / 100 * (len(s) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (rank - lo)


def distribution_ms(values: list[float]) -> dict[str, float | int | None]:
    """Mean, p50/p90/p99 and max in milliseconds of values in seconds."""
    out: dict[str, float | int | None] = {"count": len(values)}
    ms = [v * 1000 for v in values]
    out["mean"] = round(sum(ms) / len(ms), 3) if ms else None
    for p in PERCENTILES:
        out[f"p{p}"] = round(percentile(ms, p), 3) if ms else None
    out["max"] = round(max(ms), 3) if ms else None
    return out


def parse_slos(specs: list[str]) -> dict[str, float]:
    """['ttft:500', 'tpot:50'] -> {'ttft': 500.0, 'tpot': 50.0} (milliseconds)."""
    slos: dict[str, float] = {}
    for spec in specs:
        name, _, value = spec.partition(":")
        if name not in SLO_METRICS:
            raise ValueError(
                f"--goodput: unknown metric {name!r} in {spec!r} (use {', '.join(SLO_METRICS)})"
            )
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if not ms > 0 or math.isinf(ms):
            raise ValueError(
                f"--goodput: {name} needs a positive number of milliseconds, got {value!r}"
            )
        slos[name] = ms
    return slos


def meets_slos(rec: RequestRecord, slos: dict[str, float]) -> bool:
    if not rec.ok:
        return False
    for name, limit_ms in slos.items():
        value = getattr(rec, name)
        if value is not None and value * 1000 > limit_ms:  # tpot of a 1-token answer: none
            return False
    return True


def summarize(
    records: list[RequestRecord], duration: float, slos: dict[str, float]
) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    span = duration if duration > 0 else float("nan")
    out_tokens = sum(r.output_tokens for r in ok)
    summary: dict[str, Any] = {
        "requests": {"sent": len(records), "completed": len(ok), "failed": len(records) - len(ok)},
        "duration_s": round(duration, 3),
        "throughput": {
            "requests_per_s": round(len(ok) / span, 3),
            "output_tokens_per_s": round(out_tokens / span, 3),
            "total_tokens_per_s": round((out_tokens + sum(r.prompt_tokens for r in ok)) / span, 3),
        },
        "ttft_ms": distribution_ms([r.ttft for r in ok if r.ttft is not None]),
        "tpot_ms": distribution_ms([r.tpot for r in ok if r.tpot is not None]),
        "itl_ms": distribution_ms([x for r in ok for x in r.itls]),
        "e2e_ms": distribution_ms([r.e2e for r in ok if r.e2e is not None]),
        "queue_ms": distribution_ms([r.queue_s for r in ok if r.queue_s is not None]),
    }
    if slos:
        good = sum(meets_slos(r, slos) for r in records)
        summary["goodput"] = {
            "slos_ms": slos,
            "requests_per_s": round(good / span, 3),
            "fraction": round(good / len(records), 4) if records else None,
        }
    errors = sorted({r.error for r in records if r.error})
    if errors:
        summary["errors"] = errors[:10]
    return summary


def build_report(
    result: RunResult, slos: dict[str, float], config: dict[str, Any]
) -> dict[str, Any]:
    """The JSON report: config, summary, per-kind summaries, queue samples and requests."""
    kinds = sorted({r.kind for r in result.records})
    return {
        "config": config,
        "summary": summarize(result.records, result.duration, slos),
        "by_kind": {
            k: summarize([r for r in result.records if r.kind == k], result.duration, slos)
            for k in kinds
        },
        "queue_depth": result.queue_depth,
        "requests": [asdict(r) for r in result.records],
    }


def summary_lines(summary: dict[str, Any]) -> list[str]:
    r, t = summary["requests"], summary["throughput"]
    lines = [
        f"requests      {r['completed']}/{r['sent']} completed in {summary['duration_s']:.1f} s",
        f"throughput    {t['requests_per_s']:.2f} req/s, "
        f"{t['output_tokens_per_s']:.1f} output tok/s, {t['total_tokens_per_s']:.1f} total tok/s",
    ]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"):
        d = summary[key]
        if d["count"]:
            cells = "  ".join(f"p{p} {d[f'p{p}']:9.1f}" for p in PERCENTILES)
            lines.append(f"{key[:-3]:<6}ms    mean {d['mean']:9.1f}  {cells}")
    if "goodput" in summary:
        g = summary["goodput"]
        slo = ", ".join(f"{k} <= {v:g} ms" for k, v in g["slos_ms"].items())
        lines.append(
            f"goodput       {g['requests_per_s']:.2f} req/s "
            f"({g['fraction']:.0%} of requests; {slo})"
        )
    for error in summary.get("errors", []):
        lines.append(f"error         {error}")
    return lines


# -- plots ---------------------------------------------------------------------------


def tokens_per_second(records: list[RequestRecord]) -> list[int]:
    """Output tokens in each second of the run: streamed tokens when they arrived; a batch
    job's tokens (never streamed) all in the second it finished."""
    stamps: list[tuple[float, int]] = []
    for r in records:
        if r.token_times:
            stamps += [(t, 1) for t in r.token_times]
        elif r.ok and r.finished is not None:
            stamps.append((r.finished, r.output_tokens))
    counts = [0] * (int(max((t for t, _ in stamps), default=-1)) + 1)
    for t, n in stamps:
        counts[int(t)] += n
    return counts


def write_plots(runs: dict[str, RunResult], out_dir: Path) -> list[Path]:
    """Latency CDFs and a timeline (tokens/s, queue depth), one line per run label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = [
        ("ttft", "TTFT"),
        ("tpot", "TPOT"),
        ("e2e", "end-to-end latency"),
        ("queue_s", "queue time"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (attr, title) in zip(axes.flat, metrics, strict=True):
        for label, run in runs.items():
            values = sorted(
                v * 1000 for r in run.records if r.ok and (v := getattr(r, attr)) is not None
            )
            if values:
                ax.step(
                    values,
                    [(i + 1) / len(values) for i in range(len(values))],
                    where="post",
                    label=label,
                )
        ax.set(title=title, xlabel="ms", ylabel="fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    cdf = out_dir / "latency_cdf.png"
    fig.savefig(cdf, dpi=100)
    plt.close(fig)

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for label, run in runs.items():
        counts = tokens_per_second(run.records)
        if counts:
            top.plot(range(len(counts)), counts, drawstyle="steps-post", label=label)
        qd = run.queue_depth
        bottom.plot([s["t"] for s in qd], [s["total"] for s in qd], label=f"{label}: queued")
        bottom.plot(
            [s["t"] for s in qd],
            [s["in_flight"] for s in qd],
            linestyle=":",
            label=f"{label}: in flight",
        )
    top.set(title="output tokens per second", ylabel="tokens/s")
    bottom.set(
        title="gateway queue depth (tide:queue_depth) and requests in flight",
        xlabel="seconds",
        ylabel="requests",
    )
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    timeline = out_dir / "timeline.png"
    fig.savefig(timeline, dpi=100)
    plt.close(fig)
    return [cdf, timeline]
