"""GET /console/api/batches: the tenant's recent batches with live progress and an ETA.

Progress comes from the counters the job scripts keep on each batch record as its jobs end
(``jobs_completed``, ``jobs_terminal``) plus the lines refused at fan-out, so it moves
between the supervisor's passes; once the supervisor has written its own counts the larger
figure wins. Cancel and the output/error files use the Batch and File APIs.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, cast

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from tide_fleet.gateway.console.auth import ViewerDep
from tide_fleet.gateway.deps import StateDep
from tide_fleet.infra.jobs.public import public_batch
from tide_fleet.infra.wire.codec import decode_hash
from tide_fleet.infra.wire.protocol import Keys

router = APIRouter(prefix="/console/api", include_in_schema=False)


def progress(record: dict[str, str], now: float) -> dict[str, Any]:
    def n(key: str) -> int:
        return int(float(record.get(key) or 0))

    total = n("total")
    completed = max(n("completed"), n("jobs_completed"))
    failed = max(n("failed"), n("jobs_terminal") + n("refused") - n("jobs_completed"))
    done = min(completed + failed, total) if total else 0
    eta = None
    started = float(record.get("in_progress_at") or 0)
    if record.get("status") == "in_progress" and started and 0 < done < total:
        rate = done / max(now - started, 1e-3)
        eta = (total - done) / rate
    return {
        "total": total,
        "completed": completed,
        "failed": failed,
        "fraction": done / total if total else 0.0,
        "eta_s": eta,
    }


@router.get("/batches")
async def list_batches(
    state: StateDep, viewer: ViewerDep, limit: Annotated[int, Query(ge=1, le=100)] = 20
) -> JSONResponse:
    tenant = viewer.own_tenant()
    ids = cast(list[bytes], await state.aredis.zrevrange(Keys.tenant_batches(tenant), 0, limit - 1))
    pipe = state.aredis.pipeline(transaction=False)
    for batch_id in ids:
        pipe.hgetall(Keys.batch(batch_id.decode()))
    now = time.time()
    rows = []
    for raw in await pipe.execute() if ids else []:
        record = decode_hash(raw)
        if not record or record.get("tenant") != tenant:
            continue
        rows.append({**public_batch(record), "progress": progress(record, now)})
    return JSONResponse({"object": "list", "data": rows, "tenant": tenant})
