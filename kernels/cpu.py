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
import time
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "cpu_kernels.cpp"
STALE_LOCK_S = 600


def _cache_dir() -> Path:
    root = os.environ.get("TIDE_KERNEL_CACHE") or Path.home() / ".cache" / "tide" / "kernels"
    # One folder per source and torch version: an edit or an upgrade rebuilds.
    tag = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode()).hexdigest()[:12]
    path = Path(root) / f"cpu-{tag}"
    path.mkdir(parents=True, exist_ok=True)
    # torch's build lock outlives a build that was killed; every other process would
    # then wait on it forever. A real build takes well under STALE_LOCK_S.
    lock = path / "lock"
    try:
        if time.time() - lock.stat().st_mtime > STALE_LOCK_S:
            log.warning("removing a stale kernel build lock %s", lock)
            lock.unlink(missing_ok=True)
    except FileNotFoundError:
        pass
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


def main() -> int:
    """Build now and say what is available (``make kernels``, before tests and workers)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    native = ops()
    if native is None:
        print("native CPU kernels: not available; the engine uses its torch path")
    else:
        print(
            f"native CPU kernels: ready in {_cache_dir()} "
            f"(GEMV for up to {gemv_max_rows()} rows; 0 = this CPU lacks AVX-512 BF16)"
        )
    return 0
