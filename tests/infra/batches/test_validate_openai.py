"""Batch lines take the endpoints' fields, checked as the routes check them (a refused
field names itself in the line's error); a line is one job; output lines render choices
and logprobs as the routes do."""

from __future__ import annotations

import json

import pytest

from tests.gateway.live import entry
from tests.infra.batches.conftest import line
from tide_fleet.infra.batches.finalize import finalize_batch
from tide_fleet.infra.batches.validate import validate_batch
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.protocol import JobStatus

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


def refused_entry(world, batch_id: str, index: int) -> dict:  # type: ignore[no-untyped-def]
    value = world.h.batches.lines(batch_id)[index]
    assert value.startswith("error:"), value
    return json.loads(value.removeprefix("error:"))


@pytest.mark.parametrize(
    ("url", "body", "param"),
    [
        ("/v1/completions", {"prompt": ["a", "b"]}, "body.prompt"),
        ("/v1/completions", {"prompt": "a", "suffix": "z"}, "body.suffix"),
        ("/v1/completions", {"prompt": "a", "echo": True, "logprobs": 2}, "body.echo"),
        ("/v1/completions", {"prompt": "a", "logit_bias": {"999": 1}}, "body.logit_bias"),
        ("/v1/completions", {"prompt": "a", "response_format": {"type": "json_schema",
         "json_schema": {"name": "x", "schema": {"type": "wrong"}}}}, "body.response_format"),
        (CHAT, {"messages": MSG, "audio": {"voice": "alloy"}}, "body.audio"),
        (CHAT, {"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}]},
         "body.tools"),
        (CHAT, {"messages": MSG, "n": 99}, "body.n"),
    ],
)  # fmt: skip
def test_a_refused_field_names_itself_in_the_lines_error(world, url, body, param):
    text = line("ok", {"prompt": "a"} if url != CHAT else {"messages": MSG}, url=url)
    batch_id = world.new_batch(text + "\n" + line("bad", body, url=url), endpoint=url)
    assert validate_batch(batch_id) == "in_progress"
    refused = refused_entry(world, batch_id, 1)
    assert refused["param"] == param and refused["status"] == 400, refused
    assert world.h.jobs.get(world.h.batches.lines(batch_id)[0])["status"] == JobStatus.QUEUED


def test_line_options_reach_the_job_and_output_renders_choices(world):
    body = {"prompt": [1, 80], "n": 2, "logprobs": 1, "seed": 3, "presence_penalty": 0.5,
            "response_format": {"type": "choice", "choice": ["yes", "no"]}}  # fmt: skip
    batch_id = world.new_batch(line("a", body))
    validate_batch(batch_id)
    (job_id,) = world.job_ids(batch_id)
    job = world.h.jobs.get(job_id)
    sampling = json.loads(job["sampling"])
    assert sampling["n"] == 2 and sampling["logprobs"] == 1 and sampling["seed"] == 3
    assert sampling["structured"] == {"choice": ["yes", "no"]} and job["priority"] == "batch"
    assert json.loads(job["token_ids"]) == [1, 80]
    store = JobStore(world.h.client)
    _, token, _record = store.acquire(job_id, "w", 30)
    choices = [{"index": i, "text": t, "finish_reason": "stop", "completion_tokens": 1,
                "logprobs": [entry(t, 0, 1)]} for i, t in enumerate(["yes", "no"])]  # fmt: skip
    store.finish(job_id, token, "t", JobStatus.COMPLETED, text="yes", finish_reason="stop",
                 completion_tokens=2, choices=choices)  # fmt: skip
    world.h.batches.transition(batch_id, ["in_progress"], status="finalizing")
    assert finalize_batch(batch_id) == "completed"
    out_id = world.h.batches.get(batch_id)["output_file_id"]
    with world.h.files.storage.open(world.h.files.get(out_id)["storage_key"]) as f:
        (out,) = [json.loads(x) for x in f.read().splitlines()]
    got = out["response"]["body"]["choices"]
    assert [(c["index"], c["text"]) for c in got] == [(0, "yes"), (1, "no")]
    assert got[1]["logprobs"]["tokens"] == ["no"] and got[1]["logprobs"]["text_offset"] == [0]
    assert out["response"]["body"]["usage"]["completion_tokens"] == 2


def test_a_refused_lines_error_in_the_error_file_names_the_field(world):
    batch_id = world.new_batch(line("a", {"prompt": "a"}) + "\n" +
                               line("b", {"prompt": "a", "suffix": "z"}))  # fmt: skip
    validate_batch(batch_id)
    (job_id,) = world.job_ids(batch_id)
    world.finish(job_id)
    world.h.batches.transition(batch_id, ["in_progress"], status="finalizing", failed=1)
    finalize_batch(batch_id)
    err_id = world.h.batches.get(batch_id)["error_file_id"]
    with world.h.files.storage.open(world.h.files.get(err_id)["storage_key"]) as f:
        (err,) = [json.loads(x) for x in f.read().splitlines()]
    assert err["custom_id"] == "b" and err["error"]["param"] == "body.suffix"
    assert err["response"]["status_code"] == 400


def test_a_batch_line_over_the_ceiling_fails_alone(make_world, tiny_path):
    world = make_world(Settings(model=str(tiny_path), batch_retry_seconds=60.0,
                                max_request_tokens=300))  # fmt: skip
    text = line("ok", {"prompt": "abc", "max_tokens": 50}) + "\n"
    text += line("big", {"prompt": "abc", "n": 4, "max_tokens": 100})
    batch_id = world.new_batch(text)
    assert validate_batch(batch_id) == "in_progress"
    error = refused_entry(world, batch_id, 1)
    assert error["param"] == "body.max_tokens" and "ceiling of 300 tokens" in error["message"]
    assert len(world.job_ids(batch_id)) == 1
