"""The models a fleet serves: each one's served name (and aliases), weights and bucket rules.

One fleet may serve many models. Clients name one in a request's ``model``; the gateway
tokenises with it, the job goes to that model's queues, a worker of that model takes it.
The *default* model (a request without ``model``) keeps the queue and backlog names a
one-model fleet always had (``tide.<bucket>.<priority>``, ``tide:backlog:<bucket>``); every
other model has its own *lane*, its served name, in them (infra/wire/protocol.py). The
catalog travels to every process as ``TIDE_SERVED_MODELS`` (JSON, infra/settings.py); with
none, the fleet serves ``TIDE_MODEL`` alone. Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire.protocol import bucket_for, check_lane


@dataclass(frozen=True)
class ServedModel:
    name: str  # what clients send as `model`; the lane of its queues unless it is the default
    path: str  # HF folder, s3:// prefix or dummy:PRESET
    aliases: tuple[str, ...] = ()
    bucket_short_max: int | None = None  # None: the settings' thresholds
    bucket_medium_max: int | None = None
    default: bool = False
    # LoRA adapters on these weights, (name, path) each: served under their own names
    # (infra/wire/adapters.py), queued in this model's lane.
    adapters: tuple[tuple[str, str], ...] = ()

    @property
    def lane(self) -> str:
        """'' for the default model (today's queue names), else the served name."""
        return "" if self.default else self.name

    def bucket(self, total_tokens: int, settings: Settings) -> str:
        """The bucket of a job of this model: its own thresholds where it has them."""
        short = self.bucket_short_max or settings.bucket_short_max
        medium = self.bucket_medium_max or settings.bucket_medium_max
        return bucket_for(total_tokens, short, max(medium, short + 1))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "model": self.path, "aliases": list(self.aliases),
            "bucket_short_max": self.bucket_short_max,
            "bucket_medium_max": self.bucket_medium_max,
            "lora": dict(self.adapters),
        }  # fmt: skip


@dataclass
class ModelCatalog:
    """The served models, the default first; names and aliases are unique."""

    models: list[ServedModel]
    _by_name: dict[str, ServedModel] = field(init=False, repr=False)
    _adapter_names: set[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("served models: at least one")
        self._by_name = {}
        for m in self.models:
            check_lane(m.name)
            for n in (m.name, *m.aliases, *(a for a, _ in m.adapters)):
                if n in self._by_name:
                    raise ValueError(f"served models: the name {n!r} is used twice")
                self._by_name[n] = m
        self._adapter_names = {a for m in self.models for a, _ in m.adapters}

    @property
    def default(self) -> ServedModel:
        return self.models[0]

    def resolve(self, requested: str | None) -> ServedModel | None:
        """The model a request names (None: the default); None when nothing is served so."""
        return self.default if requested is None else self._by_name.get(requested)

    def is_adapter(self, requested: str | None) -> bool:
        """Whether `requested` is a declared LoRA adapter (``resolve`` gives its parent)."""
        return requested in self._adapter_names

    def runs(self, beat_model: str) -> str:
        """The served name of the model a worker's heartbeat names: an alias is its model's
        name, a name not served here stays as it is, none (an older worker) is the default."""
        served = self.resolve(beat_model or None)
        return served.name if served is not None else beat_model

    def names(self) -> list[str]:
        return [m.name for m in self.models]

    def for_worker(self, name: str | None, path: str | None) -> ServedModel:
        """What a worker serves: the model served as `name` (a name not in the catalog is a
        model of its own, in its own lane), else the one with weights `path`, else the
        default; `path` given always names the weights it loads."""
        if name is not None:
            m = self._by_name.get(name)
            if m is None:
                return ServedModel(check_lane(name), path or self.default.path)
            return m if path is None else replace(m, path=path)
        if path is not None:
            same = [m for m in self.models if m.path == path]
            return same[0] if same else replace(self.default, path=path)
        return self.default

    def to_json(self) -> str:
        return json.dumps([m.to_dict() for m in self.models])


def served(specs: list[dict[str, Any]], fallback_model: str) -> ModelCatalog:
    """The catalog from `specs` (the first is the default); none: `fallback_model` alone."""
    if not specs:
        return ModelCatalog([ServedModel(fallback_model, fallback_model, default=True)])
    models = []
    for i, s in enumerate(specs):
        path = s.get("model") or fallback_model
        models.append(ServedModel(
            name=s.get("name") or path, path=path, aliases=tuple(s.get("aliases") or ()),
            bucket_short_max=s.get("bucket_short_max"),
            bucket_medium_max=s.get("bucket_medium_max"), default=i == 0,
            adapters=tuple((s.get("lora") or {}).items()),
        ))  # fmt: skip
    return ModelCatalog(models)


def catalog(settings: Settings) -> ModelCatalog:
    """This fleet's served models (TIDE_SERVED_MODELS, else TIDE_MODEL alone)."""
    return served(settings.served_models, settings.model)
