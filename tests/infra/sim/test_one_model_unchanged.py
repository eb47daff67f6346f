"""A one-model trace gives exactly what it gave before traces could name models: every
figure of every policy, each job's wait and the worker timeline, against a fixture the
simulator wrote before the multi-model change (tests/infra/sim/fixtures/one_model.json),
from the built-in trace (made without the fleet's models, as before, and with them, as
`tide simulate` now makes it) and from the same jobs read back from an old-format trace file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tide_fleet.infra.fleet.fleet_config import load_fleet
from tide_fleet.infra.sim.compare import simulate
from tide_fleet.infra.sim.models import FleetModels
from tide_fleet.infra.sim.results import PolicyResult
from tide_fleet.infra.sim.simulation import SimConfig
from tide_fleet.infra.sim.traces import builtin_trace, load_trace

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = Path(__file__).parent / "fixtures" / "one_model.json"
CASES = {"mixed-2h-seed3": ("mixed", 3, 2.0, "controller"),
         "diurnal-3h-seed1-model": ("diurnal", 1, 3.0, "model")}  # fmt: skip


def figures(r: PolicyResult) -> dict[str, Any]:
    """Every figure of a run, unrounded (JSON keeps floats exactly), waits and timeline hashed."""

    def digest(v: object) -> str:
        return hashlib.sha256(json.dumps(v).encode()).hexdigest()

    return {
        "gpu_hours": r.gpu_hours, "p50_wait_s": r.p50_wait_s, "p99_wait_s": r.p99_wait_s,
        "p99_wait_short_s": r.p99_wait_short_s, "slo_attainment": r.slo_attainment,
        "peak_workers": r.peak_workers, "p99_wait_by_pool": r.p99_wait_by_pool,
        "slo_met": r.slo_met, "end_s": r.end_s, "note": r.note,
        "waits": digest(r.waits), "timeline": digest(r.timeline),
    }  # fmt: skip


def run_case(
    case: str, trace_dir: Path | None = None, with_models: bool = False
) -> dict[str, dict[str, Any]]:
    """The case's results; with trace_dir, its jobs go through an old-format trace file read
    with the fleet's models; with_models, the built-in trace is made with them."""
    name, seed, hours, rate = CASES[case]
    fleet = load_fleet(ROOT / "fleet.example.toml")
    models = FleetModels(fleet) if with_models else None
    jobs, span = builtin_trace(name, seed, hours, models=models)
    if trace_dir is not None:
        path = trace_dir / f"{case}.jsonl"
        path.write_text("".join(
            json.dumps({"arrival_s": j.arrival, "prompt_tokens": j.prompt_tokens,
                        "max_tokens": j.max_tokens, "output_tokens": j.output_tokens}) + "\n"
            for j in jobs
        ))  # fmt: skip
        jobs, span = load_trace(path, hours, FleetModels(fleet))
    results = simulate(fleet, jobs, span, config=SimConfig(tide_rate=rate))
    return {policy: figures(r) for policy, r in results.items()}


@pytest.mark.parametrize("with_models", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_builtin_one_model_trace_is_unchanged(case: str, with_models: bool) -> None:
    assert run_case(case, with_models=with_models) == json.loads(FIXTURE.read_text())[case]


def test_old_format_trace_file_is_unchanged(tmp_path: Path) -> None:
    case = "mixed-2h-seed3"
    assert run_case(case, tmp_path) == json.loads(FIXTURE.read_text())[case]
