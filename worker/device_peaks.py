"""The peaks a worker's MFU and MBU are relative to: the settings' overrides first, then the
device table (infra/plan/devices.py) for a known GPU, else a short measurement at start-up."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from tide_fleet.infra.plan.devices import get_device, guess_device
from tide_fleet.infra.plan.roofline import DevicePeaks
from tide_fleet.infra.settings import Settings


@functools.cache
def measure_peaks(device: str, dtype_name: str) -> DevicePeaks:
    """A matmul and a large copy, best of three each: well under a second on a CPU."""
    import torch  # only here: the peaks of a known GPU come from the table, without torch

    dev, dtype = torch.device(device), getattr(torch, dtype_name)
    n, numel = (8192, 1 << 28) if dev.type == "cuda" else (1024, 1 << 25)

    def best_of(fn: Callable[[], Any], repeats: int = 3) -> float:
        fn()  # warm-up: page faults, kernel selection
        times = []
        for _ in range(repeats):
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            start = time.perf_counter()
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            times.append(time.perf_counter() - start)
        return max(min(times), 1e-9)

    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    flops = 2 * n**3 / best_of(lambda: a @ b)
    src = torch.empty(numel, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    bandwidth = 2 * src.nbytes / best_of(lambda: dst.copy_(src))  # read + write
    return DevicePeaks(flops, bandwidth, "measured")


def device_peaks(device: str, dtype_name: str, settings: Settings | None = None) -> DevicePeaks:
    """Overrides first, then the device table (a known GPU), else a start-up measurement."""
    spec = None
    if settings is not None and settings.worker_device:
        spec = get_device(settings.worker_device)
    elif device.startswith("cuda"):
        import torch  # a CUDA device: the worker has loaded torch already

        spec = guess_device(torch.cuda.get_device_name(torch.device(device)))
    if spec is not None and spec.name != "cpu":
        peaks = DevicePeaks.from_spec(spec, dtype_name)
    else:
        peaks = measure_peaks(device, dtype_name)
    if settings is not None and (settings.worker_peak_flops or settings.worker_peak_bandwidth):
        peaks = DevicePeaks(
            settings.worker_peak_flops or peaks.flops,
            settings.worker_peak_bandwidth or peaks.bandwidth,
            "override",
        )
    return peaks
