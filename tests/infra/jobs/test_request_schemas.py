"""The request schemas as the batch fan-out uses them: plain dicts from JSON lines, no HTTP."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tide_fleet.infra.jobs.schemas import ChatCompletionCreate, CompletionCreate, JobCreate
from tide_fleet.infra.jobs.submission import ModelInfo, SubmissionError, build_job
from tide_fleet.infra.settings import Settings


@pytest.mark.parametrize(
    ("model", "body", "field"),
    [
        (CompletionCreate, {"prompt": "a", "max_tokens": "8"}, "max_tokens"),
        (CompletionCreate, {"prompt": "a", "ignore_eos": "yes"}, "ignore_eos"),
        (CompletionCreate, {"prompt": "a", "top_k": 0}, "top_k"),
        (CompletionCreate, {"prompt": "a", "stop": "x" * 257}, "stop"),
        (CompletionCreate, {"prompt": "a\udfff"}, "prompt"),
        (ChatCompletionCreate, {"messages": [{"role": "user", "content": "\ud800"}]},
         "messages"),
        (JobCreate, {"prompt": "a", "metadata": {"k": "v" * 513}}, "metadata"),
    ],
)  # fmt: skip
def test_batch_lines_get_the_same_strict_checks(model, body, field):
    with pytest.raises(ValidationError) as e:
        model.model_validate(body)
    assert e.value.errors()[0]["loc"][0] == field


def test_the_batch_path_still_builds_jobs_from_validated_requests():
    line = CompletionCreate.model_validate({"prompt": "a", "temperature": 0, "stop": ["x"]})
    job = JobCreate(**line.sampling(), prompt=line.prompt)
    assert job.stop == ["x"] and job.temperature == 0.0


def test_an_unencodable_idempotency_key_is_refused(tiny_path):
    info = ModelInfo.load(str(tiny_path))
    with pytest.raises(SubmissionError) as e:
        build_job(Settings(), info, "t", JobCreate(prompt="a"), "key-\udfff")
    assert e.value.status == 400 and e.value.param == "Idempotency-Key"
