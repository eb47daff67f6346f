"""``GET /v1/models`` and ``GET /v1/models/{id}``: every served model, in OpenAI's shape.

Each card has OpenAI's fields (``id``, ``object``, ``created``, ``owned_by``: what the
official client's ``models.list()`` and ``models.retrieve()`` parse) and Tide's: the
context (``max_model_len``), the other names it answers to, whether it is the default,
and live state: the pools its workers run in, its warm (serving, not draining) workers and
its queued jobs (read now from the heartbeats and the backlog, one round trip each).
"""

from __future__ import annotations

import time
from typing import Any, Literal

import redis
from fastapi import APIRouter
from pydantic import BaseModel

from tide_fleet.gateway.deps import GatewayState, StateDep, TenantDep
from tide_fleet.gateway.routes.jobs import ERRORS
from tide_fleet.gateway.served import pick, served_catalog
from tide_fleet.infra.jobs.public import ErrorBody
from tide_fleet.infra.wire.backlog import read_lanes_async
from tide_fleet.infra.wire.heartbeats import read_heartbeats_async
from tide_fleet.infra.wire.models import ServedModel

router = APIRouter(prefix="/v1", tags=["openai"])

STARTED = int(time.time())  # OpenAI's `created`: here, when this gateway started


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = STARTED
    owned_by: str = "tide"
    max_model_len: int | None = None
    aliases: list[str] = []
    default: bool = False
    pools: list[str] = []
    warm_workers: int = 0
    queued_jobs: int = 0


async def _cards(state: GatewayState, models: list[ServedModel]) -> list[ModelCard]:
    lanes = [m.lane for m in models]
    queued: dict[str, int] = {}
    beats = {}
    try:
        backlog = await read_lanes_async(state.aredis, lanes)
        queued = {lane: sum(b.jobs for b in backlog[lane].values()) for lane in lanes}
        beats = await read_heartbeats_async(state.aredis)
    except redis.RedisError:
        pass  # the cards without live state
    cat = served_catalog(state)
    cards = []
    for m in models:
        mine = [b for b in beats.values() if b.pool and cat.runs(b.model) == m.name]
        info = state.models.get(m.name)
        cards.append(ModelCard(
            id=m.name, max_model_len=info.config.max_model_len if info else None,
            aliases=list(m.aliases), default=m.default,
            pools=sorted({b.pool for b in mine}),
            warm_workers=sum(not b.draining for b in mine), queued_jobs=queued.get(m.lane, 0),
        ))  # fmt: skip
    return cards


@router.get("/models")
async def list_models(state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    cards = await _cards(state, served_catalog(state).models)
    return {"object": "list", "data": [c.model_dump() for c in cards]}


@router.get(
    "/models/{model_id:path}",
    responses={**ERRORS, 404: {"model": ErrorBody, "description": "no such served model"}},
)
async def retrieve_model(model_id: str, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    served = served_catalog(state).resolve(model_id)
    if served is None:
        pick(state, model_id)  # answers 404 model_not_found, naming what is served
    assert served is not None
    return (await _cards(state, [served]))[0].model_dump()
