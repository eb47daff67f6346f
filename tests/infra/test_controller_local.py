"""The controller with the local actuator and real `tide worker` processes: a burst of
jobs scales a pool 0 -> 2 -> 0, every job completes once, no busy worker is removed."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import redis

from infra.actuators import LocalActuator
from infra.backlog import read_backlog
from infra.controller import Controller
from infra.fleet_config import parse_fleet
from infra.jobstore import JobStore
from infra.redis_server import EmbeddedRedis
from infra.schemas import JobCreate
from infra.settings import Settings
from infra.submission import ModelInfo, build_job
from tests.conftest import wait_for

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
