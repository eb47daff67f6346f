"""Where a model name points, without importing torch (the gateway uses this too).

``dummy:<preset>[:seed]`` lives in the cache folder once materialised (see
``worker.models.resolve.resolve_model_path``); anything else is a folder path. Where Tide's
settings cannot be imported (an engine-only install), only folder paths work.
"""

from __future__ import annotations

from pathlib import Path

try:
    from infra.settings import get_settings
except ImportError:  # an engine-only install (scripts/gpu_check.py): model folders only
    HAS_SETTINGS = False
else:
    HAS_SETTINGS = True

DEFAULT_SEED = 0
DUMMY_FORMAT = 2  # bump when save_dummy writes something new, so stale caches are rebuilt


def cache_dir() -> Path:
    if not HAS_SETTINGS:
        raise RuntimeError(
            "dummy models live in the cache folder, a Tide setting, and Tide's settings "
            "(infra.settings: pydantic-settings) cannot be imported here: name a model folder"
        )
    return get_settings().cache_dir


def parse_dummy(model: str) -> tuple[str, int] | None:
    """(preset, seed) for a ``dummy:`` name, else None."""
    if not model.startswith("dummy:"):
        return None
    _, preset, *rest = model.split(":")
    return preset, int(rest[0]) if rest else DEFAULT_SEED


def model_folder(model: str) -> Path:
    """The folder a model name refers to (it may not exist yet for a dummy model)."""
    dummy = parse_dummy(model)
    if dummy is None:
        return Path(model)
    preset, seed = dummy
    return cache_dir() / "dummy" / f"{preset}-seed{seed}-v{DUMMY_FORMAT}"
