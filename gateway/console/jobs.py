"""GET /console/api/jobs and /console/api/jobs/{id}: the tenant's recent jobs and one job.

The list walks the tenant's recent-jobs index (``Keys.tenant_jobs``, written by the create
script and capped there) newest first inside one Lua call, reading a few fields of each
record and filtering as it goes: one round trip whose cost is bounded by the cap, never by
the jobs in Redis, and one JSON reply to parse. Ids whose record has expired leave the index
on the way. Cancelling and the live token stream use the job API itself (DELETE
/v1/jobs/{id}, GET /v1/jobs/{id}/events).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, cast

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse

from tide_fleet.gateway.console.auth import ViewerDep
from tide_fleet.gateway.deps import GatewayState, StateDep
from tide_fleet.gateway.errors import shown
from tide_fleet.gateway.served import served_catalog
from tide_fleet.infra.jobs.public import job_public
from tide_fleet.infra.wire.codec import decode_hash
from tide_fleet.infra.wire.job_scripts import RECENT_JOBS_PER_TENANT, RECENT_JOBS_SLACK
from tide_fleet.infra.wire.protocol import Keys

router = APIRouter(prefix="/console/api", include_in_schema=False)

# The fields listed; the script compares the 2nd (status), 3rd (bucket) and 4th (model)
# with the filters.
LISTED = ("id", "status", "bucket", "model", "priority", "created_at", "started_at",
          "first_token_at", "finished_at", "prompt_tokens", "max_tokens", "completion_tokens",
          "attempts", "error", "lease_owner")  # fmt: skip

# KEYS[1]: the index. ARGV: limit, most ids to look at, status ('' any), bucket ('' any),
# model ('' any), '1' when a record naming no model matches it too (the default model's:
# records written before jobs named their model), the job key prefix, then the fields.
# Returns {ids looked at, JSON array of rows (each the fields' values)}.
LIST_SCRIPT = """
local limit, most = tonumber(ARGV[1]), tonumber(ARGV[2])
local fields = {unpack(ARGV, 8)}
local rows, gone = {}, {}
local start = 0
while #rows < limit and start < most do
  local ids = redis.call('ZREVRANGE', KEYS[1], start, start + 199)
  if #ids == 0 then break end
  for _, id in ipairs(ids) do
    local v = redis.call('HMGET', ARGV[7] .. id, unpack(fields))
    local model = v[4] or ''
    if not v[1] then
      table.insert(gone, id)
    elseif #rows < limit and (ARGV[3] == '' or v[2] == ARGV[3])
        and (ARGV[4] == '' or v[3] == ARGV[4])
        and (ARGV[5] == '' or model == ARGV[5] or (ARGV[6] == '1' and model == '')) then
      for i = 1, #fields do if not v[i] then v[i] = '' end end
      table.insert(rows, v)
    end
  end
  start = start + #ids
end
if #gone > 0 then redis.call('ZREM', KEYS[1], unpack(gone)) end
if #rows == 0 then return {start, '[]'} end
return {start, cjson.encode(rows)}
"""


def _row(values: list[str], default_model: str) -> dict[str, Any]:
    f = dict(zip(LISTED, values, strict=True))

    def num(key: str) -> float | None:
        return float(f[key]) if f[key] else None

    return {
        "id": f["id"], "status": f["status"], "bucket": f["bucket"], "priority": f["priority"],
        "model": f["model"] or default_model, "created_at": num("created_at"),
        "started_at": num("started_at"), "first_token_at": num("first_token_at"),
        "finished_at": num("finished_at"), "prompt_tokens": int(num("prompt_tokens") or 0),
        "max_tokens": int(num("max_tokens") or 0),
        "completion_tokens": int(num("completion_tokens") or 0),
        "attempts": int(num("attempts") or 0), "error": f["error"] or None,
        "worker": f["lease_owner"] or None,
    }  # fmt: skip


def _model_filter(state: GatewayState, model: str | None) -> tuple[str, str]:
    """(the served name to match, '1' when records naming no model match too); an alias is
    its model, a name no longer served is matched as it is."""
    if not model:
        return "", ""
    served = served_catalog(state).resolve(model)
    if served is None:
        return model, ""
    return served.name, "1" if served.default else ""


@router.get("/jobs")
async def list_jobs(
    state: StateDep,
    viewer: ViewerDep,
    status: str | None = None,
    bucket: str | None = None,
    model: str | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> JSONResponse:
    tenant = viewer.own_tenant()
    script = state.aredis.register_script(LIST_SCRIPT)
    most = RECENT_JOBS_PER_TENANT + RECENT_JOBS_SLACK
    args: list[str | int] = [limit, most, status or "", bucket or "",
                             *_model_filter(state, model), Keys.job(""), *LISTED]  # fmt: skip
    scanned, raw = await script(keys=[Keys.tenant_jobs(tenant)], args=args)
    rows = [_row(v, state.model_name) for v in json.loads(raw)]
    return JSONResponse({"object": "list", "data": rows, "scanned": int(scanned), "tenant": tenant})


@router.get("/jobs/{job_id}")
async def job_detail(job_id: str, state: StateDep, viewer: ViewerDep) -> dict[str, Any]:
    tenant = viewer.own_tenant()
    raw = cast(dict[bytes, bytes], await state.aredis.hgetall(Keys.job(job_id)))
    record = decode_hash(raw) if raw else None
    if record is None or record.get("tenant") != tenant:
        raise HTTPException(404, detail=f"job {shown(job_id)} not found")
    public = job_public(record).model_dump(mode="json")
    return {
        **public,
        "model": record.get("model") or state.model_name,
        "max_tokens": int(record.get("max_tokens") or 0),
        "worker": record.get("lease_owner") or None,
        "lost_unstarted": int(record.get("lost_unstarted") or 0),
        "cancel_requested": record.get("cancel_requested") == "1",
        "batch_id": record.get("batch_id") or None,
    }
