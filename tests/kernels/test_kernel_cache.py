"""The native kernels' build cache: shared by checkouts, never blocked by a dead builder.

One real build (about 30 s on two cores) serves the whole module; every other process
here only loads it, or holds the build lock.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tide_fleet.kernels import cpu as cpu_kernels

REPO = Path(__file__).resolve().parents[2]
LOAD = "from kernels import cpu; assert cpu.ops() is not None, 'kernels not loaded'"
HOLD = (
    "import sys, time; from pathlib import Path; from tide_fleet.kernels.build_lock import held\n"
    "with held(Path(sys.argv[1]), wait_s=0):\n"
    "    print('held', flush=True); time.sleep(120)\n"
)
needs_native = pytest.mark.skipif(
    cpu_kernels.ops() is None, reason="native CPU kernels could not be built here"
)


def make_checkout(parent: Path, name: str) -> Path:
    """Another clone's copy of the kernels package, at a path of its own."""
    root = parent / name
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "kernels", root / "kernels", ignore=skip)
    return root


def run_python(
    args: list[str], checkout: Path, cache: Path, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TIDE_KERNEL_CACHE": str(cache), "PYTHONPATH": str(checkout)}
    return subprocess.run(
        [sys.executable, "-c", *args],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_holder(lock: Path) -> subprocess.Popen[str]:
    """A live process holding the build lock, once it has said so."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lock)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def built_library(cache: Path) -> Path:
    [library] = cache.glob("cpu-*/*.so")
    return library


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(cache root, first checkout), with the kernels built from that checkout."""
    parent = tmp_path_factory.mktemp("checkouts")
    cache, first = parent / "cache", make_checkout(parent, "first")
    result = run_python([LOAD], first, cache, timeout=300)
    assert result.returncode == 0, result.stderr
    return cache, first


@pytest.mark.slow
@needs_native
def test_a_second_checkout_loads_the_first_ones_build(built, tmp_path):
    cache, _ = built
    library = built_library(cache)
    before = library.stat().st_mtime_ns
    result = run_python([LOAD], make_checkout(tmp_path, "second"), cache)
    assert result.returncode == 0, result.stderr
    assert built_library(cache) == library, "both checkouts use one build folder"
    assert library.stat().st_mtime_ns == before, "the second checkout rebuilt the first one's"


@pytest.mark.slow
@needs_native
def test_a_torch_lock_left_by_a_killed_build_does_not_block_a_load(built):
    cache, checkout = built
    # What a build killed mid-way leaves behind: torch's baton file, fresh.
    (built_library(cache).parent / "lock").touch()
    started = time.monotonic()
    result = run_python([LOAD], checkout, cache, timeout=60)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 30


@pytest.mark.slow
@needs_native
def test_a_build_lock_held_by_a_killed_process_does_not_block_a_load(built):
    cache, checkout = built
    lock = built_library(cache).parent / cpu_kernels.LOCK_NAME
    holder = start_holder(lock)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    result = run_python([LOAD], checkout, cache, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "waiting" not in result.stderr


def test_a_live_holder_makes_a_load_wait_at_most_the_bound_then_fall_back(tmp_path, caplog):
    directory = tmp_path / "cpu-test"
    lock = directory / cpu_kernels.LOCK_NAME
    holder = start_holder(lock)
    try:
        started = time.monotonic()
        with caplog.at_level(logging.WARNING):
            assert cpu_kernels.load(directory, wait_s=1.0) is None
        waited = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    assert 1.0 <= waited < 5.0
    assert str(lock) in caplog.text and f"pid {holder.pid}" in caplog.text
    assert "torch reference path" in caplog.text


def test_a_short_wait_goes_unsaid_and_a_long_one_names_the_holder(tmp_path, caplog):
    from tide_fleet.kernels.build_lock import QUIET_S, held

    lock = tmp_path / "build.lock"
    for seconds, says in ((0.4, False), (QUIET_S + 0.6, True)):
        ready = threading.Event()

        def hold(seconds: float = seconds, ready: threading.Event = ready) -> None:
            with held(lock, wait_s=0):
                ready.set()
                time.sleep(seconds)

        holder = threading.Thread(target=hold)
        holder.start()
        ready.wait(10)
        caplog.clear()
        with caplog.at_level(logging.WARNING), held(lock, wait_s=30):
            pass
        holder.join()
        assert ("waiting up to 30 s" in caplog.text) is says, caplog.text
        assert (f"pid {os.getpid()}" in caplog.text) is says
