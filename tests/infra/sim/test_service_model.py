"""Service models: the roofline's batch curve, measured curves from a service file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tide_fleet.infra.fleet.fleet_config import load_fleet, parse_fleet
from tide_fleet.infra.sim.service_model import roofline_model, service_models
from tide_fleet.infra.sim.traces import make_jobs

ROOT = Path(__file__).resolve().parents[3]


def test_throughput_rises_and_saturates_with_batch() -> None:
    model = roofline_model(load_fleet(ROOT / "fleet.example.toml").pools["small"])
    job = make_jobs([(0, 10, 300, 300)])[0]
    mem, flop, pre = model.job_costs(job)
    per_job = [1 / model.step_time(b * mem, b * flop, b * pre) for b in (1, 8, 32)]
    total = [b * s for b, s in zip((1, 8, 32), per_job, strict=True)]
    assert per_job[0] > per_job[1] > per_job[2]  # each job slower in a bigger batch
    assert total[0] < total[1] < total[2]  # the worker faster
    assert total[2] / total[1] < 4  # but less than in proportion: it saturates


def test_service_file_fits_a_measured_curve(tmp_path: Path) -> None:
    fleet = load_fleet(ROOT / "fleet.example.toml")
    # step = 0.05 + 0.002 x batch  ->  tokens/s = batch / step
    curve = {str(b): b / (0.05 + 0.002 * b) for b in (1, 8, 32)}
    path = tmp_path / "service.json"
    path.write_text(json.dumps({"pools": {"small": {"tokens_per_s": curve, "kv_tokens": 5000}}}))
    models = service_models(fleet, path)
    assert models["small"].step_s == pytest.approx(0.05)
    assert models["small"].mem_s_per_seq == pytest.approx(0.002)
    assert models["small"].kv_tokens == 5000
    assert models["big"].source.startswith("planner roofline")
    path.write_text(json.dumps({"pools": {"small": {"tokens_per_s": {"1": 10}}}}))
    with pytest.raises(ValueError, match=r"pools.small.tokens_per_s: .*>= 2 batch sizes"):
        service_models(fleet, path)
    path.write_text(json.dumps({"pools": {"tiny": {"tokens_per_s": curve}}}))
    with pytest.raises(ValueError, match=r"pools.tiny is not in the fleet"):
        service_models(fleet, path)


def test_device_too_small_for_the_model_is_named() -> None:
    fleet = parse_fleet({"pools": {"c": {"buckets": ["short", "medium", "long"], "device": "cpu"}}})
    with pytest.raises(ValueError, match=r"pools.c: .*--service"):
        service_models(fleet)
