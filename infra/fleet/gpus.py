"""The GPUs local workers may use: one worker per GPU, each pinned by CUDA_VISIBLE_DEVICES.

Without pinning, every local worker's CUDA context lands on GPU 0 and each sizes its KV
pool from the same memory. The GPUs are those `CUDA_VISIBLE_DEVICES` of the workers'
environment names (as given: ids or UUIDs), else those `nvidia-smi -L` lists; none on a
machine without either (workers then run where their --device says, unpinned).
"""

from __future__ import annotations

import shutil
import subprocess

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
