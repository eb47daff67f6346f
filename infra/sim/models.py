"""The models a simulated fleet serves: each one's name in traces and reports, its pools'
model key (infra/fleet/fleet_config.py model_key) and its bucket thresholds. A trace names a
model by served name or alias, as a client names it in a request (infra/wire/models.py);
a job that names none is the fleet's default model's."""

from __future__ import annotations

from dataclasses import dataclass

from tide_fleet.infra.fleet.fleet_config import FleetConfig, model_key
from tide_fleet.infra.settings import get_settings
from tide_fleet.infra.wire.models import ServedModel
from tide_fleet.infra.wire.protocol import bucket_for

UNNAMED = "default"  # the report's name for the model of pools with no served_name or model


@dataclass(frozen=True)
class SimModel:
    key: str  # its pools' model_key ('' for pools without a served_name)
    name: str  # in reports and --models: its served name
    served: ServedModel
    short_max: int  # its bucket thresholds (ServedModel.bucket's, read once)
    medium_max: int

    def bucket(self, total_tokens: int) -> str:
        return bucket_for(total_tokens, self.short_max, self.medium_max)


class FleetModels:
    """The fleet's models, the default first. `default_path` is the weights of pools that
    name none (the settings' model, as for the controller)."""

    def __init__(self, fleet: FleetConfig, default_path: str | None = None) -> None:
        keys, settings = fleet.model_keys(), get_settings()
        self._catalog = fleet.catalog(default_path or settings.model)
        self.by_key: dict[str, SimModel] = {}
        for key, served in zip(keys, self._catalog.models, strict=True):
            paths = [p.model for p in fleet.pools.values() if model_key(p) == key and p.model]
            name = key or (paths[0] if paths else UNNAMED)
            short = served.bucket_short_max or settings.bucket_short_max
            medium = max(served.bucket_medium_max or settings.bucket_medium_max, short + 1)
            self.by_key[key] = SimModel(key, name, served, short, medium)
        self.default = self.by_key[keys[0]]

    def resolve(self, requested: str | None) -> SimModel | None:
        """The model a trace names (None: the default), by served name or alias, or by its
        name in reports; None when the fleet serves no such model."""
        served = self._catalog.resolve(requested)
        if served is not None:
            return next(m for m in self.by_key.values() if m.served is served)
        return next((m for m in self.by_key.values() if m.name == requested), None)

    def names(self) -> list[str]:
        """The models' names in reports, the default first."""
        return [m.name for m in self.by_key.values()]

    def not_served(self, model: str | None) -> str:
        return f"model {model!r} is not served by the fleet (it serves {', '.join(self.names())})"
