"""The GPUs local workers may use: each worker gets its own, pinned by CUDA_VISIBLE_DEVICES; a
worker of a pool with ``gpus_per_worker`` N gets a group of N (``CUDA_VISIBLE_DEVICES=2,3``).

Without pinning, every local worker's CUDA context lands on GPU 0 and each sizes its KV
pool from the same memory. The GPUs are those `CUDA_VISIBLE_DEVICES` of the workers'
environment names (as given: ids or UUIDs), else those `nvidia-smi -L` lists; none on a
machine without either (workers then run where their --device says, unpinned).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Collection

VISIBLE = "CUDA_VISIBLE_DEVICES"


def visible_gpus(env: dict[str, str]) -> list[str]:
    if VISIBLE in env:
        return [g.strip() for g in env[VISIBLE].split(",") if g.strip() and g.strip() != "-1"]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(l for l in out.splitlines() if l.startswith("GPU "))]


def free_group(gpus: list[str], held: Collection[str], n: int) -> list[str] | None:
    """`n` of `gpus` that are not `held`, or None when fewer are free. An aligned block (the
    k-th run of `n` in `gpus`: 0-1, 2-3, ... for pairs) is preferred while one is wholly free:
    it leaves the other blocks whole for later groups, and neighbouring GPUs often share a
    PCIe switch. Else the first `n` free."""
    free = [g for g in gpus if g not in held]
    if len(free) < n:
        return None
    for start in range(0, len(gpus) - n + 1, n):
        block = gpus[start : start + n]
        if not any(g in held for g in block):
            return block
    return free[:n]
