"""Pools whose workers take several GPUs (gpus_per_worker): each worker-hour bills that many
GPU-hours, and the roofline splits the model over them as the planner does."""

from __future__ import annotations

import pytest

from tests.infra.sim.test_simulation import fixed, jobs_at, one_pool, run_static
from tide_fleet.infra.fleet.fleet_config import parse_fleet
from tide_fleet.infra.sim.service_model import roofline_model
from tide_fleet.infra.sim.traces import make_jobs


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_a_worker_hour_bills_its_gpus(gpus: int) -> None:
    # As test_fcfs_one_slot_waits_by_hand: one worker busy until 40 s, now holding `gpus`.
    fleet = one_pool(gpus_per_worker=gpus)
    jobs = jobs_at((0, 10), (0, 10), (0, 10), (5, 10))
    r = run_static(fleet, jobs, {"p": fixed()}, {"p": 1})
    assert r.gpu_hours == pytest.approx(gpus * 40 / 3600)
    assert r.by_model["default"].gpu_hours == pytest.approx(r.gpu_hours)
    assert r.peak_workers == 1  # workers are still counted as workers


def test_pools_bill_their_own_gpus_per_worker() -> None:
    every = ["short", "medium", "long"]
    fleet = parse_fleet({"pools": {
        "one": {"buckets": every, "device": "l4"},
        "four": {"buckets": ["long"], "device": "l4", "gpus_per_worker": 4},
    }})  # fmt: skip
    r = run_static(fleet, jobs_at((0, 10)), {"one": fixed(), "four": fixed()},
                   {"one": 1, "four": 1})  # fmt: skip
    # Both workers run from 0 to the end (10 s): 1 + 4 GPUs.
    assert r.end_s == pytest.approx(10)
    assert r.gpu_hours == pytest.approx(5 * 10 / 3600)


def pool_on(device: str, model: str, gpus: int):  # type: ignore[no-untyped-def]
    spec = {"buckets": ["short", "medium", "long"], "device": device, "model": model}
    return parse_fleet({"pools": {"p": {**spec, "gpus_per_worker": gpus}}}).pools["p"]


def test_the_roofline_splits_the_model_over_the_workers_gpus() -> None:
    one = roofline_model(pool_on("a100-80gb", "llama-3-8b", 1))
    two = roofline_model(pool_on("a100-80gb", "llama-3-8b", 2))
    assert one.allreduce_s_per_token == 0 and two.allreduce_s_per_token > 0
    assert two.step_s == pytest.approx(one.step_s / 2, rel=0.02)  # half the weights each
    assert two.kv_tokens > 2 * one.kv_tokens  # twice the memory, less of it on weights
    assert two.source == "planner roofline: llama-3-8b on 2 x a100-80gb"
    # A job pays its all-reduces on top of the step, whatever bounds it.
    (job,) = make_jobs([(0, 100, 50, 50)])
    assert two.job_costs(job)[2] > one.job_costs(job)[2] / 2


def test_a_model_too_big_for_one_gpu_fits_split() -> None:
    with pytest.raises(ValueError, match=r"pools.p: weights do not fit"):
        roofline_model(pool_on("h200", "llama-3-70b", 1))
    assert roofline_model(pool_on("h200", "llama-3-70b", 2)).kv_tokens > 0
