"""GET /console/api/fleet (operator keys only): queues, pools, workers, decisions, tenants.

Everything comes from what Redis already holds, in a few round trips whatever the number
of jobs: the backlog counters (infra/wire/backlog.py), the queue lengths, the heartbeats
(infra/wire/heartbeats.py), the controller's records (infra/wire/fleet_status.py) and the
tenants' unfinished-job counters; engine figures come from the workers' metrics endpoints
(worker_stats.py, cached).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.console.auth import OperatorDep
from gateway.console.rates import ArrivalRates
from gateway.console.worker_stats import EngineStats, WorkerScraper
from gateway.deps import StateDep
from infra.wire.backlog import BucketBacklog, read_backlog_async
from infra.wire.fleet_status import FleetStatus, read_status_async
from infra.wire.heartbeats import Heartbeat
from infra.wire.protocol import BUCKETS, Keys, Priority, queue_name

router = APIRouter(prefix="/console/api", include_in_schema=False)


# Every live heartbeat in one reply to parse (a pipeline of HGETALLs costs the pure-Python
# reply parser more than Redis spends on it): [id, [field, value, ...], ...] as JSON.
BEATS_SCRIPT = """
local out = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local h = redis.call('HGETALL', ARGV[1] .. id)
  if #h > 0 then table.insert(out, id); table.insert(out, h) end
end
if #out == 0 then return '[]' end
return cjson.encode(out)
"""


async def read_heartbeats(state: StateDep) -> dict[str, Heartbeat]:
    """As infra/wire/heartbeats.read_heartbeats_async, in one Lua call."""
    script = state.aredis.register_script(BEATS_SCRIPT)
    flat = json.loads(await script(keys=[Keys.workers], args=[Keys.worker("")]))
    pairs = zip(flat[::2], flat[1::2], strict=True)
    return {w: Heartbeat.from_hash(dict(zip(h[::2], h[1::2], strict=True)), w) for w, h in pairs}


def worker_state(beat: Heartbeat) -> str:
    if beat.draining:
        return "draining"
    return "busy" if beat.is_busy else "idle"


async def _queues_and_tenants(
    state: StateDep, tenants: list[str]
) -> tuple[dict[str, int], list[int]]:
    names = [queue_name(b, p) for b in BUCKETS for p in Priority]
    pipe = state.aredis.pipeline(transaction=False)
    for name in names:
        pipe.llen(name)
    for t in tenants:
        pipe.get(Keys.tenant_active(t))
    raw = await pipe.execute()
    depths = dict(zip(names, (int(v) for v in raw[: len(names)]), strict=True))
    active = [int(v or 0) for v in raw[len(names) :]]
    return depths, active


def _buckets(
    backlog: dict[str, BucketBacklog], depths: dict[str, int], rates: ArrivalRates, now: float
) -> list[dict[str, Any]]:
    out = []
    for b in BUCKETS:
        bl = backlog[b]
        rate = rates.update(now, b, bl.arrived_jobs, bl.arrived_tokens)
        out.append({
            "bucket": b,
            "queued": bl.jobs,
            "queue_depth": {p.value: depths[queue_name(b, p)] for p in Priority},
            "backlog_tokens": bl.tokens,
            "oldest_age_s": bl.oldest_age_s,
            "arrival_jobs_per_s": rate[0] if rate else None,
            "arrival_tokens_per_s": rate[1] if rate else None,
        })  # fmt: skip
    return out


def _pools(beats: dict[str, Heartbeat], status: FleetStatus) -> list[dict[str, Any]]:
    names = sorted(set(status.pools) | {b.pool for b in beats.values()})
    out = []
    for name in names:
        mine = [b for b in beats.values() if b.pool == name]
        counts = {"starting": 0, "idle": 0, "busy": 0, "draining": 0}
        for b in mine:
            counts[worker_state(b)] += 1
        last = status.pools.get(name)
        if last is not None:  # only the controller knows of launched, not yet beating ones
            counts["starting"] = last.workers.get("starting", 0)
        out.append({
            "pool": name,
            "buckets": sorted({bk for b in mine for bk in b.buckets}),
            "workers": counts,
            "actual": sum(counts.values()),
            "desired": last.desired if last else None,
            "decision": asdict(last) if last else None,
        })  # fmt: skip
    return out


def _workers(
    beats: dict[str, Heartbeat], engine: dict[str, EngineStats], now: float
) -> list[dict[str, Any]]:
    out = []
    for w, b in sorted(beats.items()):
        stats = engine.get(b.metrics_url)
        out.append({
            "worker_id": w, "pool": b.pool, "host": b.host, "pid": b.pid,
            "state": worker_state(b), "buckets": list(b.buckets),
            "running": b.running, "waiting": b.waiting, "held": b.held,
            "free_slots": b.free_slots, "kv_cache_usage": b.kv_cache_usage,
            "tokens_per_s": b.tokens_per_s, "beat_age_s": max(0.0, now - b.at),
            **(asdict(stats) if stats else {}),
        })  # fmt: skip
    return out


@router.get("/fleet")
async def fleet(
    request: Request, state: StateDep, viewer: OperatorDep, history: bool = False
) -> JSONResponse:
    console = request.app.state.console
    now = time.time()
    tenants = sorted(set(state.settings.api_keys.values())) or ["default"]
    backlog = await read_backlog_async(state.aredis, now)
    beats = await read_heartbeats(state)
    depths, active = await _queues_and_tenants(state, tenants)
    status = await read_status_async(state.aredis, history=history)
    scraper: WorkerScraper = console.scraper
    engine = scraper.stats([b.metrics_url for b in beats.values() if b.metrics_url])
    return JSONResponse(
        {
            "at": now,
            "model": state.model_name,
            "buckets": _buckets(backlog, depths, console.rates, now),
            "pools": _pools(beats, status),
            "workers": _workers(beats, engine, now),
            "decisions": [asdict(d) for d in status.decisions],
            "tenants": [{"tenant": t, "active": n} for t, n in zip(tenants, active, strict=True)],
            "totals": {
                "queued": sum(backlog[b].jobs for b in BUCKETS),
                "workers": len(beats),
                "tokens_per_s": sum(b.tokens_per_s for b in beats.values()),
            },
            "history": [vars(s) for s in status.history],  # vars: asdict copies, 600 times
        }
    )
