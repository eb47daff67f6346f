"""What the controller decided, in Redis, for the web console (gateway/console/).

Every poll the controller (infra/fleet/controller.py) writes one ``PoolStatus`` per pool
(its last decision with the reason, workers by state, backlog and rates) to the hash
``tide:controller:pools``, pushes each decision that changed something (not a hold) onto
the capped list ``tide:controller:decisions`` and one ``FleetSample`` (workers, desired,
queued jobs, throughput) onto the capped list ``tide:controller:history``: the console's
plots start with the last minutes even when no page was open. One pipeline, no reads;
JSON values. Torch-free.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from tide_fleet.infra.wire.protocol import Keys

DECISIONS_KEPT = 50
HISTORY_KEPT = 600  # samples: 10 minutes at `tide up`'s 1 s poll, 50 at the default 5 s


@dataclass(frozen=True)
class PoolStatus:
    pool: str
    action: str  # hold | scale_out | scale_in | scale_to_min
    current: int  # workers not draining (starting + ready)
    desired: int
    reason: str
    at: float
    workers: dict[str, int] = field(default_factory=dict)  # starting | ready | draining -> n
    backlog_jobs: int = 0
    arrival_tokens_per_s: float = 0.0
    rate_per_worker: float = 0.0


@dataclass(frozen=True)
class FleetSample:
    t: float
    workers: int  # live workers of every pool, draining included
    desired: int
    queued: int  # queued jobs of every bucket
    tokens_per_s: float  # generated tokens per second, summed over the heartbeats


def record(pipe: Any, statuses: list[PoolStatus], sample: FleetSample) -> None:
    """Queue the writes on a redis pipeline (the caller executes it)."""
    if statuses:
        pipe.hset(Keys.controller_pools, mapping={s.pool: json.dumps(asdict(s)) for s in statuses})
    changes = [json.dumps(asdict(s)) for s in statuses if s.action != "hold"]
    if changes:
        pipe.lpush(Keys.controller_decisions, *changes)
        pipe.ltrim(Keys.controller_decisions, 0, DECISIONS_KEPT - 1)
    pipe.lpush(Keys.controller_history, json.dumps(asdict(sample)))
    pipe.ltrim(Keys.controller_history, 0, HISTORY_KEPT - 1)


@dataclass(frozen=True)
class FleetStatus:
    pools: dict[str, PoolStatus]
    decisions: list[PoolStatus]  # newest first
    history: list[FleetSample]  # oldest first


@functools.cache
def _names(cls: Any) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def _load(cls: Any, data: dict[str, Any]) -> Any:
    """A record written by another version: unknown fields are dropped, missing ones default."""
    names = _names(cls)
    return cls(**{k: v for k, v in data.items() if k in names})


# One round trip and three JSON arrays to parse, however long the lists (a reply of
# hundreds of elements costs the pure-Python parser more than the command itself).
_READ = """
local history = {}
if ARGV[3] == '1' then history = redis.call('LRANGE', KEYS[3], 0, ARGV[2] - 1) end
return {'[' .. table.concat(redis.call('HVALS', KEYS[1]), ',') .. ']',
        '[' .. table.concat(redis.call('LRANGE', KEYS[2], 0, ARGV[1] - 1), ',') .. ']',
        '[' .. table.concat(history, ',') .. ']'}
"""


async def read_status_async(r: Any, history: bool = False) -> FleetStatus:
    """One round trip with redis.asyncio; the history (up to HISTORY_KEPT samples) only
    when asked."""
    keys = [Keys.controller_pools, Keys.controller_decisions, Keys.controller_history]
    args = [DECISIONS_KEPT, HISTORY_KEPT, "1" if history else "0"]
    pools, decisions, samples = (
        json.loads(raw) for raw in await r.register_script(_READ)(keys=keys, args=args)
    )
    return FleetStatus(
        {p["pool"]: _load(PoolStatus, p) for p in pools},
        [_load(PoolStatus, d) for d in decisions],
        [_load(FleetSample, s) for s in reversed(samples)],
    )
