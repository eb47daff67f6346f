"""What ended a job maps to its HTTP answer; a structured spec compiles once per cache key."""

from __future__ import annotations

import pytest

from tide_fleet.infra.jobs import request_checks
from tide_fleet.infra.jobs.errors import SubmissionError
from tide_fleet.infra.jobs.job_errors import unfinished_job
from tide_fleet.infra.jobs.request_checks import check_structured


@pytest.mark.parametrize(
    ("record", "status", "code", "retry"),
    [
        ({"status": "cancelled"}, 409, "job_cancelled", False),
        ({"status": "expired"}, 504, "expired", False),
        (None, 503, "no_worker", True),
        ({"status": "failed", "error": "rejected by the worker: top_k"}, 400, "job_rejected",
         False),
        ({"status": "failed", "error": "choice 1: engine error"}, 500, "job_failed", False),
    ],
)  # fmt: skip
def test_unfinished_job_answers(record, status, code, retry):
    answer = unfinished_job("job_9", record)
    assert (answer.status, answer.code) == (status, code) and "job_9" in answer.message
    assert bool(answer.headers and answer.headers.get("Retry-After")) == retry


def test_a_schema_compiles_once_for_many_lines(monkeypatch):
    request_checks._compile_error.cache_clear()
    calls = []
    real = request_checks.validate
    monkeypatch.setattr(request_checks, "validate", lambda spec: calls.append(spec) or real(spec))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
    for _ in range(1000):
        check_structured({"json_schema": schema}, "response_format")
    reordered = {"properties": {"b": {"type": "string"}, "a": {"type": "integer"}},
                 "type": "object"}  # fmt: skip
    check_structured({"json_schema": reordered}, "response_format")  # the same cache key
    assert len(calls) == 1
    for _ in range(3):
        with pytest.raises(SubmissionError) as e:
            check_structured({"regex": "(["}, "response_format.regex")
    assert len(calls) == 2  # a bad spec's error is cached too
    assert e.value.param == "response_format.regex" and e.value.code == "invalid_schema"
    assert "unclosed" in e.value.message
