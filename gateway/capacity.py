"""Can any worker take a job now? Checked at submit on the synchronous OpenAI routes.

Only where the fleet does not scale from zero (TIDE_READY_REQUIRES_WORKERS=true: no worker
starts because work is queued): then a job for a bucket that no live, non-draining worker
serves would wait for nothing, so it is answered 503 with Retry-After instead, and nothing
is queued. Where the fleet may scale from zero, jobs queue until a worker starts. The
workers are read from their heartbeats, at most once a second; a worker serves its own
model's buckets only (infra/wire/models.py).
"""

from __future__ import annotations

import time

from tide_fleet.gateway.deps import GatewayState
from tide_fleet.gateway.errors import ApiError
from tide_fleet.gateway.served import served_catalog
from tide_fleet.infra.wire.heartbeats import read_heartbeats_async
from tide_fleet.infra.wire.new_job import NewJob

CACHE_SECONDS = 1.0
RETRY_AFTER = "5"


async def serving_buckets(state: GatewayState) -> set[tuple[str, str]]:
    """(served model, bucket) pairs some live, non-draining worker takes (its model as
    ModelCatalog.runs reads it from the heartbeat)."""
    now = time.monotonic()
    cached = state.serving_cache
    if cached is not None and now - cached[0] < CACHE_SECONDS:
        return cached[1]
    beats = (await read_heartbeats_async(state.aredis)).values()
    cat = served_catalog(state)
    served = {
        (cat.runs(b.model), bucket)
        for b in beats if b.pool and not b.draining for bucket in b.buckets
    }  # fmt: skip
    state.serving_cache = (now, served)
    return served


async def check_capacity(state: GatewayState, jobs: list[NewJob]) -> None:
    if not state.settings.ready_requires_workers:
        return
    served = await serving_buckets(state)
    for job in jobs:
        bucket, model = job.fields["bucket"], job.fields.get("model") or state.model_name
        if (model, bucket) not in served:
            raise ApiError(
                503, f"no worker of model {model!r} serves the {bucket!r} bucket now, and this "
                "fleet does not start one for queued work (TIDE_READY_REQUIRES_WORKERS); retry "
                "later", code="no_worker", headers={"Retry-After": RETRY_AFTER},
            )  # fmt: skip
