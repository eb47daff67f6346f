"""Validation of the input file (file-level errors name their line) and fan-out into jobs."""

from __future__ import annotations

import json

import pytest

from tests.infra.batches.conftest import line
from tide_fleet.infra.batches.validate import (
    MAX_FILE_ERRORS,
    check_envelopes,
    fan_out,
    validate_batch,
)
from tide_fleet.infra.jobs.targets import Target
from tide_fleet.infra.wire.models import catalog
from tide_fleet.infra.wire.protocol import JobStatus, Keys, Priority

OK = {"prompt": "Once upon a time", "max_tokens": 4}


def _errors(world, text: str, endpoint: str = "/v1/completions", max_lines: int = 100):
    file = world.upload(text)
    return check_envelopes(
        world.h.files, file, endpoint, max_lines, catalog(world.h.settings)
    ).errors


def test_a_good_file_has_no_errors(world):
    assert _errors(world, line("a", OK) + "\n\n" + line("b", OK) + "\n") == []


@pytest.mark.parametrize(
    ("bad", "code"),
    [
        ("not json", "invalid_json"),
        ("[1, 2]", "invalid_json"),
        (json.dumps({"method": "POST", "url": "/v1/completions", "body": OK}), "missing_custom_id"),
        (line("a", OK), "duplicate_custom_id"),
        (json.dumps({"custom_id": "z", "method": "GET", "url": "/v1/completions", "body": OK}),
         "invalid_method"),
        (line("z", OK, url="/v1/chat/completions"), "mismatched_url"),
        (json.dumps({"custom_id": "z", "method": "POST", "url": "/v1/completions", "body": 3}),
         "missing_body"),
    ],
)  # fmt: skip
def test_file_errors_name_their_line(world, bad, code):
    errors = _errors(world, line("a", OK) + "\n" + bad + "\n")
    assert [(e["code"], e["line"]) for e in errors] == [(code, 2)]
    assert errors[0]["message"].startswith("line 2: ")


def test_empty_and_oversized_files(world):
    assert [e["code"] for e in _errors(world, "\n  \n")] == ["empty_file"]
    text = "\n".join(line(f"r{i}", OK) for i in range(4))
    errors = _errors(world, text, max_lines=3)
    assert [(e["code"], e["line"]) for e in errors] == [("too_many_requests", 4)]


def test_errors_stop_at_the_cap(world):
    errors = _errors(world, "\n".join("x" for _ in range(MAX_FILE_ERRORS + 5)))
    assert len(errors) == MAX_FILE_ERRORS


def test_validate_fans_out_one_batch_job_per_line(world):
    bad = {"prompt": "x", "max_tokens": "8"}  # a strict int: refused, not coerced
    text = "\n".join([line("a", OK), line("b", bad), line("c", OK | {"max_tokens": 3})])
    batch_id = world.new_batch(text)
    assert validate_batch(batch_id) == "in_progress"
    batch = world.h.batches.get(batch_id)
    assert batch["status"] == "in_progress" and batch["total"] == "3" and batch["refused"] == "1"
    lines = world.h.batches.lines(batch_id)
    refused = json.loads(lines[1].removeprefix("error:"))
    assert refused["status"] == 400 and refused["custom_id"] == "b"
    assert refused["message"].startswith("body.max_tokens: ")
    for index, custom_id in ((0, "a"), (2, "c")):
        job = world.h.jobs.get(lines[index])
        assert job["status"] == JobStatus.QUEUED and job["priority"] == Priority.BATCH
        assert (job["batch_id"], job["batch_line"], job["custom_id"]) == (
            batch_id, str(index), custom_id,
        )  # fmt: skip
    assert world.h.client.sismember(Keys.active_batches, batch_id)


def test_fan_out_twice_duplicates_nothing(world):
    batch_id = world.new_batch("\n".join(line(f"r{i}", OK) for i in range(3)))
    batch = world.h.batches.get(batch_id)
    file = world.h.files.get(batch["input_file_id"])
    model = Target(catalog(world.h.settings).default)
    assert fan_out(batch, file, model) == 3
    first = world.h.batches.lines(batch_id)
    assert fan_out(batch, file, model) == 3
    assert world.h.batches.lines(batch_id) == first
    assert len(set(first.values())) == 3


def test_validate_fails_a_bad_file_and_skips_a_moved_batch(world):
    batch_id = world.new_batch(line("a", OK) + "\nnot json\n")
    assert validate_batch(batch_id) == "failed"
    batch = world.h.batches.get(batch_id)
    assert batch["status"] == "failed" and json.loads(batch["errors"])[0]["line"] == 2
    assert validate_batch(batch_id) == "skipped"
    assert validate_batch("batch_missing") == "skipped"


def test_validate_of_a_missing_file_fails(world):
    batch_id = world.new_batch(line("a", OK), input_file_id="file-gone")
    assert validate_batch(batch_id) == "failed"
    assert json.loads(world.h.batches.get(batch_id)["errors"])[0]["code"] == "missing_file"


def test_a_batch_cancelled_before_fan_out_is_cancelled(world):
    batch_id = world.new_batch(line("a", OK), status="cancelling")
    assert validate_batch(batch_id) == "cancelled"
    assert world.h.batches.get(batch_id)["status"] == "cancelled"
    assert not world.h.batches.lines(batch_id)
