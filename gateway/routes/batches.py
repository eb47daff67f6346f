"""OpenAI-compatible Batches API: create, get, list (paginated), cancel."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from tide_fleet.gateway.deps import StateDep, TenantDep
from tide_fleet.gateway.errors import ApiError, shown
from tide_fleet.gateway.routes.jobs import ERRORS
from tide_fleet.infra.batches.store import new_batch_id, parse_window
from tide_fleet.infra.batches.validate import validate_batch
from tide_fleet.infra.jobs.fields import (
    METADATA_DOC,
    METADATA_MAX_KEYS,
    Metadata,
    NonEmptyText,
    Text,
)
from tide_fleet.infra.jobs.public import list_page, public_batch
from tide_fleet.infra.jobs.schemas import WebhookSpec
from tide_fleet.infra.jobs.webhooks import UnsafeWebhookTarget, check_target
from tide_fleet.infra.wire.protocol import Keys

router = APIRouter(prefix="/v1/batches", tags=["batches"])


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_file_id: NonEmptyText
    endpoint: Literal["/v1/completions", "/v1/chat/completions"]
    completion_window: Text = Field("24h", description="'24h', or any N s|m|h")
    metadata: Metadata | None = Field(None, max_length=METADATA_MAX_KEYS, description=METADATA_DOC)
    webhook: WebhookSpec | None = Field(None, description="signed POST of the batch when it ends")


@router.post("", responses=ERRORS)
async def create_batch(body: BatchCreate, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    try:
        window = parse_window(body.completion_window)
    except ValueError as e:
        raise ApiError(400, str(e), param="completion_window", code="invalid_value") from None
    file = await asyncio.to_thread(state.files.get, body.input_file_id, tenant)
    if file is None:
        raise ApiError(400, f"input_file_id: file {shown(body.input_file_id)} not found",
                       param="input_file_id", code="file_not_found")  # fmt: skip
    if file["purpose"] != "batch":
        raise ApiError(400, "input_file_id: the file's purpose must be 'batch'",
                       param="input_file_id", code="invalid_value")  # fmt: skip
    webhook_url = str(body.webhook.url) if body.webhook else ""
    if webhook_url:
        try:
            await asyncio.to_thread(check_target, webhook_url, state.settings.webhook_allow_hosts)
        except UnsafeWebhookTarget as e:
            raise ApiError(400, str(e), param="webhook.url", code="invalid_url") from None
    now = time.time()
    record = {
        "id": new_batch_id(),
        "tenant": tenant,
        "endpoint": body.endpoint,
        "input_file_id": body.input_file_id,
        "completion_window": body.completion_window,
        "status": "validating",
        "created_at": now,
        "expires_at": now + window,
        "metadata": body.metadata,
        "webhook_url": webhook_url,
        "total": "",
        "completed": 0,
        "failed": 0,
    }
    record["validate_sent_at"] = now
    await asyncio.to_thread(state.batches.create, record)
    # Followed by the supervisor from now on (it re-sends a lost validate task).
    await asyncio.to_thread(state.redis.sadd, Keys.active_batches, record["id"])
    # Read back before validation starts: a fast worker may move the batch on before
    # this response is built, and the create call answers with the state it created.
    created = await _owned(state, tenant, record["id"])
    await asyncio.to_thread(validate_batch.delay, record["id"])
    return public_batch(created)


async def _owned(state: StateDep, tenant: str, batch_id: str) -> dict[str, str]:
    record = await asyncio.to_thread(state.batches.get, batch_id, tenant)
    if record is None:
        raise HTTPException(404, detail=f"batch {shown(batch_id)} not found")
    return record


@router.get("/{batch_id}", responses=ERRORS)
async def get_batch(batch_id: str, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    return public_batch(await _owned(state, tenant, batch_id))


@router.get("", responses=ERRORS)
async def list_batches(
    state: StateDep,
    tenant: TenantDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    records, has_more = await asyncio.to_thread(state.batches.list, tenant, after, limit)
    return list_page([public_batch(r) for r in records], has_more)


@router.post("/{batch_id}/cancel", responses=ERRORS)
async def cancel_batch(batch_id: str, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    await _owned(state, tenant, batch_id)
    await asyncio.to_thread(
        state.batches.transition, batch_id, ["validating", "in_progress"],
        status="cancelling", cancelling_at=time.time(),
    )  # fmt: skip
    return public_batch(await _owned(state, tenant, batch_id))
