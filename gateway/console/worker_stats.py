"""Engine figures the heartbeat does not carry (MFU/MBU, KV capacity, prefix-cache hits,
tokens generated per LoRA adapter), read from each worker's Prometheus endpoint (its
``metrics_url``, docs/observability.md).

Scrapes run in the background, concurrently, with a short timeout, and each answer is kept
for CACHE_SECONDS, so a console polling every second costs a worker one scrape per few
seconds whatever the number of open pages; a worker that does not answer shows no figures.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field

import httpx

CACHE_SECONDS = 3.0
TIMEOUT_SECONDS = 0.5

# Prometheus sample name -> field; counters appear with their _total suffix.
WANTED = {
    "tide:kv_cache_usage_perc": "kv_usage",
    "tide:kv_cache_capacity_tokens": "kv_capacity_tokens",
    "tide:mfu_ema": "mfu",
    "tide:mbu_ema": "mbu",
    "tide:prefix_cache_queries_total": "prefix_queries",
    "tide:prefix_cache_hits_total": "prefix_hits",
}
ADAPTER_TOKENS = "tide:lora_generation_tokens_total"  # labelled by adapter ('base': none)
_ADAPTER_LABEL = re.compile(r'adapter="([^"]*)"')


@dataclass(frozen=True)
class EngineStats:
    kv_used_tokens: int | None = None
    kv_capacity_tokens: int | None = None
    mfu: float | None = None
    mbu: float | None = None
    prefix_hit_rate: float | None = None  # hits / queries of prompt tokens since start
    # Tokens generated since start per LoRA adapter ('base': the base model); empty for a
    # worker that exports none.
    adapter_tokens: dict[str, float] = field(default_factory=dict)


def _samples(text: str) -> tuple[dict[str, float], dict[str, float]]:
    """The WANTED samples of a Prometheus text exposition, summed over their labels, and
    ADAPTER_TOKENS per adapter. A line scan for the few names wanted (a full parse of a
    worker's histograms costs ten times more): `name{labels} value [timestamp]`, comments
    skipped."""
    values: dict[str, float] = {}
    adapters: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("tide:"):
            continue
        brace = line.find("{")
        name = line[:brace] if brace >= 0 else line.split(" ", 1)[0]
        key = WANTED.get(name)
        if key is None and name != ADAPTER_TOKENS:
            continue
        rest = line[line.rfind("}") + 1 :] if brace >= 0 else line[len(name) :]
        value = float(rest.split()[0])
        if key is not None:
            values[key] = values.get(key, 0.0) + value
        elif (m := _ADAPTER_LABEL.search(line, brace)) is not None:
            adapters[m.group(1)] = adapters.get(m.group(1), 0.0) + value
    return values, adapters


def parse_metrics(text: str) -> EngineStats:
    values, adapters = _samples(text)
    capacity = values.get("kv_capacity_tokens")
    usage = values.get("kv_usage")
    queries = values.get("prefix_queries")
    return EngineStats(
        kv_used_tokens=round(usage * capacity) if usage is not None and capacity else None,
        kv_capacity_tokens=int(capacity) if capacity is not None else None,
        mfu=values.get("mfu"),
        mbu=values.get("mbu"),
        prefix_hit_rate=values.get("prefix_hits", 0.0) / queries if queries else None,
        adapter_tokens=adapters,
    )


class WorkerScraper:
    """One per gateway process: url -> (read at, stats). A request never waits for a
    scrape: it gets what is known and, when some of it is older than CACHE_SECONDS, starts
    one refresh in the background."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[float, EngineStats]] = {}
        self._refreshing: asyncio.Task[None] | None = None

    async def _one(self, client: httpx.AsyncClient, url: str) -> None:
        try:
            response = await client.get(url)
            response.raise_for_status()
            stats = parse_metrics(response.text)
        except Exception:  # any failure of one worker's endpoint: no figures for it
            stats = EngineStats()
        self._cache[url] = (time.monotonic(), stats)

    async def _refresh(self, urls: list[str]) -> None:
        async with httpx.AsyncClient(timeout=TIMEOUT_SECONDS) as client:
            await asyncio.gather(*(self._one(client, u) for u in urls))

    def stats(self, urls: list[str]) -> dict[str, EngineStats]:
        now = time.monotonic()
        for url in [u for u in self._cache if u not in urls]:
            del self._cache[url]  # a gone worker: the cache stays as small as the fleet
        stale = [u for u in dict.fromkeys(urls) if u.startswith("http") and (
            u not in self._cache or now - self._cache[u][0] >= CACHE_SECONDS)]  # fmt: skip
        if stale and (self._refreshing is None or self._refreshing.done()):
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh(stale))
        return {u: self._cache[u][1] if u in self._cache else EngineStats() for u in urls}

    async def settle(self) -> None:
        """Wait for a refresh under way (tests)."""
        if self._refreshing is not None:
            await self._refreshing
