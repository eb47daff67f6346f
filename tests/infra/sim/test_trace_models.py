"""Traces that name models: the optional `model` field (absent: the fleet's default model),
resolved by served name or alias, bucketed with that model's thresholds; an unknown model is
an error naming the line and the model; the built-in traces split over a model mix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tide_fleet.infra.fleet.fleet_config import FleetConfig, parse_fleet
from tide_fleet.infra.sim.models import FleetModels
from tide_fleet.infra.sim.traces import builtin_trace, load_trace
from tide_fleet.infra.traces import JobRow, TraceError, read_job_trace

POOL = {"buckets": ["short", "medium", "long"], "device": "l4"}


def two_models(default: str | None = None, **b: object) -> FleetConfig:
    spec: dict[str, object] = {"pools": {"pa": POOL | {"served_name": "a"},
                                         "pb": POOL | {"served_name": "b"} | b}}  # fmt: skip
    if default:
        spec["default_model"] = default
    return parse_fleet(spec)


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_job_rows_carry_their_model_and_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '{"arrival_s": 1, "prompt_tokens": 5, "max_tokens": 5, "model": "b"}',
        "",
        '{"arrival_s": 2, "prompt_tokens": 5, "max_tokens": 5}',
    )
    rows = read_job_trace(path)
    assert rows == [JobRow(1.0, 5, 5, 5, "b"), JobRow(2.0, 5, 5, 5)]
    assert [r.model for r in rows] == ["b", None] and [r.line for r in rows] == [1, 3]


@pytest.mark.parametrize("value", ["5", '""', "null", '["a"]', '"two words"'])
def test_model_must_be_a_name(tmp_path: Path, value: str) -> None:
    path = write(
        tmp_path,
        '{"arrival_s": 0, "prompt_tokens": 5, "max_tokens": 5}',
        '{"arrival_s": 1, "prompt_tokens": 5, "max_tokens": 5, "model": ' + value + "}",
    )
    with pytest.raises(TraceError, match=r"trace.jsonl:2: field model must be a model name"):
        read_job_trace(path)


def test_jobs_go_to_their_model_default_when_absent(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '{"arrival_s": 0, "prompt_tokens": 5, "max_tokens": 5}',
        '{"arrival_s": 1, "prompt_tokens": 5, "max_tokens": 5, "model": "b"}',
        '{"arrival_s": 2, "prompt_tokens": 5, "max_tokens": 5, "model": "bee"}',
        '{"arrival_s": 3, "prompt_tokens": 5, "max_tokens": 5, "model": "a"}',
    )
    jobs, _ = load_trace(path, models=FleetModels(two_models(aliases=["bee"])))
    assert [j.model for j in jobs] == ["a", "b", "b", "a"]  # the first pool's model: default
    jobs, _ = load_trace(path, models=FleetModels(two_models(default="b", aliases=["bee"])))
    assert [j.model for j in jobs] == ["b", "b", "b", "a"]


def test_each_model_buckets_with_its_own_thresholds(tmp_path: Path) -> None:
    line = '{"arrival_s": 0, "prompt_tokens": 200, "max_tokens": 100, "model": "%s"}'
    path = write(tmp_path, line % "a", line % "b")
    jobs, _ = load_trace(path, models=FleetModels(two_models(bucket_short_max=256)))
    assert [(j.model, j.bucket) for j in jobs] == [("a", "short"), ("b", "medium")]


def test_unknown_model_names_the_line_and_the_model(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '{"arrival_s": 0, "prompt_tokens": 5, "max_tokens": 5, "model": "a"}',
        '{"arrival_s": 1, "prompt_tokens": 5, "max_tokens": 5, "model": "mistral"}',
    )
    with pytest.raises(TraceError, match=r"trace.jsonl:2: model 'mistral' is not served by the "
                                         r"fleet \(it serves a, b\)"):  # fmt: skip
        load_trace(path, models=FleetModels(two_models()))


def test_without_a_fleet_a_named_model_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, '{"arrival_s": 0, "prompt_tokens": 5, "max_tokens": 5, "model": "a"}')
    with pytest.raises(TraceError, match=r"trace.jsonl:1: model 'a'"):
        load_trace(path)


def test_builtin_trace_splits_over_a_model_mix_without_moving_arrivals() -> None:
    models = FleetModels(two_models())
    plain, span = builtin_trace("mixed", 0, hours=1)
    mixed, span2 = builtin_trace("mixed", 0, hours=1, mix={"a": 0.7, "b": 0.3}, models=models)
    assert span == span2
    assert [(j.arrival, j.work) for j in mixed] == [(j.arrival, j.work) for j in plain]
    share_b = sum(j.model == "b" for j in mixed) / len(mixed)
    assert 0.25 < share_b < 0.35
    again, _ = builtin_trace("mixed", 0, hours=1, mix={"a": 0.7, "b": 0.3}, models=models)
    assert [j.model for j in again] == [j.model for j in mixed]  # seeded
    default_only, _ = builtin_trace("mixed", 0, hours=1, models=models)
    assert {j.model for j in default_only} == {"a"}
    with pytest.raises(ValueError, match=r"--models: model 'c' is not served"):
        builtin_trace("mixed", 0, hours=1, mix={"a": 0.5, "c": 0.5}, models=models)
    with pytest.raises(ValueError, match=r"--models: shares must be > 0"):
        builtin_trace("mixed", 0, hours=1, mix={"a": 1.0, "b": 0.0}, models=models)
