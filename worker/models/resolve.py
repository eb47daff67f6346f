"""Where a model named on the command line or in a fleet file lives: an HF folder as is, a
GGUF file converted once into the cache, or ``dummy:<preset>[:seed]`` materialised once
(each safe across processes: built in a temporary folder and renamed into place)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from tide_fleet.infra.contract.registry import model_folder, parse_dummy
from tide_fleet.worker.models.dummy import hf_config, save_dummy


def resolve_model_path(model: str) -> Path:
    """A folder path as is; ``dummy:<preset>[:seed]`` materialised once into the cache; a
    GGUF file or a bundled model's name converted once into the cache (registry)."""
    dummy = parse_dummy(model)
    if dummy is None:
        return model_folder(model)
    preset, seed = dummy
    hf_config(preset)  # validates the preset name
    target = model_folder(model)
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{preset}-", dir=target.parent))
    try:
        save_dummy(preset, tmp, seed)
        os.replace(tmp, target) if not target.exists() else shutil.rmtree(tmp)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
