"""GET /console/api/fleet (operator keys only): queues, pools, workers, decisions, tenants.

Everything comes from what Redis already holds, in a few round trips whatever the number
of jobs or models: every served model's backlog counters (infra/wire/backlog.py) and queue
lengths with the tenants' unfinished-job counters (fleet_queues.py), the heartbeats
(infra/wire/heartbeats.py) and the controller's records (infra/wire/fleet_status.py);
engine figures come from the workers' metrics endpoints (worker_stats.py, cached). Queues
are per (model, bucket); pools and workers name the model they run; each LoRA adapter has
a row (its queued jobs and the workers holding it) and each worker lists its adapters.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from tide_fleet.gateway.console.auth import OperatorDep
from tide_fleet.gateway.console.fleet_queues import (
    adapter_rows,
    bucket_rows,
    lanes,
    model_of,
    model_rows,
    read_queues,
)
from tide_fleet.gateway.console.worker_stats import EngineStats, WorkerScraper
from tide_fleet.gateway.deps import StateDep
from tide_fleet.gateway.served import served_catalog
from tide_fleet.infra.wire.adapters import all_adapters_async
from tide_fleet.infra.wire.backlog import adapter_backlog_async
from tide_fleet.infra.wire.fleet_status import FleetStatus, read_status_async
from tide_fleet.infra.wire.heartbeats import Heartbeat
from tide_fleet.infra.wire.models import ModelCatalog
from tide_fleet.infra.wire.protocol import Keys

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


def _pools(
    beats: dict[str, Heartbeat], status: FleetStatus, cat: ModelCatalog
) -> list[dict[str, Any]]:
    names = sorted(set(status.pools) | {b.pool for b in beats.values()})
    out = []
    for name in names:
        mine = [b for b in beats.values() if b.pool == name]
        # A pool serves one model, named by its workers' heartbeats: the controller's record
        # names none, so a pool without a live worker shows null.
        models = sorted({model_of(b, cat) for b in mine})
        counts = {"starting": 0, "idle": 0, "busy": 0, "draining": 0}
        for b in mine:
            counts[worker_state(b)] += 1
        last = status.pools.get(name)
        if last is not None:  # only the controller knows of launched, not yet beating ones
            counts["starting"] = last.workers.get("starting", 0)
        out.append({
            "pool": name,
            "model": ", ".join(models) or None,
            "buckets": sorted({bk for b in mine for bk in b.buckets}),
            "workers": counts,
            "actual": sum(counts.values()),
            "desired": last.desired if last else None,
            "decision": asdict(last) if last else None,
        })  # fmt: skip
    return out


def _workers(
    beats: dict[str, Heartbeat], engine: dict[str, EngineStats], cat: ModelCatalog, now: float
) -> list[dict[str, Any]]:
    out = []
    for w, b in sorted(beats.items()):
        stats = engine.get(b.metrics_url)
        out.append({
            "worker_id": w, "pool": b.pool, "model": model_of(b, cat),
            "host": b.host, "pid": b.pid, "state": worker_state(b), "buckets": list(b.buckets),
            "running": b.running, "waiting": b.waiting, "held": b.held,
            "free_slots": b.free_slots, "kv_cache_usage": b.kv_cache_usage,
            "tokens_per_s": b.tokens_per_s, "beat_age_s": max(0.0, now - b.at),
            "adapters": list(b.adapters), "adapters_on_device": list(b.adapters_on_device),
            **(asdict(stats) if stats else {}),
        })  # fmt: skip
    return out


@router.get("/fleet")
async def fleet(
    request: Request, state: StateDep, viewer: OperatorDep, history: bool = False
) -> JSONResponse:
    console = request.app.state.console
    cat = served_catalog(state)
    models = lanes(cat)
    now = time.time()
    tenants = sorted(set(state.settings.api_keys.values())) or ["default"]
    beats = await read_heartbeats(state)
    backlog, depths, active = await read_queues(state, models, tenants, now)
    status = await read_status_async(state.aredis, history=history)
    scraper: WorkerScraper = console.scraper
    engine = scraper.stats([b.metrics_url for b in beats.values() if b.metrics_url])
    per_model = model_rows(models, backlog, beats, cat)
    generated: dict[str, float] = {}
    for stats in engine.values():
        for name, n in stats.adapter_tokens.items():
            generated[name] = generated.get(name, 0.0) + n
    adapters = adapter_rows(
        await all_adapters_async(state.aredis, cat),
        await adapter_backlog_async(state.aredis), beats, generated,
    )  # fmt: skip
    return JSONResponse(
        {
            "at": now,
            "model": state.model_name,  # the default model
            "buckets": bucket_rows(models, backlog, depths, console.rates, now),
            "models": per_model,
            "adapters": adapters,
            "pools": _pools(beats, status, cat),
            "workers": _workers(beats, engine, cat, now),
            "decisions": [asdict(d) for d in status.decisions],
            "tenants": [{"tenant": t, "active": n} for t, n in zip(tenants, active, strict=True)],
            "totals": {
                "queued": sum(m["queued"] or 0 for m in per_model),
                "workers": len(beats),
                "tokens_per_s": sum(b.tokens_per_s for b in beats.values()),
            },
            "history": [vars(s) for s in status.history],  # vars: asdict copies, 600 times
        }
    )
