"""``GET /v1/models`` and ``GET /v1/models/{id}``: every served model and LoRA adapter, in
OpenAI's shape.

Each card has OpenAI's fields (``id``, ``object``, ``created``, ``owned_by``: what the
official client's ``models.list()`` and ``models.retrieve()`` parse) and Tide's: the
context (``max_model_len``), the other names it answers to, whether it is the default,
``root`` (its weights: a model's path, an adapter's folder or s3:// prefix), and live
state: the pools its workers run in, its warm (serving, not draining) workers and its
queued jobs (read now from the heartbeats and the backlog, one round trip each). A LoRA
adapter's card follows its parent's (``parent``: the served name of its base): it runs on
the parent's workers and shares its queues, so those live figures are the parent's; it
adds ``rank`` and ``targets`` (the projections it adapts) where the gateway has read them
(gateway/adapters.py).
"""

from __future__ import annotations

import time
from typing import Any, Literal

import redis
from fastapi import APIRouter
from pydantic import BaseModel

from tide_fleet.gateway.adapters import specs
from tide_fleet.gateway.deps import GatewayState, StateDep, TenantDep
from tide_fleet.gateway.routes.jobs import ERRORS
from tide_fleet.gateway.served import pick, served_catalog
from tide_fleet.infra.jobs.public import ErrorBody
from tide_fleet.infra.jobs.targets import find_target_async
from tide_fleet.infra.wire.adapters import (
    AdapterRef,
    all_adapters_async,
    declared,
    lookup_async,
)
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
    root: str | None = None
    parent: str | None = None  # a LoRA adapter's base, by its served name
    max_model_len: int | None = None
    aliases: list[str] = []
    default: bool = False
    pools: list[str] = []
    warm_workers: int = 0
    queued_jobs: int = 0
    # A LoRA adapter's: its largest rank, the projections it adapts, and whether the fleet
    # declares it (fixed) or an operator loaded it at run time (POST /v1/adapters).
    rank: int | None = None
    targets: list[str] | None = None
    declared: bool | None = None

    def public(self) -> dict[str, Any]:
        """The card as JSON: a served model's without the adapter-only fields."""
        adapter_only = {"parent", "rank", "targets", "declared"}
        return self.model_dump(exclude=None if self.parent else adapter_only)


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
            id=m.name, root=m.path, max_model_len=info.config.max_model_len if info else None,
            aliases=list(m.aliases), default=m.default,
            pools=sorted({b.pool for b in mine}),
            warm_workers=sum(not b.draining for b in mine), queued_jobs=queued.get(m.lane, 0),
        ))  # fmt: skip
    return cards


async def adapter_cards(
    state: GatewayState, refs: list[AdapterRef], parent_cards: list[ModelCard] | None = None
) -> list[ModelCard]:
    """A card per adapter: its parent's card (from `parent_cards` when given), renamed, with
    the adapter's own fields."""
    if parent_cards is None:
        cat = served_catalog(state)
        parents = [m for m in cat.models if any(r.parent == m.name for r in refs)]
        parent_cards = await _cards(state, parents)
    by_parent = {c.id: c for c in parent_cards}
    found = await specs(state, refs)
    cards = []
    for ref in refs:
        spec = found.get(ref.name)
        cards.append(by_parent[ref.parent].model_copy(update={
            "id": ref.name, "root": ref.path, "parent": ref.parent, "aliases": [],
            "default": False, "declared": ref.declared,
            "rank": spec.rank if spec else None, "targets": spec.targets if spec else None,
        }))  # fmt: skip
    return cards


async def served_adapters(state: GatewayState) -> list[AdapterRef]:
    """Every adapter this fleet serves (declared, and loaded at run time unless Redis is
    unreachable), by parent then name; those of a parent no longer served left out."""
    cat = served_catalog(state)
    try:
        refs = await all_adapters_async(state.aredis, cat)
    except redis.RedisError:
        refs = list(declared(cat).values())
    return [r for r in refs if cat.resolve(r.parent) is not None]


@router.get("/models")
async def list_models(state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    cards = await _cards(state, served_catalog(state).models)
    cards += await adapter_cards(state, await served_adapters(state), cards)
    return {"object": "list", "data": [c.public() for c in cards]}


@router.get(
    "/models/{model_id:path}",
    responses={**ERRORS, 404: {"model": ErrorBody, "description": "no such served model"}},
)
async def retrieve_model(model_id: str, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    cat = served_catalog(state)
    target = await find_target_async(state.aredis, cat, model_id)
    if target is None:
        pick(state, model_id)  # answers 404 model_not_found, naming what is served
    assert target is not None
    if not target.adapter:
        return (await _cards(state, [target.served]))[0].public()
    ref = await lookup_async(state.aredis, cat, target.adapter)
    if ref is None:  # unloaded since
        pick(state, model_id)
    assert ref is not None
    return (await adapter_cards(state, [ref]))[0].public()
