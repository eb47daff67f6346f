"""Jobs with deadlines in the simulator: the batch-windows trace, the queue's order
(interactive first, then earliest deadline), and deadline attainment per policy."""

from __future__ import annotations

import json
from pathlib import Path

from tide_fleet.infra.cli.main import main
from tide_fleet.infra.fleet.fleet_config import load_fleet
from tide_fleet.infra.sim.compare import simulate
from tide_fleet.infra.sim.models import FleetModels
from tide_fleet.infra.sim.queue import SimQueue
from tide_fleet.infra.sim.traces import BATCHES, Job, builtin_trace

ROOT = Path(__file__).resolve().parents[3]


def test_batch_windows_is_diurnal_plus_the_batches() -> None:
    fleet = load_fleet(ROOT / "fleet.example.toml")
    jobs, span = builtin_trace("batch-windows", 0, hours=3, models=FleetModels(fleet))
    plain, _ = builtin_trace("diurnal", 0, hours=3)
    due = [j for j in jobs if j.deadline is not None]
    assert len(jobs) - len(due) == len(plain) and span == 3 * 3600
    assert len(due) == sum(n for _, _, n in BATCHES)
    windows = {(j.arrival, j.deadline - j.arrival) for j in due}
    assert windows == {(t, w) for t, w, _ in BATCHES}
    assert {j.bucket for j in due} == {"long"}


def test_the_queue_serves_interactive_first_then_earliest_deadline() -> None:
    q = SimQueue()
    late, soon = Job(0, 0.0, 10, 5, 5, "long", deadline=900.0), Job(1, 1.0, 10, 5, 5, "long",
                                                                    deadline=100.0)  # fmt: skip
    chat = Job(2, 2.0, 10, 5, 5, "long")
    for job in (late, soon, chat):
        q.push(job)
    assert q.deadlines() == [(100.0, 15), (900.0, 15)] and q.oldest_arrival() == 0.0
    assert [q.pop() for _ in range(3)] == [chat, soon, late]
    assert len(q) == 0 and q.deadlines() == []


def test_tide_meets_the_deadlines_for_fewer_gpu_hours_than_without_them() -> None:
    fleet = load_fleet(ROOT / "fleet.example.toml")
    jobs, span = builtin_trace("batch-windows", 0, hours=3, models=FleetModels(fleet))
    r = simulate(fleet, jobs, span, policies=("tide", "tide_size_only"))
    tide, size_only = r["tide"], r["tide_size_only"]
    assert tide.deadline_jobs == size_only.deadline_jobs == len([j for j in jobs if j.deadline])
    assert tide.deadline_attainment == 1.0 and size_only.deadline_attainment == 1.0
    assert tide.gpu_hours < size_only.gpu_hours
    assert tide.summary()["deadline_attainment"] == 1.0


def test_simulate_reports_deadline_attainment(capsys) -> None:  # type: ignore[no-untyped-def]
    argv = ["simulate", "--trace", "batch-windows", "--hours", "2.5", "--json",
            "--policies", "tide,tide_size_only,list_length"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)["policies"]
    assert set(out) == {"tide", "tide_size_only", "list_length"}
    for figures in out.values():
        assert figures["deadline_jobs"] == sum(n for _, _, n in BATCHES)
        assert 0.0 <= figures["deadline_attainment"] <= 1.0
