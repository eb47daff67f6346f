"""LoRA adapters declared with a fleet's models: fleet.toml's per-pool ``lora`` tables and
``tide up --lora NAME=PATH``, merged per model and checked once at start-up.

In fleet.toml a pool names the adapters served on its model::

    [pools.chat]
    model = "/models/llama-8b"
    served_name = "llama-8b"
    buckets = ["short", "medium", "long"]
    lora = { sql = "/adapters/sql", support = "s3://bucket/adapters/support" }

Pools of one model may each list adapters: the model serves them all (one name, one path).
A name is 1 to 128 letters, digits and ``._:/-``, and unique in the fleet among served
names, aliases and adapters. They travel in TIDE_SERVED_MODELS (``"lora"``,
infra/wire/models.py). ``check_declared`` reads every adapter against its base's config
before anything starts (infra/contract/adapters.py), so a mismatch stops ``tide up`` with
the adapter and the mismatch named. Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tide_fleet.infra.contract.adapters import AdapterError, AdapterSpec, check_name, read_adapter
from tide_fleet.infra.contract.model_config import ModelConfig, ModelLoadError
from tide_fleet.infra.contract.registry import model_folder
from tide_fleet.infra.wire.models import ModelCatalog, ServedModel

SLOT_RANK = 16  # the engine's slot rank when no declared adapter needs more


def check_lora_table(table: dict[str, str]) -> dict[str, str]:
    """A pool's ``lora`` table: each name valid, each path given; ValueError names the
    adapter (pydantic adds the field: ``pools.<pool>.lora``)."""
    for name, path in table.items():
        try:
            check_name(name)
        except AdapterError as e:
            raise ValueError(str(e)) from None
        if not path.strip():
            raise ValueError(f"{name!r}: the path is empty: give a PEFT folder or s3:// prefix")
    return table


def merge_lora(
    tables: Iterable[tuple[str, str, dict[str, str]]], taken: set[str]
) -> dict[str, dict[str, str]]:
    """Each model's adapters, from (pool, model key, lora table) triples; ValueError naming
    ``pools.<pool>.lora.<name>`` when a name is another model's adapter, another path for
    the same model's, or a served name or alias (`taken`)."""
    merged: dict[str, dict[str, str]] = {}
    owner: dict[str, tuple[str, str, str]] = {}  # adapter name -> (pool, model key, path)
    for pool, key, table in tables:
        for name, path in table.items():
            where = f"pools.{pool}.lora.{name}"
            if name in taken:
                raise ValueError(f"{where}: {name!r} is a served model's name or alias")
            seen = owner.setdefault(name, (pool, key, path))
            if seen[1] != key:
                raise ValueError(f"{where}: {name!r} is an adapter of pool {seen[0]}'s model too")
            if seen[2] != path:
                raise ValueError(
                    f"{where}: {name!r} is {seen[2]!r} in pool {seen[0]}, not {path!r}"
                )
            merged.setdefault(key, {})[name] = path
    return merged


def _base_config(model: ServedModel) -> ModelConfig | None:
    """The base's config where it is on this machine (None: an s3:// model not fetched)."""
    try:
        return ModelConfig.from_folder(model_folder(model.path))
    except (OSError, ModelLoadError):
        return None


def check_declared(
    catalog: ModelCatalog, cache_dir: Path | None = None
) -> tuple[dict[str, AdapterSpec], list[str]]:
    """Every declared adapter read and checked against its base's config: (specs by name,
    the names left unchecked because their base's config is not on this machine: an
    s3:// model, which its workers check when they load it). AdapterError names the adapter,
    its model and the mismatch."""
    specs: dict[str, AdapterSpec] = {}
    unchecked: list[str] = []
    for m in catalog.models:
        config = _base_config(m) if m.adapters else None
        if config is None:
            unchecked += [name for name, _ in m.adapters]
            continue
        for name, path in m.adapters:
            try:
                specs[name] = read_adapter(name, path, config, cache_dir=cache_dir)
            except AdapterError as e:
                raise AdapterError(f"adapter {name!r} on model {m.name!r}: {e}") from None
    return specs, unchecked


def slot_rank(model: ServedModel, cache_dir: Path | None = None) -> int:
    """A worker's slot rank: the largest rank of its model's declared adapters, at least
    SLOT_RANK. One that cannot be read is left out: the worker refuses its jobs, naming
    why, and serves the others."""
    config = _base_config(model) if model.adapters else None
    ranks = [SLOT_RANK]
    for name, path in model.adapters if config is not None else ():
        try:
            ranks.append(read_adapter(name, path, config, cache_dir=cache_dir).rank)
        except AdapterError:
            continue
    return max(ranks)
