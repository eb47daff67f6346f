"""Readiness: can this gateway serve? Redis, the tokenizer, and live workers per pool.

Workers are read from their heartbeats (infra/wire/heartbeats.py: worker/service.py writes
`tide:worker:<id>` with a TTL and lists the id in the zset `tide:workers`); an id whose hash
has expired is gone. A draining worker takes no new jobs, so it does not count as serving.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio as aredis

from tide_fleet.gateway.deps import GatewayState
from tide_fleet.infra.wire.heartbeats import read_heartbeats_async


@dataclass
class PoolWorkers:
    workers: int = 0  # live and taking jobs
    draining: int = 0
    buckets: set[str] = field(default_factory=set)

    def public(self) -> dict[str, Any]:
        return {"workers": self.workers, "draining": self.draining, "buckets": sorted(self.buckets)}


async def read_pools(r: aredis.Redis) -> dict[str, PoolWorkers]:
    """Live workers per pool, from their heartbeats."""
    pools: dict[str, PoolWorkers] = {}
    for beat in (await read_heartbeats_async(r)).values():
        if not beat.pool:  # a hash without a pool is no worker that serves
            continue
        entry = pools.setdefault(beat.pool, PoolWorkers())
        if beat.draining:
            entry.draining += 1
        else:
            entry.workers += 1
        entry.buckets.update(beat.buckets)
    return pools


async def readiness(state: GatewayState) -> tuple[bool, dict[str, Any]]:
    """(ready, body) for /readyz. With no serving worker the gateway is ready only where
    the fleet scales from zero (TIDE_READY_REQUIRES_WORKERS=false): jobs queue until one
    starts."""
    checks = {"tokenizer": state.model is not None, "redis": True}
    pools: dict[str, PoolWorkers] = {}
    try:
        await state.aredis.ping()
        pools = await read_pools(state.aredis)
    except redis.RedisError:
        checks["redis"] = False
    serving = sum(p.workers for p in pools.values())
    checks["workers"] = serving > 0
    body: dict[str, Any] = {
        "model": state.model_name,
        "workers": serving,
        "pools": {name: p.public() for name, p in pools.items()},
    }
    required = state.settings.ready_requires_workers
    if checks["redis"] and not serving:
        draining = sum(p.draining for p in pools.values())
        gone = f"{draining} worker(s), all draining" if draining else "no worker yet"
        body["detail"] = (
            f"{gone}: TIDE_READY_REQUIRES_WORKERS is set, so not ready until one serves"
            if required
            else f"{gone}: jobs queue until one starts (the fleet may scale from zero)"
        )
    ready = checks["tokenizer"] and checks["redis"] and (serving > 0 or not required)
    if state.load_error:
        body["error"] = state.load_error
    body = {"status": "ready" if ready else "not ready", "checks": checks, **body}
    return ready, body
