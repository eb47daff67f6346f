"""The controller with the local actuator and real `tide worker` processes: a burst of
jobs scales a pool 0 -> 2 -> 0, every job completes once, no busy worker is removed."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import redis

from tests.conftest import wait_for
from tide_fleet.infra.fleet.controller import Controller
from tide_fleet.infra.fleet.fleet_config import parse_fleet
from tide_fleet.infra.fleet.local_actuator import LocalActuator
from tide_fleet.infra.fleet.redis_server import EmbeddedRedis
from tide_fleet.infra.jobs.schemas import JobCreate
from tide_fleet.infra.jobs.submission import ModelInfo, build_job
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire.backlog import read_backlog
from tide_fleet.infra.wire.jobstore import JobStore

pytestmark = pytest.mark.slow


def test_a_burst_scales_the_local_pool_0_2_0(tmp_path: Path, tiny_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis").start()
    stop = threading.Event()
    try:
        client = redis.Redis.from_url(server.url)
        settings = Settings(
            redis_url=server.url, model=str(tiny_path), worker_heartbeat_seconds=0.3,
            lease_seconds=3, reaper_interval=0.3,
        )  # fmt: skip
        fleet = parse_fleet(
            {
                "controller": {"poll_interval_s": 0.3, "scale_in_cooldown_s": 1.0},
                "pools": {
                    "cpu": {
                        "buckets": ["short", "medium", "long"], "max_workers": 2,
                        "target_wait_s": 2, "idle_s": 2, "tokens_per_s": 50, "cold_start_s": 1,
                    }
                },
            }
        )  # fmt: skip
        env = dict(os.environ)
        env |= {
            "REDIS_URL": server.url, "TIDE_MODEL": str(tiny_path),
            "TIDE_WORKER_HEARTBEAT_SECONDS": "0.3", "TIDE_LEASE_SECONDS": "3",
        }  # fmt: skip
        argv = ["--dtype", "float32", "--max-num-seqs", "2"]
        actuator = LocalActuator(fleet, env=env, worker_argv=argv, log_dir=str(tmp_path))
        controller = Controller(fleet, settings, actuator, client)
        pool = fleet.pools["cpu"]
        assert actuator.list_workers(pool) == []

        info = ModelInfo.load(str(tiny_path))
        store = JobStore(client)
        ids = []
        for i in range(16):
            body = JobCreate(prompt=f"story {i}: once upon a time", max_tokens=48, ignore_eos=True)
            ids.append(store.create(build_job(settings, info, "t", body, None))["id"])

        peak = 0
        seen_actions: list[str] = []

        def loop() -> None:
            nonlocal peak
            while not stop.is_set():
                for d in controller.step():
                    seen_actions.append(d.action)
                peak = max(peak, len(actuator.list_workers(pool)))
                stop.wait(fleet.controller.poll_interval_s)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()

        def all_done() -> bool:
            return all(store.get(j)["status"] == "completed" for j in ids)  # type: ignore[index]

        wait_for(all_done, 180, what="every job to complete")
        assert peak == 2, f"the burst should have scaled to max_workers=2, peaked at {peak}"
        assert seen_actions[0] == "scale_out"
        # Each job ran exactly once: no worker was removed (or lost) while it held one.
        assert [store.get(j)["attempts"] for j in ids] == ["1"] * len(ids)  # type: ignore[index]
        assert read_backlog(client)["short"].jobs == 0
        # Idle for idle_s: drained and removed, back to zero processes.
        wait_for(
            lambda: not actuator.list_workers(pool) and not actuator.procs["cpu"], 60, what="zero"
        )
        assert "scale_to_min" in seen_actions or "scale_in" in seen_actions
        assert client.zcard("tide:workers") == 0  # workers deleted their heartbeats on exit
    finally:
        stop.set()
        if "actuator" in locals():
            actuator.close()
        server.stop()


def test_scale_to_zero_settles_over_several_idle_periods(tmp_path: Path, tiny_path: Path) -> None:
    """The reported flap: after scale_to_min the smoothed arrival rate alone relaunched a
    worker every few seconds, and workers drained while starting piled up past the cap.
    Two bursts, each followed by several idle_s periods: the pool reaches zero after each
    and stays there, never runs more than max_workers processes, and launches only what
    the bursts needed."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    stop = threading.Event()
    try:
        client = redis.Redis.from_url(server.url)
        settings = Settings(redis_url=server.url, model=str(tiny_path), lease_seconds=3,
                            worker_heartbeat_seconds=0.3)  # fmt: skip
        fleet = parse_fleet(
            {
                "controller": {"poll_interval_s": 0.2, "scale_in_cooldown_s": 0.5},
                "pools": {
                    "cpu": {
                        "buckets": ["short", "medium", "long"], "max_workers": 2,
                        "target_wait_s": 1, "idle_s": 1, "tokens_per_s": 20, "cold_start_s": 0,
                    }
                },
            }
        )  # fmt: skip
        env = dict(os.environ) | {"REDIS_URL": server.url, "TIDE_MODEL": str(tiny_path),
                                  "TIDE_WORKER_HEARTBEAT_SECONDS": "0.3"}  # fmt: skip
        argv = ["--dtype", "float32", "--max-num-seqs", "2"]
        actuator = LocalActuator(fleet, env=env, worker_argv=argv, log_dir=str(tmp_path))
        controller = Controller(fleet, settings, actuator, client)
        pool = fleet.pools["cpu"]
        info, store = ModelInfo.load(str(tiny_path)), JobStore(client)
        peak_live, zero_streak = 0, 0
        actions: list[str] = []

        def poll() -> None:
            nonlocal peak_live, zero_streak
            actions.extend(d.action for d in controller.step())
            peak_live = max(peak_live, actuator.live(pool))
            zero_streak = zero_streak + 1 if actuator.live(pool) == 0 else 0
            time.sleep(fleet.controller.poll_interval_s)

        for burst in range(2):
            body = JobCreate(prompt="once upon a time", max_tokens=24, ignore_eos=True)
            ids = [store.create(build_job(settings, info, "t", body, None))["id"] for _ in range(8)]
            deadline = time.monotonic() + 120
            while not all(store.get(j)["status"] == "completed" for j in ids):  # type: ignore[index]
                assert time.monotonic() < deadline, f"burst {burst} did not complete"
                poll()
            # Idle: down to zero, then five idle_s periods (25 polls) with nothing launched.
            deadline = time.monotonic() + 60
            while zero_streak < 25:
                assert time.monotonic() < deadline, f"never settled at zero: {actions[-20:]}"
                before = actuator.launched
                poll()
                if zero_streak:
                    assert actuator.launched == before, "relaunched on an idle queue"
        assert peak_live <= 2, f"{peak_live} live worker processes against max_workers 2"
        assert actuator.launched <= 4, f"{actuator.launched} launches for two bursts"
        assert client.zcard("tide:workers") == 0
        assert not client.keys("tide:drain:*")
    finally:
        stop.set()
        if "actuator" in locals():
            actuator.close()
        server.stop()
