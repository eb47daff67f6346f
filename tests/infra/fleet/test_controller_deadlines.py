"""The controller observes each pool's queued deadlines (infra/wire/backlog.py
deadline_backlog, per home bucket) and sizes by them; without the reader, as before."""

from __future__ import annotations

from tests.infra.fleet.test_controller_records import FakeActuator
from tide_fleet.infra.fleet import controller as controller_module
from tide_fleet.infra.fleet.controller import Controller
from tide_fleet.infra.fleet.fleet_config import parse_fleet
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire.protocol import Keys

NOW = 1_000_000.0


def make(redis_client, redis_server) -> Controller:  # type: ignore[no-untyped-def]
    fleet = parse_fleet({"pools": {"big": {"buckets": ["medium", "long"], "max_workers": 4,
                                           "tokens_per_s": 1000, "cold_start_s": 60},
                                   "small": {"buckets": ["short"]}}})  # fmt: skip
    return Controller(fleet, Settings(redis_url=redis_server.url), FakeActuator(), redis_client,
                      clock=lambda: NOW)  # fmt: skip


def queue(redis_client, bucket: str, job: str, tokens: int, deadline: float) -> None:  # type: ignore[no-untyped-def]
    redis_client.zadd(Keys.backlog(bucket), {job: NOW - 10})
    redis_client.hincrby(Keys.backlog_tokens, bucket, tokens)
    redis_client.zadd(Keys.deadline_backlog(bucket), {f"{job}:{tokens}": deadline})


def test_a_far_batch_leaves_the_pool_at_zero_a_near_one_wakes_it(redis_client, redis_server):  # type: ignore[no-untyped-def]
    controller = make(redis_client, redis_server)
    queue(redis_client, "long", "j1", 2_000_000, NOW + 24 * 3600)
    obs = controller.observe()["big"]
    assert obs.deadlines == [(NOW + 24 * 3600, 2_000_000)]
    assert controller.step()[0].action == "hold"
    # a near deadline in another home bucket: 3M tokens due by the two, in 1,860 s -> 2
    queue(redis_client, "medium", "j2", 1_000_000, NOW + 1800)
    obs = controller.observe()["big"]
    assert obs.deadlines == [(NOW + 1800, 1_000_000), (NOW + 24 * 3600, 2_000_000)]
    d = controller.step()[0]
    assert (d.action, d.desired) == ("scale_out", 1)  # 1e6 / (1000 x 1740) = 0.57 -> 1


def test_the_observation_with_a_fake_reader_and_without_one(  # type: ignore[no-untyped-def]
    redis_client, redis_server, monkeypatch
):
    controller = make(redis_client, redis_server)
    redis_client.zadd(Keys.backlog("long"), {"j1": NOW - 10})
    redis_client.hset(Keys.backlog_tokens, "long", 900_000)
    seen = []

    def fake(client, field):  # type: ignore[no-untyped-def]
        seen.append(field)
        return [(NOW + 600, 900_000)] if field == "long" else []

    monkeypatch.setattr(controller_module, "deadline_backlog", fake)
    assert controller.observe()["big"].deadlines == [(NOW + 600, 900_000)]
    assert sorted(seen) == ["long", "medium"]  # the pool's home buckets
    d = controller.step()[0]
    assert (d.action, d.desired) == ("scale_out", 2)  # 9e5 / (1000 x 540) = 1.67
    # a wire without deadline_backlog: sized by backlog and wait alone, as before
    monkeypatch.setattr(controller_module, "deadline_backlog", None)
    assert controller.observe()["big"].deadlines is None
