"""The LoRA adapters a fleet serves, by name: where each one's files are and its base model.

Two sources, one view. Adapters declared with their served model (``tide up --lora
NAME=PATH``, ``lora`` in fleet.toml: ``ServedModel.adapters``) are fixed for the fleet's life;
adapters an operator loads at run time (``POST /v1/adapters``) live in the Redis hash
``tide:adapters`` (name -> JSON ``{"parent", "path"}``) until unloaded. A request names an
adapter by its ``model``; the job goes to its parent's queues and carries the adapter's
name (the job field ``lora``); a worker of the parent looks the name up here and loads the
files itself. Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aredis

from tide_fleet.infra.wire.models import ModelCatalog

ADAPTERS_KEY = "tide:adapters"


@dataclass(frozen=True)
class AdapterRef:
    name: str  # what clients send as `model`
    parent: str  # the served name of its base model
    path: str  # a local folder or an s3:// prefix (infra/contract/adapters.py)
    declared: bool = False  # from the catalog (not unloadable at run time)

    def to_json(self) -> str:
        return json.dumps({"parent": self.parent, "path": self.path})

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "parent": self.parent, "path": self.path,
                "declared": self.declared}  # fmt: skip


def declared(catalog: ModelCatalog) -> dict[str, AdapterRef]:
    """The adapters the catalog declares, by name."""
    return {
        name: AdapterRef(name, m.name, path, declared=True)
        for m in catalog.models
        for name, path in m.adapters
    }


def _decode(name: str, raw: bytes | str | None) -> AdapterRef | None:
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        return AdapterRef(name, str(data["parent"]), str(data["path"]))
    except (ValueError, KeyError, TypeError):
        return None  # a record this version cannot read is not served


def lookup(r: redis.Redis, catalog: ModelCatalog, name: str) -> AdapterRef | None:
    """The adapter served as `name`: declared ones first, then those loaded at run time."""
    found = declared(catalog).get(name)
    return found if found is not None else _decode(name, r.hget(ADAPTERS_KEY, name))


async def lookup_async(r: aredis.Redis, catalog: ModelCatalog, name: str) -> AdapterRef | None:
    found = declared(catalog).get(name)
    return found if found is not None else _decode(name, await r.hget(ADAPTERS_KEY, name))


def _merge(catalog: ModelCatalog, raw: dict[Any, Any]) -> list[AdapterRef]:
    fixed = declared(catalog)
    loaded = []
    for key, value in raw.items():
        name = key.decode() if isinstance(key, bytes) else str(key)
        ref = _decode(name, value)
        if ref is not None and name not in fixed:
            loaded.append(ref)
    return sorted([*fixed.values(), *loaded], key=lambda a: (a.parent, a.name))


def all_adapters(r: redis.Redis, catalog: ModelCatalog) -> list[AdapterRef]:
    """Every served adapter, by parent then name."""
    return _merge(catalog, r.hgetall(ADAPTERS_KEY))


async def all_adapters_async(r: aredis.Redis, catalog: ModelCatalog) -> list[AdapterRef]:
    return _merge(catalog, await r.hgetall(ADAPTERS_KEY))


async def register_async(r: aredis.Redis, ref: AdapterRef) -> bool:
    """Load an adapter at run time; False when the name is taken already."""
    return bool(await r.hsetnx(ADAPTERS_KEY, ref.name, ref.to_json()))


async def unregister_async(r: aredis.Redis, name: str) -> bool:
    """Unload a run-time adapter; False when none is loaded under the name."""
    return bool(await r.hdel(ADAPTERS_KEY, name))
