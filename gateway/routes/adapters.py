"""``/v1/adapters``: the operator loads and unloads LoRA adapters at run time.

``POST /v1/adapters`` ``{"name", "parent", "path"}`` checks the adapter against its parent's
config (infra/contract/adapters.py: its modules, shapes and rank, read from the safetensors
header) and records it in Redis (infra/wire/adapters.py); from then on a request whose
``model`` is its name runs on the parent's workers, which load the files when the first
such job arrives. ``DELETE /v1/adapters/{name}`` unloads one (jobs already queued under it
fail at the worker, naming it); ``GET /v1/adapters`` lists them all, declared ones too.

Operator routes: they need an operator key (TIDE_ADMIN_KEYS; a fleet with no keys at all is
open, as the console's fleet view is).
"""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from tide_fleet.gateway.adapters import check_adapter
from tide_fleet.gateway.deps import GatewayState, OperatorDep, StateDep
from tide_fleet.gateway.errors import ApiError, shown
from tide_fleet.gateway.routes.jobs import ERRORS
from tide_fleet.gateway.routes.models import adapter_cards, served_adapters
from tide_fleet.gateway.served import loaded, served_catalog
from tide_fleet.infra.contract.adapters import AdapterError, check_name
from tide_fleet.infra.jobs.public import ErrorBody
from tide_fleet.infra.wire.adapters import AdapterRef, lookup_async, register_async
from tide_fleet.infra.wire.adapters import unregister_async as unregister
from tide_fleet.infra.wire.models import ServedModel

router = APIRouter(prefix="/v1/adapters", tags=["adapters"])

ADMIN_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    403: {"model": ErrorBody, "description": "not an operator key (TIDE_ADMIN_KEYS)"},
    404: {"model": ErrorBody, "description": "no such parent model, or no such adapter"},
    409: {"model": ErrorBody, "description": "the name is taken, or the adapter is declared"},
}


class AdapterCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="what requests send as `model`")
    parent: str = Field(description="the served model (name or alias) it adapts")
    path: str = Field(min_length=1, description="a PEFT folder, or an s3:// prefix")


def _parent(state: GatewayState, requested: str) -> ServedModel:
    cat = served_catalog(state)
    if cat.is_adapter(requested):
        raise ApiError(
            400, f"parent: {shown(requested)} is a LoRA adapter; an adapter's parent is a "
            "served model", param="parent", code="invalid_parent",
        )  # fmt: skip
    served = cat.resolve(requested)
    if served is None:
        listed = ", ".join(repr(n) for n in cat.names())
        raise ApiError(
            404, f"parent: {shown(requested)} is not served here; this fleet serves {listed}",
            param="parent", code="model_not_found",
        )  # fmt: skip
    return served


def _taken(name: str) -> ApiError:
    return ApiError(
        409, f"name: {shown(name)} is taken already (a served model, an alias or an "
        "adapter): unload it first or choose another name", param="name", code="name_taken",
    )  # fmt: skip


@router.get("", responses=ADMIN_ERRORS)
async def list_adapters(state: StateDep, operator: OperatorDep) -> dict[str, Any]:
    cards = await adapter_cards(state, await served_adapters(state))
    return {"object": "list", "data": [c.public() for c in cards]}


@router.post("", status_code=201, responses=ADMIN_ERRORS)
async def load_adapter(
    body: AdapterCreate, state: StateDep, operator: OperatorDep
) -> dict[str, Any]:
    try:
        check_name(body.name)
    except AdapterError as e:
        raise ApiError(400, f"name: {e}", param="name", code="invalid_name") from None
    served = _parent(state, body.parent)
    loaded(state, served)  # 503 when its config could not be read
    cat = served_catalog(state)
    if cat.resolve(body.name) is not None or await lookup_async(state.aredis, cat, body.name):
        raise _taken(body.name)
    try:
        await anyio.to_thread.run_sync(check_adapter, state, body.name, served.name, body.path)
    except AdapterError as e:
        raise ApiError(400, f"path: {e}", param="path", code="invalid_adapter") from None
    ref = AdapterRef(body.name, served.name, body.path)
    if not await register_async(state.aredis, ref):
        raise _taken(body.name)  # loaded by another request meanwhile
    return (await adapter_cards(state, [ref]))[0].public()


@router.delete("/{name:path}", responses=ADMIN_ERRORS)
async def unload_adapter(name: str, state: StateDep, operator: OperatorDep) -> dict[str, Any]:
    cat = served_catalog(state)
    if cat.is_adapter(name):
        raise ApiError(
            409, f"adapter {shown(name)} is declared with its model (tide up --lora, or lora "
            "in fleet.toml): it is fixed for the fleet's life", code="adapter_declared",
        )  # fmt: skip
    if not await unregister(state.aredis, name):
        raise ApiError(404, f"adapter {shown(name)} is not loaded", code="adapter_not_found")
    return {"id": name, "object": "model", "deleted": True}
