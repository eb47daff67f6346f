"""Can any worker take a job now? Checked at submit on the synchronous OpenAI routes.

Only where the fleet does not scale from zero (TIDE_READY_REQUIRES_WORKERS=true: no worker
starts because work is queued): then a job for a bucket that no live, non-draining worker
serves would wait for nothing, so it is answered 503 with Retry-After instead, and nothing
is queued. Where the fleet may scale from zero, jobs queue until a worker starts. The
workers are read from their heartbeats (gateway/readiness.py), at most once a second.
"""

from __future__ import annotations

import time

from gateway.deps import GatewayState
from gateway.errors import ApiError
from gateway.readiness import read_pools
from infra.wire.jobstore import NewJob

CACHE_SECONDS = 1.0
RETRY_AFTER = "5"


async def serving_buckets(state: GatewayState) -> set[str]:
    now = time.monotonic()
    cached = state.serving_cache
    if cached is not None and now - cached[0] < CACHE_SECONDS:
        return cached[1]
    pools = await read_pools(state.aredis)
    buckets = {b for p in pools.values() if p.workers for b in p.buckets}
    state.serving_cache = (now, buckets)
    return buckets


async def check_capacity(state: GatewayState, jobs: list[NewJob]) -> None:
    if not state.settings.ready_requires_workers:
        return
    served = await serving_buckets(state)
    for job in jobs:
        bucket = job.fields["bucket"]
        if bucket not in served:
            raise ApiError(
                503, f"no worker serves the {bucket!r} bucket now, and this fleet does not "
                "start one for queued work (TIDE_READY_REQUIRES_WORKERS); retry later",
                code="no_worker", headers={"Retry-After": RETRY_AFTER},
            )  # fmt: skip
