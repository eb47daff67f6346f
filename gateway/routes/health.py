"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import redis
from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tide_fleet.gateway.deps import StateDep
from tide_fleet.gateway.metrics import BACKLOG, QUEUE_DEPTH, registry
from tide_fleet.gateway.readiness import readiness
from tide_fleet.gateway.served import served_catalog
from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.backlog import read_lanes_async
from tide_fleet.infra.wire.protocol import BUCKETS, Priority, queue_name

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:  # async: never queued behind busy worker threads
    return {"status": "ok"}


@router.get(
    "/readyz",
    responses={503: {"description": "Redis or the tokenizer is not available, or no worker "
                     "serves while TIDE_READY_REQUIRES_WORKERS is set"}},
)  # fmt: skip
async def readyz(state: StateDep) -> JSONResponse:
    """Redis, the tokenizer, and the live workers per pool ("workers": 0, "no worker yet")."""
    ready, body = await readiness(state)
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(state: StateDep) -> Response:
    """Prometheus text; queue lengths and each served model's backlog per bucket are read
    now, from Redis."""
    names = [queue_name(b, p) for b in BUCKETS for p in Priority]
    try:
        pipe = state.aredis.pipeline(transaction=False)
        for name in names:  # a queue is its lists and its deadline zset
            queues.read_depth(pipe, name)
        raw = await pipe.execute()
        n = queues.DEPTH_READS
        for i, name in enumerate(names):
            QUEUE_DEPTH.labels(name).set(queues.depth_of(raw[n * i : n * (i + 1)]))
        models = served_catalog(state).models
        backlog = await read_lanes_async(state.aredis, [m.lane for m in models])
        BACKLOG.latest = {m.name: backlog[m.lane] for m in models}
    except redis.RedisError:
        BACKLOG.latest = {}  # no stale numbers while Redis is away
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
