"""The scaling policy (infra/fleet/autoscale.py) decision by decision, on a fake clock."""

from __future__ import annotations

import pytest

from tide_fleet.infra.fleet.autoscale import (
    PoolObservation,
    PoolState,
    WorkerView,
    decide,
    demand_workers,
)
from tide_fleet.infra.fleet.fleet_config import ControllerConfig, PoolConfig

CTL = ControllerConfig(scale_in_cooldown_s=60, scale_in_hysteresis=0.7)


def pool(**kw) -> PoolConfig:
    base = {"buckets": ["short"], "min_workers": 0, "max_workers": 8, "target_wait_s": 10,
            "idle_s": 300, "cold_start_s": 0}  # fmt: skip
    p = PoolConfig(**(base | kw))
    p.name = "p"
    return p


def obs(
    now: float,
    workers: list[WorkerView],
    backlog: int = 0,
    jobs: int | None = None,
    oldest: float = 0.0,
    arrivals: float = 0.0,
    rate: float = 100.0,
) -> PoolObservation:
    jobs = (1 if backlog else 0) if jobs is None else jobs
    return PoolObservation(now, jobs, backlog, oldest, arrivals, rate, workers)


def ready(n: int, running: int = 0, idle_since: float | None = 0.0) -> list[WorkerView]:
    return [
        WorkerView(f"w{i}", "ready", running, None if running else idle_since) for i in range(n)
    ]


def test_slo_arithmetic():
    p = pool(target_wait_s=10)
    # 2,000 tokens queued at 100 tok/s per worker must drain in 10 s: 2 workers; plus
    # 150 tok/s of arrivals: 1.5 more.
    assert demand_workers(obs(0, [], backlog=2000, arrivals=150), p) == pytest.approx(3.5)
    # The oldest job already waited 5 s: 5 s left, so twice the workers for the backlog.
    assert demand_workers(obs(0, [], backlog=2000, oldest=5), p) == pytest.approx(4.0)
    # Past the target: the window floors at 10% of it rather than dividing by zero.
    assert demand_workers(obs(0, [], backlog=2000, oldest=30), p) == pytest.approx(20.0)


def test_a_late_queue_is_drained_over_the_cold_start_not_all_at_once():
    # The queue is already past its target; new workers need 60 s to be ready, so the
    # backlog is spread over 60 s (3.33 workers), not over 10% of the target (200).
    p = pool(target_wait_s=10, cold_start_s=60)
    assert demand_workers(obs(0, [], backlog=20_000, oldest=15), p) == pytest.approx(20_000 / 6000)
    d = decide(p, obs(0, [], backlog=20_000, oldest=15), PoolState(), CTL)
    assert (d.action, d.desired) == ("scale_out", 4)


def test_scale_from_zero_on_the_first_job():
    d = decide(pool(), obs(0, [], backlog=5, jobs=1), PoolState(), CTL)
    assert (d.action, d.current, d.desired) == ("scale_out", 0, 1)
    assert "backlog 5 tok" in d.reason


def test_scale_out_at_once_and_clamped_to_max():
    d = decide(pool(max_workers=3), obs(0, ready(1, running=2), backlog=100_000), PoolState(), CTL)
    assert (d.action, d.desired) == ("scale_out", 3)


def test_starting_workers_count_so_a_burst_is_not_launched_twice():
    starting = [WorkerView("w0", "starting"), WorkerView("w1", "starting")]
    d = decide(pool(), obs(0, starting, backlog=2000), PoolState(), CTL)
    assert (d.action, d.current) == ("hold", 2)


def test_hysteresis_keeps_workers_while_demand_is_near_capacity():
    state = PoolState(last_change=-1000)
    # 4 workers, demand 2.5 >= 0.7 x 3 = 2.1: hold.
    d = decide(pool(), obs(0, ready(4, running=1), backlog=2500), state, CTL)
    assert d.action == "hold" and d.desired == 4
    # demand 2.0 < 2.1: drain one.
    d = decide(pool(), obs(1, ready(4, running=1), backlog=2000), state, CTL)
    assert (d.action, d.desired, len(d.drain)) == ("scale_in", 3, 1)


def test_scale_in_waits_for_the_cooldown_after_a_change():
    state = PoolState()
    p = pool()
    d = decide(p, obs(0, [], backlog=3000), state, CTL)
    assert d.action == "scale_out"
    workers = ready(3, running=1)
    d = decide(p, obs(30, workers, backlog=100), state, CTL)
    assert d.action == "hold" and "cooldown" in d.reason
    d = decide(p, obs(61, workers, backlog=100), state, CTL)
    assert d.action == "scale_in"


def test_scale_in_drains_the_idlest_worker_never_a_busier_one():
    state = PoolState(last_change=-1000)
    workers = [
        WorkerView("busy", "ready", running=3),
        WorkerView("idle-late", "ready", running=0, idle_since=50.0),
        WorkerView("idle-early", "ready", running=0, idle_since=10.0),
        WorkerView("one-job", "ready", running=1),
    ]
    d = decide(pool(), obs(100, workers, backlog=10), state, CTL)
    assert d.action == "scale_in" and d.drain == ["idle-early"]


def test_draining_workers_are_not_counted_or_drained_again():
    state = PoolState(last_change=-1000)
    workers = [WorkerView("d", "draining", running=2), *ready(1, running=1)]
    d = decide(pool(), obs(0, workers, backlog=10), state, CTL)
    assert d.current == 1 and "d" not in d.drain


def test_idle_pool_scales_to_min_only_after_idle_s():
    p = pool(idle_s=300, min_workers=0)
    state = PoolState(last_change=-1000)
    workers = ready(2, idle_since=0.0)
    d = decide(p, obs(0, workers), state, CTL)
    assert d.action == "hold" and "idle for 0s" in d.reason
    d = decide(p, obs(299, workers), state, CTL)
    assert d.action == "hold"
    d = decide(p, obs(300, workers), state, CTL)
    assert (d.action, d.desired, sorted(d.drain)) == ("scale_to_min", 0, ["w0", "w1"])


def test_new_work_resets_the_idle_clock():
    p = pool(idle_s=300)
    state = PoolState(last_change=-1000)
    decide(p, obs(0, ready(1)), state, CTL)
    decide(p, obs(200, ready(1, running=1), backlog=10), state, CTL)  # busy again
    d = decide(p, obs(450, ready(1)), state, CTL)  # idle 250 s since, not 450
    assert d.action == "hold"


def test_min_workers_is_a_floor_even_when_idle():
    p = pool(min_workers=2, idle_s=0)
    d = decide(p, obs(0, ready(2)), PoolState(), CTL)
    assert (d.action, d.desired) == ("hold", 2)
    d = decide(p, obs(0, []), PoolState(), CTL)
    assert (d.action, d.desired) == ("scale_out", 2)


def test_busy_pool_never_scales_to_min_while_jobs_run():
    p = pool(idle_s=0)
    state = PoolState(last_change=-1000)
    d = decide(p, obs(1000, ready(1, running=1)), state, CTL)
    assert d.action == "hold" and d.desired == 1


def test_scale_out_cooldown_is_respected():
    ctl = ControllerConfig(scale_out_cooldown_s=30)
    state = PoolState()
    assert decide(pool(), obs(0, [], backlog=500), state, ctl).action == "scale_out"
    d = decide(pool(), obs(10, ready(1, running=1), backlog=100_000), state, ctl)
    assert d.action == "hold" and "cooldown" in d.reason
    assert decide(pool(), obs(31, ready(1, running=1), backlog=100_000), state, ctl).action == (
        "scale_out"
    )


def test_rate_tracker_learns_each_pools_service_rate_independently():
    from tide_fleet.infra.fleet.autoscale import RateTracker

    rates = RateTracker(["a", "b"])
    for i in range(6):  # two busy pools, each with a queue, updated one after the other
        t = 15.0 * i
        rates.update_service("a", t, True, {"a1": (100 * int(t), True)})
        rates.update_service("b", t, True, {"b1": (30 * int(t), True)})
    assert rates.service["a"] == pytest.approx(100.0)
    assert rates.service["b"] == pytest.approx(30.0)
    # An idle worker, or one without a queue behind it, says nothing about capacity.
    rates.update_service("a", 100.0, False, {"a1": (10_000, True)})
    rates.update_service("a", 130.0, False, {"a1": (10_000, True)})
    assert rates.service["a"] == pytest.approx(100.0)
