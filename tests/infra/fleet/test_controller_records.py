"""The controller writes what it decided for the web console (infra/wire/fleet_status.py):
each pool's last decision with its reason and workers by state, each change, a sample."""

from __future__ import annotations

import json

from tide_fleet.infra.fleet.actuator import ActuatedWorker
from tide_fleet.infra.fleet.controller import Controller
from tide_fleet.infra.fleet.fleet_config import parse_fleet
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire.protocol import Keys


class FakeActuator:
    def __init__(self) -> None:
        self.workers: list[ActuatedWorker] = []

    def list_workers(self, pool):  # type: ignore[no-untyped-def]
        return list(self.workers)

    def launch(self, pool, n):  # type: ignore[no-untyped-def]
        self.workers += [
            ActuatedWorker(f"w{len(self.workers) + i}", "starting", 0.0) for i in range(n)
        ]

    def drain(self, pool, worker_id):  # type: ignore[no-untyped-def]
        pass

    def remove_drained(self, pool):  # type: ignore[no-untyped-def]
        return []

    def publish(self, pool, backlog_jobs, workers):  # type: ignore[no-untyped-def]
        pass

    def close(self) -> None:
        pass


def test_each_step_records_decisions_and_a_sample(redis_client, redis_server):
    fleet = parse_fleet({"pools": {"cpu": {"buckets": ["short", "medium", "long"],
                                           "max_workers": 2, "tokens_per_s": 100}}})  # fmt: skip
    actuator = FakeActuator()
    now = [1000.0]
    controller = Controller(fleet, Settings(redis_url=redis_server.url), actuator, redis_client,
                            clock=lambda: now[0])  # fmt: skip
    controller.step()  # nothing queued: hold at zero
    redis_client.zadd(Keys.backlog("short"), {"job_1": 999.0})
    redis_client.hset(Keys.backlog_tokens, "short", 5000)
    now[0] += 1
    decisions = controller.step()
    assert decisions[0].action == "scale_out"
    pool = json.loads(redis_client.hget(Keys.controller_pools, "cpu"))
    assert pool["action"] == "scale_out" and pool["desired"] == decisions[0].desired
    assert pool["reason"] == decisions[0].reason and pool["backlog_jobs"] == 1
    changes = [json.loads(c) for c in redis_client.lrange(Keys.controller_decisions, 0, -1)]
    assert [c["action"] for c in changes] == ["scale_out"]  # the first hold is no change
    now[0] += 1
    controller.step()
    pool = json.loads(redis_client.hget(Keys.controller_pools, "cpu"))
    assert pool["workers"] == {"starting": decisions[0].desired}  # launched, not yet beating
    samples = [json.loads(s) for s in redis_client.lrange(Keys.controller_history, 0, -1)]
    assert [s["t"] for s in samples] == [1002.0, 1001.0, 1000.0]
    assert samples[0]["queued"] == 1 and samples[0]["workers"] == decisions[0].desired
    assert float(redis_client.hget(Keys.controller, "last_decision_at")) == 1002.0
