"""Native CPU kernels (kernels/csrc/cpu_kernels.cpp), compiled on first use.

``ops()`` builds the C++ file once per machine with ``-O3 -march=native`` through
``torch.utils.cpp_extension`` (cached under ``$TIDE_KERNEL_CACHE`` or
``~/.cache/tide/kernels``) and returns ``torch.ops.tide``, or ``None`` where the build
is impossible (no compiler, ``TIDE_CPU_KERNELS=0``); the engine then keeps the torch
reference path, and says so once in the log.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "cpu_kernels.cpp"


def _cache_dir() -> Path:
    root = os.environ.get("TIDE_KERNEL_CACHE") or Path.home() / ".cache" / "tide" / "kernels"
    # One folder per source and torch version: an edit or an upgrade rebuilds.
    tag = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode()).hexdigest()[:12]
    path = Path(root) / f"cpu-{tag}"
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.cache
def ops() -> Any:
    """torch.ops.tide with the native kernels loaded, or None (see the module doc)."""
    if os.environ.get("TIDE_CPU_KERNELS", "1") == "0":
        log.info("native CPU kernels disabled by TIDE_CPU_KERNELS=0")
        return None
    try:
        from torch.utils import cpp_extension

        cpp_extension.load(
            name="tide_cpu_kernels",
            sources=[str(SOURCE)],
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            build_directory=str(_cache_dir()),
            is_python_module=False,
            verbose=False,
        )
    except Exception as exc:  # any build failure means: use the torch path
        log.warning("native CPU kernels unavailable (%s); using the torch reference path", exc)
        return None
    return torch.ops.tide


def gemv_max_rows() -> int:
    """Largest row count the native bf16 GEMV takes (0: not on this CPU or not built)."""
    native = ops()
    return int(native.gemv_max_rows()) if native is not None else 0
