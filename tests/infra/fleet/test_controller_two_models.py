"""Two models, one fleet, real `tide worker` processes: a burst to model B scales B's pool
0 -> 1 -> 0 while A's pool stays at zero, and B's answers are B's greedy output."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import redis

from infra.fleet.controller import Controller
from infra.fleet.fleet_config import parse_fleet
from infra.fleet.local_actuator import LocalActuator
from infra.fleet.redis_server import EmbeddedRedis
from infra.jobs.schemas import JobCreate
from infra.jobs.submission import ModelInfo, build_job
from infra.settings import Settings, child_env
from infra.wire.backlog import read_backlog
from infra.wire.jobstore import JobStore
from tests.conftest import make_engine, wait_for
from worker.engine import SamplingParams

pytestmark = pytest.mark.slow

POOL = {"buckets": ["short", "medium", "long"], "max_workers": 1, "target_wait_s": 2,
        "idle_s": 2, "tokens_per_s": 50, "cold_start_s": 1}  # fmt: skip


def test_one_model_scales_from_zero_while_the_other_stays_at_zero(
    tmp_path: Path, tiny_path: Path, stories_path: Path
) -> None:
    server = EmbeddedRedis(tmp_path / "redis").start()
    stop = threading.Event()
    try:
        client = redis.Redis.from_url(server.url)
        fleet = parse_fleet({
            "controller": {"poll_interval_s": 0.3, "scale_in_cooldown_s": 1.0},
            "pools": {"a": POOL | {"model": str(tiny_path), "served_name": "a"},
                      "b": POOL | {"model": str(stories_path), "served_name": "b"}},
        })  # fmt: skip
        settings = Settings(
            redis_url=server.url, model=str(tiny_path), worker_heartbeat_seconds=0.3,
            lease_seconds=3, served_models=fleet.served_models(str(tiny_path)),
        )  # fmt: skip
        env = child_env(settings) | {"TIDE_WORKER_HEARTBEAT_SECONDS": "0.3",
                                     "TIDE_LEASE_SECONDS": "3"}  # fmt: skip
        argv = ["--dtype", "float32", "--max-num-seqs", "4"]
        actuator = LocalActuator(fleet, env=env, worker_argv=argv, log_dir=str(tmp_path))
        controller = Controller(fleet, settings, actuator, client)
        b = fleet.catalog(str(tiny_path)).resolve("b")
        info, store = ModelInfo.load(str(stories_path)), JobStore(client)
        prompts = [f"Once upon a time, {w}" for w in ("Lily", "Tom", "a cat", "the sun")]
        bodies = [JobCreate(prompt=p, max_tokens=24, temperature=0) for p in prompts]
        jobs = [build_job(settings, info, "t", x, None, served=b) for x in bodies]
        ids = [store.create(job)["id"] for job in jobs]
        peak_b, a_launched = 0, False

        def loop() -> None:
            nonlocal peak_b, a_launched
            while not stop.is_set():
                controller.step()
                peak_b = max(peak_b, len(actuator.list_workers(fleet.pools["b"])))
                a_launched = a_launched or bool(actuator.procs["a"])
                stop.wait(fleet.controller.poll_interval_s)

        threading.Thread(target=loop, daemon=True).start()
        done = lambda: all(store.get(j)["status"] == "completed" for j in ids)  # type: ignore[index]  # noqa: E731
        wait_for(done, 180, what="every job of model b to complete")
        assert peak_b == 1 and not a_launched, "only b's pool scales"
        assert read_backlog(client, lane="b")["short"].jobs == 0
        # Each answer is model b's own greedy output.
        engine = make_engine(stories_path)
        for j in ids:
            record = store.get(j)
            assert record is not None
            tokens = json.loads(record["token_ids"])
            want = engine.generate([tokens], SamplingParams(max_tokens=24, temperature=0))[0]
            assert record["text"] == want.text, (record["text"], want.text)
        wait_for(lambda: not actuator.procs["b"], 60, what="b's pool back to zero")
        assert not a_launched
    finally:
        stop.set()
        if "actuator" in locals():
            actuator.close()
        server.stop()
