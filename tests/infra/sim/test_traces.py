"""The simulator's jobs: trace files bucketed and cut to --hours, the built-in traces' shape.
(The file format's errors: tests/infra/test_traces.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tide_fleet.infra.sim.traces import builtin_trace, load_trace


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_trace_file_parses_and_buckets(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '{"arrival_s": 5, "prompt_tokens": 3000, "max_tokens": 100, "id": "b"}',
        "",
        '{"arrival_s": 1.5, "prompt_tokens": 100, "max_tokens": 50, "output_tokens": 20}',
        '{"arrival_s": 9, "prompt_tokens": 9000, "max_tokens": 10}',
    )
    jobs, span = load_trace(path)
    assert [(j.arrival, j.bucket, j.output_tokens) for j in jobs] == [
        (1.5, "short", 20), (5.0, "medium", 100), (9.0, "long", 10),
    ]  # fmt: skip
    assert span == 9.0
    jobs, span = load_trace(path, hours=6 / 3600)
    assert len(jobs) == 2 and span == pytest.approx(6.0)


def test_empty_or_missing_trace(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no jobs"):
        load_trace(write(tmp_path, ""))
    with pytest.raises(ValueError, match=r"nope\.jsonl: No such file"):
        load_trace(tmp_path / "nope.jsonl")


def test_builtin_traces_have_their_shape() -> None:
    jobs, span = builtin_trace("diurnal", 0)
    assert span == 86400
    per_hour = [0] * 24
    for j in jobs:
        per_hour[int(j.arrival // 3600)] += 1
    assert max(per_hour) / min(per_hour) > 6  # day/night: a peak ~10x the trough
    assert {j.bucket for j in jobs} == {"short", "medium", "long"}  # heavy tails reach long
    mixed, _ = builtin_trace("mixed", 0)
    long_share = sum(j.bucket == "long" for j in mixed) / len(mixed)
    assert 0.17 < long_share < 0.23  # the 80/20 mix
    with pytest.raises(ValueError, match="unknown trace 'weekly'"):
        builtin_trace("weekly", 0)
