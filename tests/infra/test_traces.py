"""Trace files, both formats: rows as written, and errors that name the file, the line and
the field (a misspelt field is an error, not a silent default)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tide_fleet.infra.traces import (
    JobRow,
    RequestRow,
    TraceError,
    read_job_trace,
    read_request_trace,
)


def _trace(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_job_rows_as_written_with_output_defaulting_to_max_tokens(tmp_path: Path) -> None:
    path = _trace(tmp_path, [
        '{"arrival_s": 5, "prompt_tokens": 3000, "max_tokens": 100, "id": "b"}',
        "",
        '{"arrival_s": 1.5, "prompt_tokens": 100, "max_tokens": 50, "output_tokens": 20}',
    ])  # fmt: skip
    assert read_job_trace(path) == [JobRow(5.0, 3000, 100, 100), JobRow(1.5, 100, 50, 20)]
    assert read_job_trace(_trace(tmp_path, [""])) == []


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"trace.jsonl:2: not valid JSON"),
        ("[1, 2]", r"trace.jsonl:2: each line must be a JSON object"),
        ('{"prompt_tokens": 5, "max_tokens": 5}', r"trace.jsonl:2: field arrival_s .*None"),
        ('{"arrival_s": -1, "prompt_tokens": 5, "max_tokens": 5}', r":2: field arrival_s"),
        ('{"arrival_s": 1, "prompt_tokens": 0, "max_tokens": 5}', r":2: field prompt_tokens"),
        ('{"arrival_s": 1, "prompt_tokens": 5, "max_tokens": 2.5}', r":2: field max_tokens"),
        ('{"arrival_s": 1, "prompt_tokens": 5, "max_tokens": 5, "output_tokens": 6}',
         r":2: field output_tokens \(6\) exceeds max_tokens \(5\)"),
        ('{"arrival_s": 1, "prompt_tokens": 5, "max_token": 5}',
         r":2: unknown fields \['max_token'\]"),
    ],
)  # fmt: skip
def test_job_trace_errors_name_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    path = _trace(tmp_path, ['{"arrival_s": 0, "prompt_tokens": 5, "max_tokens": 5}', line])
    with pytest.raises(TraceError, match=message):
        read_job_trace(path)


def test_missing_trace_is_named(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"nope\.jsonl: No such file"):
        read_job_trace(tmp_path / "nope.jsonl")
    with pytest.raises(TraceError, match=r"nope\.jsonl: No such file"):
        read_request_trace(tmp_path / "nope.jsonl")


def test_request_rows_as_written(tmp_path: Path) -> None:
    path = _trace(tmp_path, [
        '{"prompt": "Once upon a time", "max_tokens": 5, "offset": 0.5}',
        "",
        '{"prompt_len": 12, "max_tokens": 3, "offset": 0}',
    ])  # fmt: skip
    assert read_request_trace(path) == [
        RequestRow(5, "Once upon a time", None, 0.5),
        RequestRow(3, None, 12, 0),
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "trace.jsonl:1: not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"prompt": "x", "max_tokens": 1, "temp": 0}', "unknown fields ['temp']"),
        (
            '{"prompt": "x", "prompt_len": 3, "max_tokens": 1}',
            "exactly one of prompt or prompt_len",
        ),
        ('{"max_tokens": 1}', "exactly one of prompt or prompt_len"),
        ('{"prompt": "", "max_tokens": 1}', "prompt must be a non-empty string"),
        ('{"prompt_len": 0, "max_tokens": 1}', "prompt_len must be an integer >= 1, got 0"),
        ('{"prompt": "x", "max_tokens": 2.5}', "max_tokens must be an integer >= 1"),
        ('{"prompt": "x"}', "max_tokens is required"),
        (
            '{"prompt": "x", "max_tokens": 1, "offset": -1}',
            "offset must be a number of seconds >= 0",
        ),
    ],
)
def test_request_trace_errors_name_the_line_and_field(
    tmp_path: Path, line: str, message: str
) -> None:
    with pytest.raises(TraceError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_request_trace(_trace(tmp_path, [line]))


def test_request_offsets_all_or_none_and_not_empty(tmp_path: Path) -> None:
    mixed = ['{"prompt": "a", "max_tokens": 1, "offset": 1}', '{"prompt": "b", "max_tokens": 1}']
    with pytest.raises(TraceError, match=r"offset on every line or on none \(1 of 2"):
        read_request_trace(_trace(tmp_path, mixed))
    with pytest.raises(TraceError, match="no requests"):
        read_request_trace(_trace(tmp_path, [""]))
