"""Validation of a batch's input file and its fan-out into jobs (the ``validate`` task).

The file is checked whole before any job is written: a file-level problem (bad JSON, a
missing or repeated custom_id, the wrong method or URL, a model not served or lines naming
different models: one model per file, infra/batches/one_model.py) fails the batch with the
lines named. Fan-out then writes one job per line at batch priority, for the batch's model
(its tokenizer, bucket rules and queues; a LoRA adapter's: its parent's, the adapter named
in each job's ``lora``); a line whose body is refused (a bad field, too
long a prompt) gets a refusal in the line table instead. Each line's job has an
idempotency key, so a task that runs twice (a Celery restart, acks_late) never duplicates
a line.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from pydantic import ValidationError

from tide_fleet.infra.batches.one_model import OneModel
from tide_fleet.infra.batches.store import FANOUT_CHUNK, REFUSED, handles, refusal
from tide_fleet.infra.jobs.celery_app import celery_app
from tide_fleet.infra.jobs.errors import bad_request
from tide_fleet.infra.jobs.files import FileStore
from tide_fleet.infra.jobs.openai_request import PlannedJob, chat_job, completion_jobs
from tide_fleet.infra.jobs.schemas import ChatCompletionCreate, CompletionCreate
from tide_fleet.infra.jobs.submission import ModelInfo, SubmissionError, build_job
from tide_fleet.infra.jobs.targets import Target
from tide_fleet.infra.wire.models import ModelCatalog, catalog
from tide_fleet.infra.wire.protocol import Keys, Priority

ENDPOINTS: dict[str, type[CompletionCreate] | type[ChatCompletionCreate]] = {
    "/v1/completions": CompletionCreate,
    "/v1/chat/completions": ChatCompletionCreate,
}
NO_LIMIT = 2**62  # batch jobs are bounded by the file limits, not the per-request ones
MAX_FILE_ERRORS = 20


@functools.cache
def _model(name: str) -> ModelInfo:
    return ModelInfo.load(name)


def _lines(files: FileStore, file: dict[str, str]) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, bytes) of non-blank lines, streamed."""
    with files.storage.open(file["storage_key"]) as f:
        for n, raw in enumerate(f, 1):
            if raw.strip():
                yield n, raw


@dataclass
class FileCheck:
    """A file's problems (each names its line; none: the file is good) and, for a good
    file, the model (or LoRA adapter) its lines name."""

    errors: list[dict[str, Any]] = field(default_factory=list)
    model: Target | None = None


def check_envelopes(
    files: FileStore, file: dict[str, str], endpoint: str, max_lines: int, models: ModelCatalog,
    client: redis.Redis | None = None,
) -> FileCheck:  # fmt: skip
    """File-level problems, each naming its line, and the batch's model (one per file;
    `client`: where adapters loaded at run time are looked up, None: declared ones only)."""
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    one = OneModel(models, client)
    count = 0

    def err(n: int, code: str, message: str, param: str | None = None) -> None:
        errors.append({"code": code, "line": n, "message": f"line {n}: {message}", "param": param})

    for n, raw in _lines(files, file):
        count += 1
        if count > max_lines:
            err(n, "too_many_requests", f"the file has more than {max_lines} requests")
            break
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            err(n, "invalid_json", "not a JSON object (the file must be JSONL)")
        else:
            if not isinstance(obj, dict):
                err(n, "invalid_json", "not a JSON object (the file must be JSONL)")
            elif not isinstance(obj.get("custom_id"), str) or not obj["custom_id"]:
                err(n, "missing_custom_id", "custom_id must be a non-empty string")
            elif obj["custom_id"] in seen:
                err(n, "duplicate_custom_id", f"custom_id {obj['custom_id']!r} is used twice")
            elif obj.get("method") != "POST":
                err(n, "invalid_method", f"method must be POST, got {obj.get('method')!r}")
            elif obj.get("url") != endpoint:
                err(
                    n,
                    "mismatched_url",
                    f"url {obj.get('url')!r} is not the batch's endpoint {endpoint}",
                )
            elif not isinstance(obj.get("body"), dict):
                err(n, "missing_body", "body must be a JSON object")
            else:
                seen.add(obj["custom_id"])
                problem = one.check(n, obj["body"].get("model"))
                if problem is not None:
                    err(n, *problem, param="body.model")
        if len(errors) >= MAX_FILE_ERRORS:
            break
    if count == 0 and not errors:
        errors.append(
            {
                "code": "empty_file",
                "line": None,
                "message": "the file has no requests",
                "param": None,
            }
        )
    return FileCheck(errors, None if errors else one.model)


def plan_line(
    endpoint: str, body: dict[str, Any], info: ModelInfo, served: str | ModelCatalog | Target
) -> PlannedJob:
    """A line's body, validated as the endpoint validates it, as one job (`served`: the
    models its ``model`` may name). A completions line with several prompts is refused: the
    batch keeps one job per line."""
    request = ENDPOINTS[endpoint].model_validate(body)
    if isinstance(request, ChatCompletionCreate):
        return chat_job(request, served, info, Priority.BATCH)
    if len(request.prompts()) > 1:
        raise bad_request(
            "prompt", f"a batch line takes one prompt, got {len(request.prompts())}: send one "
            "line per prompt", "unsupported_value",
        )  # fmt: skip
    return completion_jobs(request, served, info, Priority.BATCH)[0]


def line_refusal(e: ValidationError | SubmissionError) -> tuple[int, str, str | None]:
    """A refused body's HTTP status, one-line message and field (`param`, as
    ``body.<field>``): a validation error reports its first problem, as the endpoint does."""
    if isinstance(e, SubmissionError):
        return e.status, e.message, f"body.{e.param}" if e.param else None
    first = e.errors()[0]
    param = ".".join(["body", *(str(p) for p in first.get("loc", ()))])
    return 400, f"{param}: {first.get('msg')}", param


def _cancel_unstarted(batch_id: str) -> str:
    """A batch cancelled before any of its lines was written ends cancelled at once."""
    handles().batches.transition(
        batch_id, ["cancelling"], status="cancelled", cancelled_at=time.time()
    )
    return "cancelled"


def _cancelling(batch_id: str) -> bool:
    status = handles().client.hget(Keys.batch(batch_id), "status")
    return status == b"cancelling"


def fan_out(batch: dict[str, str], file: dict[str, str], target: Target) -> int:
    """One job per line at batch priority for the batch's model `target` (its served
    model's tokenizer and queues; a LoRA adapter named in each job), written in pipelines of
    FANOUT_CHUNK lines; returns the count of lines written. A cancel stops it between
    pipelines: the lines after those written get no job."""
    h = handles()
    settings, client, jobs = h.settings, h.client, h.jobs
    served = target.served
    info = _model(served.path)
    batch_id, tenant, endpoint = batch["id"], batch["tenant"], batch["endpoint"]
    lines_key = Keys.batch_lines(batch_id)
    pending: list[tuple[int, Any]] = []
    refused: dict[str, str] = {}

    def flush() -> None:
        pipe = client.pipeline(transaction=False)
        for _, job in pending:
            keys, args = job.script_call()
            jobs.create_script(keys=keys, args=args, client=pipe)
        results = pipe.execute()
        mapping = {
            str(i): job.result(raw)["id"] for (i, job), raw in zip(pending, results, strict=True)
        }
        mapping |= refused
        if mapping:
            client.hset(lines_key, mapping=mapping)
        pending.clear()
        refused.clear()

    window_end = float(batch["expires_at"]) if batch.get("expires_at") else None
    index = -1
    for index, (_n, raw) in enumerate(_lines(h.files, file)):
        obj = json.loads(raw)
        custom_id = obj["custom_id"]
        try:
            plan = plan_line(endpoint, obj["body"], info, target)
            job = build_job(
                settings, info, tenant, plan.body,
                idempotency_key=f"batch:{batch_id}:{index}", priority=Priority.BATCH,
                extra_fields={"batch_id": batch_id, "batch_line": index, "custom_id": custom_id,
                              **plan.fields},
                tools=plan.tools, served=served, deadline=window_end, lora=target.adapter,
            )  # fmt: skip
            job.max_active = job.max_queue_length = job.max_rate = NO_LIMIT
            pending.append((index, job))
        except (ValidationError, SubmissionError) as e:
            status, message, param = line_refusal(e)
            refused[str(index)] = refusal(status, message, custom_id, param)
        if len(pending) + len(refused) >= FANOUT_CHUNK:
            flush()
            if _cancelling(batch_id):
                return index + 1
    flush()
    return index + 1


@celery_app.task(name="tide.batch.validate")
def validate_batch(batch_id: str) -> str:
    h = handles()
    batches = h.batches
    batch = batches.get(batch_id)
    if batch is not None and batch["status"] == "cancelling" and not batch.get("total"):
        return _cancel_unstarted(batch_id)
    if batch is None or batch["status"] != "validating":
        return "skipped"
    file = h.files.get(batch["input_file_id"])
    if file is None:
        check = FileCheck([
            {"code": "missing_file", "line": None, "message": "input file not found", "param": None}
        ])  # fmt: skip
    else:
        check = check_envelopes(
            h.files, file, batch["endpoint"], h.settings.file_max_lines, catalog(h.settings),
            h.client,
        )  # fmt: skip
    if check.errors or check.model is None:
        batches.transition(
            batch_id, ["validating"], status="failed", failed_at=time.time(), errors=check.errors
        )
        return "failed"
    assert file is not None
    if _cancelling(batch_id):  # cancelled while the file was checked: nothing written yet
        return _cancel_unstarted(batch_id)
    total = fan_out(batch, file, check.model)
    entries = h.client.hvals(Keys.batch_lines(batch_id))
    refused = sum(1 for v in entries if v.startswith(REFUSED.encode()))
    h.client.sadd(Keys.active_batches, batch_id)
    counts = {"total": total, "refused": refused, "model": check.model.name}
    if batches.transition(
        batch_id, ["validating"], status="in_progress", in_progress_at=time.time(), **counts
    ):
        return "in_progress"
    # Cancelled while validating: the lines written so far are the batch (the supervisor
    # cancels their queued jobs and finalizes it as cancelled); the rest got no job.
    if batches.transition(batch_id, ["cancelling"], status="cancelling", **counts):
        return "cancelling"
    return "skipped"
