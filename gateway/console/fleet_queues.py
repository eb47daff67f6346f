"""The fleet view's queues, per (model, bucket), and its totals per model and per adapter.

Each served model (infra/wire/models.py) has its own queues and backlog keys, named by its
lane ('' for the default model). The view reads every lane's backlog in one pipeline
(infra/wire/backlog.py `read_lanes_async`) and every queue's length with the tenants'
unfinished-job counters in one more, whatever the number of models. A worker names the
model it runs in its heartbeat; an older worker names none: it runs the default model.
A LoRA adapter's jobs are in its parent model's queues (and counted there); its own row
says how many of them wait (infra/wire/backlog.py `adapter_backlog_async`) and which
workers hold it (their heartbeats' `adapters`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tide_fleet.gateway.console.rates import ArrivalRates
from tide_fleet.gateway.deps import StateDep
from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.adapters import AdapterRef
from tide_fleet.infra.wire.backlog import Lanes, read_lanes_async
from tide_fleet.infra.wire.heartbeats import Heartbeat
from tide_fleet.infra.wire.models import ModelCatalog
from tide_fleet.infra.wire.protocol import BUCKETS, Keys, Priority, queue_name


@dataclass(frozen=True)
class Lane:
    model: str  # the served name
    lane: str  # its part of the queue and backlog names ('' for the default model)
    default: bool


def lanes(cat: ModelCatalog) -> list[Lane]:
    """Every served model, the default first."""
    return [Lane(m.name, m.lane, m.default) for m in cat.models]


def model_of(beat: Heartbeat, cat: ModelCatalog) -> str:
    """The served name of the model a worker runs (ModelCatalog.runs)."""
    return cat.runs(beat.model)


async def read_queues(
    state: StateDep, models: list[Lane], tenants: list[str], now: float
) -> tuple[Lanes, dict[str, int], list[int]]:
    """Backlog per lane and bucket, each queue's length, each tenant's unfinished jobs: two
    round trips (two pipelines)."""
    backlog = await read_lanes_async(state.aredis, [m.lane for m in models], now)
    names = [queue_name(b, p, m.lane) for m in models for b in BUCKETS for p in Priority]
    pipe = state.aredis.pipeline(transaction=False)
    for name in names:  # a queue is its lists and its deadline zset
        queues.read_depth(pipe, name)
    for t in tenants:
        pipe.get(Keys.tenant_active(t))
    raw = await pipe.execute()
    n = queues.DEPTH_READS
    depths = {name: queues.depth_of(raw[n * i : n * (i + 1)]) for i, name in enumerate(names)}
    active = [int(v or 0) for v in raw[n * len(names) :]]
    return backlog, depths, active


def bucket_rows(
    models: list[Lane], backlog: Lanes, depths: dict[str, int], rates: ArrivalRates, now: float
) -> list[dict[str, Any]]:
    """One row per (model, bucket), models in catalog order."""
    out = []
    for m in models:
        for b in BUCKETS:
            bl = backlog[m.lane][b]
            rate = rates.update(now, (m.model, b), bl.arrived_jobs, bl.arrived_tokens)
            out.append({
                "model": m.model,
                "bucket": b,
                "queued": bl.jobs,
                "queue_depth": {p.value: depths[queue_name(b, p, m.lane)] for p in Priority},
                "backlog_tokens": bl.tokens,
                "oldest_age_s": bl.oldest_age_s,
                "arrival_jobs_per_s": rate[0] if rate else None,
                "arrival_tokens_per_s": rate[1] if rate else None,
            })  # fmt: skip
    return out


def model_rows(
    models: list[Lane], backlog: Lanes, beats: dict[str, Heartbeat], cat: ModelCatalog
) -> list[dict[str, Any]]:
    """Per model: queued jobs, live workers, tokens/s. A model that only a heartbeat names
    (a worker of a model this gateway does not serve) comes last, its queue unread (null)."""
    by_model: dict[str, list[Heartbeat]] = {}
    for beat in beats.values():
        by_model.setdefault(model_of(beat, cat), []).append(beat)
    served = {m.model for m in models}
    rows: list[tuple[str, bool, int | None]] = [
        (m.model, m.default, sum(bl.jobs for bl in backlog[m.lane].values())) for m in models
    ]
    rows += [(name, False, None) for name in sorted(set(by_model) - served)]
    return [
        {
            "model": name,
            "default": default,
            "queued": queued,
            "workers": len(by_model.get(name, [])),
            "tokens_per_s": sum(b.tokens_per_s for b in by_model.get(name, [])),
        }
        for name, default, queued in rows
    ]


def adapter_rows(
    adapters: list[AdapterRef], queued: dict[str, int], beats: dict[str, Heartbeat],
    generated: dict[str, float],
) -> list[dict[str, Any]]:  # fmt: skip
    """Per served adapter (by parent, then name): queued jobs, the workers that hold it and
    how many have it in a device slot, the tokens its live workers generated on it (from
    their metrics). An adapter only a queue or a heartbeat names (unloaded since) comes
    last, its parent unknown (null)."""
    parents: dict[str, str | None] = {a.name: a.parent for a in adapters}
    named = set(queued) | {n for b in beats.values() for n in b.adapters}
    rows = []
    for name in [a.name for a in adapters] + sorted(named - set(parents)):
        holders = [b for b in beats.values() if name in b.adapters]
        rows.append({
            "adapter": name,
            "model": parents.get(name),
            "queued": queued.get(name, 0),
            "workers": len(holders),
            "on_device": sum(name in b.adapters_on_device for b in holders),
            "generated_tokens": generated.get(name, 0.0),
        })  # fmt: skip
    return rows
