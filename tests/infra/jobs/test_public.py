"""The API views of records: a job record as JobPublic, a batch record as the Batch object."""

from __future__ import annotations

from tide_fleet.infra.jobs.public import job_public, public_batch
from tide_fleet.infra.wire.protocol import JobStatus, Priority


def test_job_public_of_a_completed_job():
    record = {
        "id": "job_1", "status": "completed", "bucket": "short", "priority": "interactive",
        "created_at": "10.0", "queued_at": "10.0", "started_at": "10.5",
        "first_token_at": "11.0", "finished_at": "12.0", "text": "hi", "finish_reason": "stop",
        "prompt_tokens": "4", "completion_tokens": "2", "attempts": "1",
        "metadata": '{"k": "v"}', "webhook_url": "https://example.com/h",
        "webhook_attempts": "2", "webhook_status": "delivered",
    }  # fmt: skip
    job = job_public(record)
    assert job.status is JobStatus.COMPLETED and job.priority is Priority.INTERACTIVE
    assert (job.result.text, job.result.finish_reason) == ("hi", "stop")
    assert (job.usage.prompt_tokens, job.usage.completion_tokens) == (4, 2)
    assert job.timings.queue_seconds == 0.5 and job.timings.ttft_seconds == 1.0
    assert job.metadata == {"k": "v"} and job.error is None
    assert job.webhook == {"url": "https://example.com/h", "attempts": 2, "status": "delivered"}


def test_job_public_of_a_queued_job():
    record = {"id": "job_2", "status": "queued", "bucket": "short", "priority": "batch",
              "created_at": "10.0", "queued_at": "10.0"}  # fmt: skip
    job = job_public(record)
    assert job.result is None and job.webhook is None and job.metadata is None
    assert job.timings.started_at is None and job.timings.queue_seconds is None
    assert job.attempts == 0 and job.usage.completion_tokens == 0


def test_public_batch():
    record = {
        "id": "batch_1", "endpoint": "/v1/completions", "input_file_id": "file-1",
        "completion_window": "24h", "status": "failed", "created_at": "100.7",
        "failed_at": "101.2", "expires_at": "86500.0", "total": "", "completed": "0",
        "errors": '[{"code": "empty_file", "line": null}]', "metadata": "",
        "output_file_id": "",
    }  # fmt: skip
    batch = public_batch(record)
    assert batch["object"] == "batch" and batch["status"] == "failed"
    assert batch["errors"] == {"object": "list", "data": [{"code": "empty_file", "line": None}]}
    assert (batch["created_at"], batch["failed_at"], batch["in_progress_at"]) == (100, 101, None)
    assert batch["output_file_id"] is None and batch["metadata"] is None
    assert batch["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
