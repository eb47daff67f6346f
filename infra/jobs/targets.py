"""The model a request names, as the job runs it: a served model, or a LoRA adapter on one.

A request's ``model`` is a served model's name or alias (infra/wire/models.py), or the name
of a LoRA adapter: one the fleet declares with its model, or one an operator loaded at run
time (infra/wire/adapters.py). An adapter's job is its parent's job in every way that
matters to the queue (the parent's tokenizer counts it, it waits in the parent's queues, a
worker of the parent runs it) and carries the adapter's name in the record field ``lora``;
the answers name the adapter as their ``model``. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
import redis.asyncio as aredis

from tide_fleet.infra.wire.adapters import AdapterRef, lookup, lookup_async
from tide_fleet.infra.wire.models import ModelCatalog, ServedModel


@dataclass(frozen=True)
class Target:
    served: ServedModel  # the base: its tokenizer, bucket rules, queues and workers
    adapter: str = ""  # the LoRA adapter's name; '' runs the base itself

    @property
    def name(self) -> str:
        """What the answers call the model: the adapter's name, else the served name."""
        return self.adapter or self.served.name

    def answers_to(self, requested: str | None) -> bool:
        """Whether a request naming `requested` (None: the default) runs as this target."""
        if self.adapter:
            return requested == self.adapter
        if requested is None:
            return self.served.default
        return requested in (self.served.name, *self.served.aliases)

    def record_fields(self) -> dict[str, str]:
        """The job record's fields that say what runs it: ``model`` (the served base) and,
        for an adapter, ``lora``."""
        return {"model": self.served.name, **({"lora": self.adapter} if self.adapter else {})}


def _of_ref(catalog: ModelCatalog, ref: AdapterRef | None) -> Target | None:
    parent = catalog.resolve(ref.parent) if ref is not None else None
    if ref is None or parent is None:
        return None  # an adapter whose parent this fleet no longer serves is not served
    return Target(parent, ref.name)


def _declared(catalog: ModelCatalog, requested: str | None) -> Target | None:
    served = catalog.resolve(requested)
    if served is None:
        return None
    return Target(served, requested if requested and catalog.is_adapter(requested) else "")


def find_target(
    r: redis.Redis | None, catalog: ModelCatalog, requested: str | None
) -> Target | None:
    """The target `requested` names: a served model or a declared adapter (from the
    catalog), else an adapter loaded at run time (from Redis; `r` None: the catalog only);
    None when none goes by it."""
    found = _declared(catalog, requested)
    if found is not None or requested is None or r is None:
        return found
    return _of_ref(catalog, lookup(r, catalog, requested))


async def find_target_async(
    r: aredis.Redis, catalog: ModelCatalog, requested: str | None
) -> Target | None:
    found = _declared(catalog, requested)
    if found is not None or requested is None:
        return found
    return _of_ref(catalog, await lookup_async(r, catalog, requested))
