"""Deadlines in trace files: `deadline` (seconds from the start, as arrival_s) or
`completion_window` (from the job's arrival) make a line a deadline job, reported as the
built-in batch-windows trace's are; bad values stop the run naming the line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tide_fleet.infra.fleet.fleet_config import load_fleet
from tide_fleet.infra.sim.compare import simulate
from tide_fleet.infra.sim.models import FleetModels
from tide_fleet.infra.sim.traces import builtin_trace, load_trace
from tide_fleet.infra.traces import TraceError

ROOT = Path(__file__).resolve().parents[3]


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_deadline_and_completion_window_set_the_jobs_deadline(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '{"arrival_s": 10, "prompt_tokens": 100, "max_tokens": 50, "deadline": 3610.5}',
        '{"arrival_s": 20, "prompt_tokens": 100, "max_tokens": 50, "completion_window": "30m"}',
        '{"arrival_s": 30, "prompt_tokens": 100, "max_tokens": 50, "completion_window": "24h"}',
        '{"arrival_s": 40, "prompt_tokens": 100, "max_tokens": 50}',
    )
    jobs, _ = load_trace(path)
    assert [j.deadline for j in jobs] == [3610.5, 20 + 1800.0, 30 + 86400.0, None]


def test_a_file_trace_reports_deadlines_as_the_builtin_one(tmp_path: Path) -> None:
    fleet = load_fleet(ROOT / "fleet.example.toml")
    models = FleetModels(fleet)
    jobs, span = builtin_trace("batch-windows", 0, hours=2.5, models=models)
    lines = []
    for j in jobs:
        row = {"arrival_s": j.arrival, "prompt_tokens": j.prompt_tokens,
               "max_tokens": j.max_tokens, "output_tokens": j.output_tokens}  # fmt: skip
        if j.deadline is not None:  # the 24 h batch by window, the 6 h one by deadline
            window = j.deadline - j.arrival
            row |= {"completion_window": "24h"} if window == 86400 else {"deadline": j.deadline}
        lines.append(json.dumps(row))
    read, _ = load_trace(write(tmp_path, *lines), hours=2.5, models=models)
    assert [(j.arrival, j.deadline, j.work) for j in read] == [
        (j.arrival, j.deadline, j.work) for j in jobs
    ]
    policies = ("tide", "list_length")
    builtin = simulate(fleet, jobs, span, policies=policies)
    from_file = simulate(fleet, read, span, policies=policies)
    for name in policies:
        want, got = builtin[name].summary(), from_file[name].summary()
        assert got["deadline_jobs"] == want["deadline_jobs"] == 3500
        assert got["deadline_attainment"] == want["deadline_attainment"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('"deadline": 100, "completion_window": "1h"',
         "trace.jsonl:1: field completion_window: give deadline or completion_window, not both"),
        ('"deadline": 5', r"trace.jsonl:1: field deadline .* after arrival_s \(10\), got 5"),
        ('"deadline": 10', r"trace.jsonl:1: field deadline .* got 10"),
        ('"deadline": "3600"', r"trace.jsonl:1: field deadline .* got '3600'"),
        ('"deadline": true', r"trace.jsonl:1: field deadline .* got True"),
        ('"completion_window": "1d"', r"trace.jsonl:1: field completion_window .* got '1d'"),
        ('"completion_window": "0h"', r"trace.jsonl:1: field completion_window .* got '0h'"),
        ('"completion_window": 3600', r"trace.jsonl:1: field completion_window .* got 3600"),
    ],
)  # fmt: skip
def test_bad_deadlines_name_the_line_and_field(tmp_path: Path, extra: str, message: str) -> None:
    path = write(tmp_path, f'{{"arrival_s": 10, "prompt_tokens": 5, "max_tokens": 5, {extra}}}')
    with pytest.raises(TraceError, match=message):
        load_trace(path)
