"""glibc's allocator on a CPU worker: keep freed step buffers for the next step.

A CPU step allocates its activations afresh (tens of MB at a 1,024-token step). glibc
hands buffers above its mmap threshold back to the kernel when they are freed, so the next
step page-faults and zeroes them again: 53,672 minor faults in one run of the mixed bench
(200 requests, dummy:bench) against 6,160 with the settings below; 1.03x output tok/s in two
alternating pairs with the same thresholds set through GLIBC_TUNABLES, on
scripts/bench_engine.py's workload. Buffers up
to MMAP_THRESHOLD come from the heap, and up to TRIM_THRESHOLD of free heap top stays
mapped. Larger ones (the KV pool, the weights) are still mapped on their own.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for this setting on 64-bit
TRIM_THRESHOLD = 1 << 30


@functools.cache
def keep_step_buffers() -> bool:
    """Set the two thresholds once per process; False where this is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    if not ok:
        log.info("mallopt refused the step-buffer thresholds; freed buffers go back to the OS")
    return ok
