"""Deadline-aware sizing (infra/fleet/deadlines.py) and how decide uses it."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from tide_fleet.infra.fleet.autoscale import PoolObservation, PoolState, WorkerView, decide
from tide_fleet.infra.fleet.deadlines import (
    WAKE_LOAD,
    deadline_demand,
    deadline_target,
    merge_deadlines,
)
from tide_fleet.infra.fleet.fleet_config import ControllerConfig, PoolConfig

CTL = ControllerConfig(scale_in_cooldown_s=60, scale_in_hysteresis=0.7)
NOW = 1_000_000.0


def pool(**kw) -> PoolConfig:  # type: ignore[no-untyped-def]
    base = {"buckets": ["long"], "min_workers": 0, "max_workers": 8, "target_wait_s": 60,
            "idle_s": 300, "cold_start_s": 60}  # fmt: skip
    p = PoolConfig(**(base | kw))
    p.name = "p"
    return p


def obs(deadlines, workers=(), jobs=None, tokens=None, rate=1000.0, now=NOW):  # type: ignore[no-untyped-def]
    jobs = len(deadlines or []) if jobs is None else jobs
    tokens = sum(t for _, t in deadlines or []) if tokens is None else tokens
    return PoolObservation(now, jobs, tokens, 0.0, 0.0, rate, list(workers), deadlines)


def test_the_rule_by_hand() -> None:
    # 1.2M tokens due in 1 h at 1,000 tok/s, 60 s to start: 1.2e6 / (1000 x 3540) = 0.34
    assert deadline_demand([(NOW + 3600, 1_200_000)], NOW, 1000, 60) == pytest.approx(0.339, 1e-3)
    # cumulative: the second deadline counts the first's tokens too
    due = [(NOW + 600, 300_000), (NOW + 3600, 6_000_000)]
    assert deadline_demand(due, NOW, 1000, 0) == pytest.approx(6_300_000 / 3_600_000)
    # a deadline already past is drained over one cold start, not an infinite demand
    assert deadline_demand([(NOW - 100, 60_000)], NOW, 1000, 60) == pytest.approx(1.0)
    assert deadline_target(WAKE_LOAD - 0.01) == 0
    assert deadline_target(WAKE_LOAD) == 1 and deadline_target(2.3) == 3
    assert merge_deadlines([[(3.0, 1)], [(1.0, 2), (5.0, 3)]]) == [(1.0, 2), (3.0, 1), (5.0, 3)]


def test_a_far_deadline_does_not_wake_a_pool_from_zero() -> None:
    d = decide(pool(), obs([(NOW + 24 * 3600, 5_000_000)]), PoolState(), CTL)
    assert (d.action, d.desired) == ("hold", 0)
    # without deadlines the same backlog wakes it at once (today's rule)
    d = decide(pool(), obs(None, jobs=1, tokens=5_000_000), PoolState(), CTL)
    assert d.action == "scale_out" and d.desired == 8


def test_a_near_deadline_wakes_the_pool_with_enough_workers() -> None:
    # 5M tokens due in 30 min: 5e6 / (1000 x 1740) = 2.9 -> 3 workers
    d = decide(pool(), obs([(NOW + 1800, 5_000_000)]), PoolState(), CTL)
    assert (d.action, d.desired) == ("scale_out", 3)
    assert "3 for deadlines" in d.reason


def test_the_same_far_deadline_wakes_the_pool_as_its_latest_start_nears() -> None:
    due = [(NOW + 24 * 3600, 40_000_000)]  # 11 worker-hours of work at 1,000 tok/s
    t = NOW
    while decide(pool(), obs(due, now=t), PoolState(), CTL).action == "hold":
        t += 600
    left = NOW + 24 * 3600 - t
    # it wakes once one worker would be busy WAKE_LOAD of the time left: ~2x slack
    assert 40_000 / left == pytest.approx(WAKE_LOAD, abs=0.02)


def test_enough_workers_meet_every_deadline_at_rate_r() -> None:
    rng = random.Random(7)
    rate, startup = 500.0, 120.0
    for _ in range(300):
        due = sorted((NOW + rng.uniform(0, 20_000), rng.randint(1_000, 2_000_000))
                     for _ in range(rng.randint(1, 8)))  # fmt: skip
        demand = deadline_demand(due, NOW, rate, startup)
        workers = max(math.ceil(demand - 1e-9), 1)
        floor = max(startup, 1.0)
        # w workers, ready after startup, serving earliest deadline first at w x rate
        for k, (deadline, _) in enumerate(due):
            done = sum(t for _, t in due[: k + 1]) / (workers * rate)
            assert done <= max(deadline - NOW - startup, floor) + 1e-6
        if workers > 1:  # and one fewer would not
            assert any(
                sum(t for _, t in due[: k + 1]) / ((workers - 1) * rate)
                > max(d - NOW - startup, floor) + 1e-6
                for k, (d, _) in enumerate(due)
            )


def test_interactive_work_keeps_its_wait_target() -> None:
    # 1 interactive job of 120k tokens queued beside a far batch: drained within 60 s
    # at 1,000 tok/s -> 2 workers, whatever the batch's 50M tokens
    due = [(NOW + 24 * 3600, 50_000_000)]
    d = decide(pool(), obs(due, jobs=2, tokens=50_120_000), PoolState(), CTL)
    assert (d.action, d.desired) == ("scale_out", 2)


def test_scale_to_zero_waits_for_the_deadline_jobs() -> None:
    idle = [WorkerView("w0", "ready", 0, NOW - 1000)]
    state = PoolState(idle_since=None)
    # a deadline job still queued: the pool is not idle
    d = decide(pool(), obs([(NOW + 24 * 3600, 1000)], idle), state, CTL)
    assert d.action == "hold" and state.idle_since is None
    d = decide(pool(), obs([], idle, now=NOW + 1), state, CTL)
    d = decide(pool(), obs([], idle, now=NOW + 302), state, CTL)
    assert (d.action, d.desired) == ("scale_to_min", 0)


@pytest.mark.parametrize("jobs,tokens,oldest,arrivals,running,n", list(itertools.product(
    [0, 1, 5], [0, 900, 50_000], [0.0, 30.0], [0.0, 400.0], [0, 2], [0, 1, 3],
)))  # fmt: skip
def test_no_deadlines_decides_exactly_as_before(jobs, tokens, oldest, arrivals, running, n):  # type: ignore[no-untyped-def]
    workers = [WorkerView(f"w{i}", "ready", running, None if running else NOW - 50)
               for i in range(n)]  # fmt: skip
    decisions, states = [], []
    for deadlines in (None, []):
        state = PoolState(last_change=NOW - 100)
        o = PoolObservation(NOW, jobs, tokens, oldest, arrivals, 1000.0, workers, deadlines)
        decisions.append(decide(pool(), o, state, CTL))
        states.append(state)
    assert decisions[0] == decisions[1] and states[0] == states[1]
