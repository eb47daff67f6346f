"""Properties of the scaling policy that must hold in every state: scale to zero settles on
an idle queue whatever the smoothed rates say, and the cap counts every live worker."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tide_fleet.infra.fleet.autoscale import PoolObservation, PoolState, WorkerView, decide
from tide_fleet.infra.fleet.fleet_config import ControllerConfig, PoolConfig

CTL = ControllerConfig(scale_in_cooldown_s=5, scale_in_hysteresis=0.7)


def pool(min_workers: int = 0, max_workers: int = 2, idle_s: float = 3.0) -> PoolConfig:
    p = PoolConfig(buckets=["short"], min_workers=min_workers, max_workers=max_workers,
                   target_wait_s=10, idle_s=idle_s, cold_start_s=1)  # fmt: skip
    p.name = "p"
    return p


workers_st = st.lists(
    st.builds(
        WorkerView,
        worker_id=st.uuids().map(str),
        state=st.sampled_from(["starting", "ready", "draining"]),
        running=st.integers(0, 8),
        idle_since=st.none() | st.floats(0, 100),
    ),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(
    workers=workers_st,
    backlog_jobs=st.integers(0, 50),
    tokens_per_job=st.integers(1, 5000),
    arrivals=st.floats(0, 1e6),
    oldest=st.floats(0, 100),
    max_workers=st.integers(1, 5),
    min_workers=st.integers(0, 2),
)
def test_the_cap_holds_counting_starting_and_draining_workers(
    workers, backlog_jobs, tokens_per_job, arrivals, oldest, max_workers, min_workers
):
    p = pool(min_workers=min(min_workers, max_workers), max_workers=max_workers)
    obs = PoolObservation(50.0, backlog_jobs, backlog_jobs * tokens_per_job, oldest, arrivals,
                          100.0, workers)  # fmt: skip
    d = decide(p, obs, PoolState(), CTL)
    live = len(workers)
    launches = d.desired - d.current if d.action == "scale_out" else 0
    assert launches >= 0
    # Never launch past the cap: what is alive (starting, ready, draining) plus the new ones.
    assert launches == 0 or live + launches <= max_workers, (d, live)


@settings(max_examples=200, deadline=None)
@given(
    arrivals=st.lists(st.floats(0, 1e5), min_size=5, max_size=60),
    start_workers=st.integers(0, 2),
    min_workers=st.integers(0, 1),
)
def test_an_idle_queue_never_scales_out_on_rates_alone_and_settles_at_min(
    arrivals, start_workers, min_workers
):
    """No backlog, nothing running: whatever the smoothed arrival rate still says, the pool
    only goes down (after idle_s) and, once at min_workers, stays there."""
    p = pool(min_workers=min_workers, idle_s=3.0)
    state = PoolState(last_change=-1000)
    n = max(start_workers, min_workers)
    reached_min_at = None
    for i, rate in enumerate(arrivals):
        now = float(i)
        workers = [WorkerView(f"w{k}", "ready", 0, 0.0) for k in range(n)]
        obs = PoolObservation(now, 0, 0, 0.0, rate, 100.0, workers)
        d = decide(p, obs, state, CTL)
        if n >= min_workers:
            assert d.action != "scale_out", (i, d)
        if d.action in ("scale_to_min", "scale_in") or d.action == "scale_out":
            n = d.desired
        if n == min_workers and reached_min_at is None:
            reached_min_at = i
        if reached_min_at is not None:
            assert n == min_workers, "left min_workers on an idle queue"
    if len(arrivals) > 5:  # idle_s = 3 polls: it must have got down
        assert n == min_workers


def test_zero_demand_with_no_backlog_and_nothing_in_flight():
    # The reported flap: after scale_to_min 1 -> 0, the smoothed arrival rate (15 tok/s)
    # alone asked for a worker a second later.
    p = pool()
    obs = PoolObservation(100.0, 0, 0, 0.0, 15.0, 2000.0, [])
    d = decide(p, obs, PoolState(idle_since=90.0), CTL)
    assert (d.action, d.desired) == ("hold", 0), d
    assert d.demand == 0.0


def test_rates_still_size_a_busy_pool():
    # Jobs running and arriving: the arrival rate decides how many (here 3 for 300 tok/s).
    p = pool(max_workers=5)
    workers = [WorkerView("w0", "ready", 2, None)]
    obs = PoolObservation(0.0, 0, 0, 0.0, 300.0, 100.0, workers)
    d = decide(p, obs, PoolState(), CTL)
    assert (d.action, d.desired) == ("scale_out", 3), d


def test_a_queue_at_the_cap_with_draining_workers_waits_for_them():
    p = pool(max_workers=2)
    workers = [WorkerView("a", "draining", 1, None), WorkerView("b", "ready", 1, None)]
    obs = PoolObservation(0.0, 5, 5000, 1.0, 0.0, 100.0, workers)
    d = decide(p, obs, PoolState(), CTL)
    assert d.action == "hold" and "draining" in d.reason, d
