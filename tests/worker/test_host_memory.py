"""worker/engine/host_memory.py: on glibc the step-buffer thresholds are set (mallopt answers
1), so a CPU step's freed activations stay in the heap for the next step."""

from __future__ import annotations

import platform

import pytest

from tide_fleet.worker.engine import host_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_thresholds():
    host_memory.keep_step_buffers.cache_clear()
    assert host_memory.keep_step_buffers() is True


def test_a_libc_without_mallopt_is_reported_not_raised(monkeypatch):
    host_memory.keep_step_buffers.cache_clear()
    monkeypatch.setattr(host_memory.ctypes.util, "find_library", lambda name: "/nonexistent/libc")
    try:
        assert host_memory.keep_step_buffers() is False
    finally:
        host_memory.keep_step_buffers.cache_clear()
