"""Where a model name points, without importing torch (the gateway uses this too).

``dummy:<preset>[:seed]`` lives in the cache folder once materialised (see
``worker.models.dummy.resolve_model_path``); anything else is a folder path.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_SEED = 0
DUMMY_FORMAT = 2  # bump when save_dummy writes something new, so stale caches are rebuilt


def cache_dir() -> Path:
    return Path(os.environ.get("TIDE_CACHE_DIR") or Path.home() / ".cache" / "tide")


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
