"""The event loop, checked by hand: FCFS, batching, cold starts, routing between pools,
draining, refusal of jobs that fit nowhere."""

from __future__ import annotations

import pytest

from tide_fleet.infra.fleet.fleet_config import FleetConfig, parse_fleet
from tide_fleet.infra.sim.compare import simulate
from tide_fleet.infra.sim.policies import StaticPolicy
from tide_fleet.infra.sim.results import PolicyResult
from tide_fleet.infra.sim.service_model import ServiceModel
from tide_fleet.infra.sim.simulation import Simulation
from tide_fleet.infra.sim.traces import Job, make_jobs


def one_pool(**pool: object) -> FleetConfig:
    spec = {"buckets": ["short", "medium", "long"], "device": "l4", "target_wait_s": 15.0}
    return parse_fleet({"pools": {"p": {**spec, **pool}}})


def jobs_at(*rows: tuple[float, int]) -> list[Job]:
    """Jobs of 10 prompt tokens arriving at t with `out` output tokens (= max_tokens)."""
    return make_jobs([(t, 10, out, out) for t, out in rows])


def fixed(seqs: int = 1, step: float = 1.0, per_seq: float = 0.0) -> ServiceModel:
    return ServiceModel(max_num_seqs=seqs, kv_tokens=10**6, step_s=step, mem_s_per_seq=per_seq)


def run_static(fleet: FleetConfig, jobs: list[Job], models: dict, counts: dict) -> PolicyResult:
    return Simulation(fleet, jobs, models, 0.0).run(StaticPolicy(fleet, counts))


def test_fcfs_one_slot_waits_by_hand() -> None:
    # One worker, one slot, 10 tokens at 1 s/step = 10 s a job. Arrivals 0, 0, 0, 5 start at
    # 0, 10, 20, 30: waits 0, 10, 20, 25.
    fleet = one_pool()
    r = run_static(fleet, jobs_at((0, 10), (0, 10), (0, 10), (5, 10)), {"p": fixed()}, {"p": 1})
    assert sorted(w for _, w in r.waits) == [0, 10, 20, 25]
    assert r.p50_wait_s == 15  # linear interpolation: halfway from the 2nd to the 3rd of 4
    assert r.p99_wait_s == pytest.approx(24.85)  # 97% of the way from the 3rd to the 4th
    assert r.slo_attainment == 0.5  # waits <= 15 s: two of four
    assert r.gpu_hours == pytest.approx(40 / 3600)  # one worker until the last job ends at 40
    assert r.peak_workers == 1 and not r.slo_met


def test_batch_slows_each_job_by_hand() -> None:
    # Two slots; a step takes 0.5 s + 0.25 s per running job. A (4 tokens) alone from 0 to 1
    # makes 1/0.75 tokens; with B (2 tokens, from t=1) a step is 1 s, so B ends at 3. C comes
    # at 1.5, finds both slots taken and starts when B ends: wait 1.5. A then has 2/3 token
    # left and C 1, at 1 s a step: A ends at 3 + 2/3, when C has 1/3 token left, alone at
    # 0.75 s a step: C ends at 3 + 2/3 + 0.25.
    fleet = one_pool()
    jobs = jobs_at((0, 4), (1, 2), (1.5, 1))
    r = run_static(fleet, jobs, {"p": fixed(seqs=2, step=0.5, per_seq=0.25)}, {"p": 1})
    assert [w for _, w in r.waits] == pytest.approx([0, 0, 1.5])
    assert r.end_s == pytest.approx(3 + 2 / 3 + 0.25)


def test_tide_cold_start_by_hand() -> None:
    # Empty pool, polls every 5 s. A job at t=1 is seen at the poll at t=5, which launches a
    # worker; it is ready 30 s later and starts the job: wait 34. Billed from 5 to the end (45).
    fleet = parse_fleet(
        {
            "controller": {"poll_interval_s": 5},
            "pools": {
                "p": {"buckets": ["short", "medium", "long"], "device": "l4",
                      "cold_start_s": 30, "idle_s": 60, "tokens_per_s": 1000},
            },
        }
    )  # fmt: skip
    jobs = jobs_at((1, 10))
    result = simulate(fleet, jobs, 0.0, {"p": fixed()}, ("tide",))["tide"]
    assert result.waits == [(1, 34)]
    assert result.gpu_hours == pytest.approx(40 / 3600)
    assert result.timeline[:2] == [(0.0, 0), (5.0, 1)]


def test_big_pool_takes_its_own_buckets_before_stealing() -> None:
    # The small worker is busy (one slot) for 100 s. The big worker runs a medium job to t=10;
    # a short job queued at t=1 and a medium one at t=2: the big worker takes the medium
    # first (wait 8), then the short one when that ends at t=20 (wait 19).
    fleet = parse_fleet(
        {
            "pools": {
                "small": {"buckets": ["short"], "device": "l4"},
                "big": {"buckets": ["medium", "long", "short"], "device": "a100-80gb"},
            }
        }
    )
    rows = [(0.0, 10, 100, 100), (0.0, 3000, 10, 10), (1.0, 10, 10, 10), (2.0, 3000, 10, 10)]
    jobs = make_jobs(rows)
    assert [j.bucket for j in jobs] == ["short", "medium", "short", "medium"]
    models = {"small": fixed(), "big": fixed()}
    r = run_static(fleet, jobs, models, {"small": 1, "big": 1})
    assert [w for _, w in r.waits] == [0, 0, 19, 8]


def test_scale_in_drains_before_removal() -> None:
    fleet = one_pool()
    s = Simulation(fleet, jobs_at((0, 10)), {"p": fixed()}, 0.0)
    s.launch(fleet.pools["p"], 1, 0.0, cold=False)
    s._arrive(s.jobs[0], 0.0)
    worker = s.live("p")[0]
    s.drain(worker.wid, 1.0)
    assert worker.state == "draining" and s.live("p") == [worker]  # busy: still billed
    s._finish(worker, 10.0)
    assert s.live("p") == [] and worker.removed == 10.0


def test_job_larger_than_any_worker_is_refused() -> None:
    fleet = one_pool()
    small_kv = ServiceModel(max_num_seqs=4, kv_tokens=100, step_s=1.0)
    with pytest.raises(ValueError, match=r"job 1 .*prompt \+ max_tokens = 210.*at most 100"):
        Simulation(fleet, jobs_at((0, 200)), {"p": small_kv}, 0.0)
