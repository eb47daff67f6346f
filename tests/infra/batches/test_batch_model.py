"""One model per batch file (OpenAI's rule): every line's `body.model` names the same served
model (an alias is the model; none: the default), checked with the file; the batch's jobs
go to that model's queues, tokenised by it, and the batch and its records name it."""

from __future__ import annotations

import json

import pytest

from tests.infra.batches.conftest import line
from tide_fleet.infra.batches.finalize import finalize_batch
from tide_fleet.infra.batches.validate import MAX_FILE_ERRORS, check_envelopes, validate_batch
from tide_fleet.infra.jobs.public import public_batch
from tide_fleet.infra.jobs.submission import ModelInfo
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire.models import catalog
from tide_fleet.infra.wire.protocol import queue_name

OK = {"prompt": "Once upon a time", "max_tokens": 40}


@pytest.fixture
def two(make_world, tiny_path, stories_path):  # type: ignore[no-untyped-def]
    models = [{"name": "tiny", "model": str(tiny_path), "aliases": ["t"]},
              {"name": "stories", "model": str(stories_path), "aliases": ["st"],
               "bucket_short_max": 32}]  # fmt: skip
    return make_world(Settings(model=str(tiny_path), served_models=models))


def _lines(*models: str | None) -> str:
    bodies = [OK | ({"model": m} if m is not None else {}) for m in models]
    return "\n".join(line(f"r{i}", b) for i, b in enumerate(bodies)) + "\n"


def _check(world, text: str):  # type: ignore[no-untyped-def]
    cat = catalog(world.h.settings)
    return check_envelopes(world.h.files, world.upload(text), "/v1/completions", 100, cat)


def _queued(world) -> dict[str, int]:  # type: ignore[no-untyped-def]
    r = world.h.client
    # A batch's jobs have a deadline (its window's end): their messages are in the queue's
    # deadline zset.
    return {
        k.decode().removesuffix(":deadlines"): r.zcard(k)
        for k in r.keys("tide.*:deadlines")
        if r.type(k) == b"zset"
    }


def test_lines_naming_different_models_fail_the_file_naming_them(two):
    check = _check(two, _lines(None, "stories", "t", "st"))
    assert [(e["code"], e["line"], e["param"]) for e in check.errors] == [
        ("mismatched_model", 2, "body.model"), ("mismatched_model", 4, "body.model"),
    ]  # fmt: skip
    assert check.errors[0]["message"] == (
        "line 2: model 'stories' differs from the batch's model 'tiny' (line 1); a batch "
        "file takes one model"
    )
    assert check.model is None


def test_a_mixed_batch_fails_validation_and_writes_no_job(two):
    batch_id = two.new_batch(_lines("stories", None))
    assert validate_batch(batch_id) == "failed"
    batch = two.h.batches.get(batch_id)
    (error,) = json.loads(batch["errors"])
    assert error["code"] == "mismatched_model" and error["line"] == 2
    assert "the batch's model 'stories' (line 1)" in error["message"]
    assert not two.h.batches.lines(batch_id) and _queued(two) == {}


def test_an_unknown_model_fails_the_file_naming_the_line_and_the_served_models(two):
    check = _check(two, _lines(None, "gpt-4o"))
    assert [(e["code"], e["line"], e["param"]) for e in check.errors] == [
        ("model_not_found", 2, "body.model")
    ]
    message = check.errors[0]["message"]
    assert message.startswith("line 2: body.model 'gpt-4o' is not served here")
    assert "'tiny', 'stories'" in message


@pytest.mark.parametrize(
    ("bad", "shown"), [(3, "3"), (["tiny"], "['tiny']"), (["x" * 200], "['" + "x" * 75 + "...")]
)
def test_a_model_that_is_not_a_string_is_refused_naming_the_field(two, bad, shown):
    (error,) = _check(two, line("a", OK | {"model": bad}) + "\n").errors
    assert (error["code"], error["line"], error["param"]) == ("invalid_model", 1, "body.model")
    assert error["message"] == f"line 1: body.model must be a served model's name, got {shown}"


def test_an_alias_and_the_name_of_one_model_make_one_batch(two):
    check = _check(two, _lines("t", "tiny", None))
    assert check.errors == [] and check.model is not None and check.model.name == "tiny"
    batch_id = two.new_batch(_lines("t", None, "tiny"))
    assert validate_batch(batch_id) == "in_progress"
    assert two.h.batches.get(batch_id)["model"] == "tiny"
    assert _queued(two) == {queue_name("short", "batch"): 3}  # the default's own queue names


def test_a_batch_for_another_model_goes_to_its_lane(two, stories_path):
    batch_id = two.new_batch(_lines("stories", "st"))
    assert validate_batch(batch_id) == "in_progress"
    assert two.h.batches.get(batch_id)["model"] == "stories"
    assert public_batch(two.h.batches.get(batch_id))["model"] == "stories"  # as OpenAI's
    # its bucket rule (short up to 32 tokens) and its queues, at batch priority
    assert _queued(two) == {queue_name("medium", "batch", "stories"): 2}
    stories = ModelInfo.load(str(stories_path))
    for job_id in two.job_ids(batch_id):
        job = two.h.jobs.get(job_id)
        assert job["model"] == "stories" and job["bucket"] == "medium"
        assert json.loads(job["token_ids"]) == stories.encode(OK["prompt"])  # its tokenizer
    for job_id in two.job_ids(batch_id):
        two.finish(job_id)
    two.h.batches.transition(batch_id, ["in_progress"], status="finalizing")
    assert finalize_batch(batch_id) == "completed"
    out = two.h.files.get(two.h.batches.get(batch_id)["output_file_id"])
    with two.h.files.storage.open(out["storage_key"]) as f:
        rows = [json.loads(x) for x in f.read().splitlines()]
    assert [r["response"]["body"]["model"] for r in rows] == ["stories", "stories"]


def test_a_file_without_models_runs_as_before(world, tiny_path):
    check = _check(world, _lines(None, None))
    assert check.errors == [] and check.model is not None and check.model.served.lane == ""
    batch_id = world.new_batch(_lines(None, None))
    assert validate_batch(batch_id) == "in_progress"
    assert _queued(world) == {queue_name("short", "batch"): 2}
    assert public_batch(world.h.batches.get(world.new_batch("\n")))["model"] is None
    job = world.h.jobs.get(world.job_ids(batch_id)[0])
    assert "backlog" not in job and job["model"] == str(tiny_path)
    assert world.h.batches.get(batch_id)["model"] == str(tiny_path)


def test_model_errors_stop_at_the_cap(two):
    check = _check(two, _lines(None, *["stories"] * (MAX_FILE_ERRORS + 5)))
    assert len(check.errors) == MAX_FILE_ERRORS
    assert check.errors[-1]["line"] == MAX_FILE_ERRORS + 1
