"""Writing a finished batch's output and error files (the ``finalize`` task).

Both files are JSONL in input order, one line per request: the output file holds the
lines that succeeded, the error file the rest (refused at fan-out, failed, cancelled or
expired jobs). Each is streamed from the job records in chunks, and has a fixed file id,
so a task that runs twice writes the same files; only the one whose status transition
wins sends the batch's webhook.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from tide_fleet.infra.batches.store import FANOUT_CHUNK, REFUSED, BatchStore, handles, refusal
from tide_fleet.infra.jobs.celery_app import celery_app
from tide_fleet.infra.jobs.openai_format import chat_body, completion_body
from tide_fleet.infra.jobs.webhooks import enqueue_webhook
from tide_fleet.infra.wire.codec import decode_hash
from tide_fleet.infra.wire.protocol import JobStatus, Keys

BodyMaker = Callable[[dict[str, str], str], dict[str, Any]]  # a completed job's response body


def refused_line(
    status: int, message: str, custom_id: str | None, param: str | None,
    code: str = "invalid_request",
) -> dict[str, Any]:  # fmt: skip
    """The output line of a line refused before it ran (`param`: the body field refused);
    `tide batch run --offline` writes its refusals with it too."""
    return {
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": None, "body": None},
        "error": {"code": code, "message": message, "param": param},
    }


def _refused_line(entry: str) -> dict[str, Any]:
    refused = json.loads(entry.removeprefix(REFUSED))
    return refused_line(
        refused["status"], refused["message"], refused["custom_id"], refused.get("param")
    )


def _job_line(job: dict[str, str], model: str, make_body: BodyMaker) -> dict[str, Any]:
    line: dict[str, Any] = {"custom_id": job.get("custom_id", "")}
    if job.get("status") == JobStatus.COMPLETED:
        body = make_body(job, model)
        line |= {
            "response": {"status_code": 200, "request_id": job["id"], "body": body},
            "error": None,
        }
    elif job.get("status") == JobStatus.EXPIRED:  # OpenAI's line for a window that ran out
        message = "This request could not be executed before the completion window expired."
        line |= {"response": None, "error": {"code": "batch_expired", "message": message}}
    else:
        status = job.get("status") or "expired"
        message = job.get("error") or f"job {status}"
        line |= {"response": None, "error": {"code": f"job_{status}", "message": message}}
    return line


def output_lines(
    batch: dict[str, str], batches: BatchStore, model: str, want_errors: bool
) -> Iterator[bytes]:
    """The output (or error) file's lines, in input order, streamed in chunks of jobs."""
    batch_id, total = batch["id"], int(batch.get("total") or 0)
    lines = batches.lines(batch_id)
    make_body: BodyMaker = (
        chat_body if batch["endpoint"] == "/v1/chat/completions" else completion_body
    )
    lost = refusal(500, "line lost", "")
    for start in range(0, total, FANOUT_CHUNK):
        chunk = [lines.get(i, lost) for i in range(start, min(total, start + FANOUT_CHUNK))]
        job_ids = [v for v in chunk if not v.startswith(REFUSED)]
        pipe = batches.r.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hgetall(Keys.job(job_id))
        records = dict(zip(job_ids, pipe.execute(), strict=True))
        out = []
        for i, v in enumerate(chunk, start):
            line: dict[str, Any] = {"id": f"batch_req_{batch_id}_{i}"}
            if v.startswith(REFUSED):
                line |= _refused_line(v)
            else:
                line |= _job_line(decode_hash(records[v]), model, make_body)
            if (line["error"] is not None) == want_errors:
                out.append(json.dumps(line, ensure_ascii=False).encode() + b"\n")
        if out:
            yield b"".join(out)


@celery_app.task(name="tide.batch.finalize")
def finalize_batch(batch_id: str) -> str:
    h = handles()
    batches, files = h.batches, h.files
    batch = batches.get(batch_id)
    if batch is None or batch["status"] != "finalizing":
        return "skipped"
    model = batch.get("model") or h.settings.model  # a batch from before batches named one
    tenant = batch["tenant"]
    succeeded = output_lines(batch, batches, model, want_errors=False)
    output = files.create(
        tenant, f"{batch_id}_output.jsonl", "batch_output", succeeded,
        file_id=f"file-{batch_id}-output",
    )  # fmt: skip
    fields: dict[str, Any] = {"output_file_id": output["id"]}
    if int(batch.get("failed") or 0) or batch.get("final_status"):
        failed = output_lines(batch, batches, model, want_errors=True)
        errors = files.create(
            tenant, f"{batch_id}_errors.jsonl", "batch_output", failed,
            file_id=f"file-{batch_id}-errors",
        )  # fmt: skip
        if int(errors["bytes"]):
            fields["error_file_id"] = errors["id"]
    final = batch.get("final_status") or "completed"
    now = time.time()
    fields |= {"status": final, f"{final}_at": now}
    if final != "completed":
        fields["completed_at"] = ""
    won = batches.transition(batch_id, ["finalizing"], **fields)
    h.client.srem(Keys.active_batches, batch_id)
    if won and batch.get("webhook_url"):
        enqueue_webhook(batch_id, final, kind="batch")
    return final
