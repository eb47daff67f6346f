"""Batch processing (OpenAI Batch format): validate, fan out, follow, finalize.

Celery tasks on the Redis broker do the heavy steps (``validate`` and ``finalize``);
a supervisor loop (run by the reaper, later the controller) follows active batches,
updates their counts, applies cancel and expiry, and starts finalization when every
job is terminal. Every step is idempotent: fan-out uses a per-line idempotency key,
so a task that runs twice (a Celery restart, acks_late) never duplicates a line.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import redis
from pydantic import ValidationError

from infra.jobs.celery_app import celery_app
from infra.jobs.files import FileStore
from infra.jobs.openai_format import chat_body, completion_body
from infra.jobs.schemas import ChatCompletionCreate, CompletionCreate, JobCreate
from infra.jobs.storage import make_storage
from infra.jobs.submission import ModelInfo, SubmissionError, build_job
from infra.settings import Settings, get_settings
from infra.wire.jobstore import JobStore
from infra.wire.protocol import JobStatus, Keys, Priority

log = logging.getLogger(__name__)

ENDPOINTS: dict[str, type[CompletionCreate] | type[ChatCompletionCreate]] = {
    "/v1/completions": CompletionCreate,
    "/v1/chat/completions": ChatCompletionCreate,
}
NO_LIMIT = 2**62  # batch jobs are bounded by the file limits, not the per-request ones
FANOUT_CHUNK = 500
MAX_FILE_ERRORS = 20
UNLIMITED_WINDOW = re.compile(r"^(\d+)([smh])$")


def parse_window(window: str) -> int:
    """'24h' (OpenAI's only value), or any N s|m|h; seconds."""
    m = UNLIMITED_WINDOW.match(window)
    if not m or int(m.group(1)) < 1:
        raise ValueError(f"completion_window: expected a duration like '24h', got {window!r}")
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


def new_batch_id() -> str:
    return "batch_" + uuid.uuid4().hex


# -- records -------------------------------------------------------------------------

_TRANSITION = """
local st = redis.call('HGET', KEYS[1], 'status')
for i = 2, 1 + tonumber(ARGV[1]) do
  if st == ARGV[i] then
    redis.call('HSET', KEYS[1], unpack(ARGV, 2 + tonumber(ARGV[1])))
    return 1
  end
end
return 0
"""


class BatchStore:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._transition = client.register_script(_TRANSITION)

    def create(self, record: dict[str, Any]) -> None:
        pipe = self.r.pipeline()
        pipe.hset(Keys.batch(record["id"]), mapping={k: _enc(v) for k, v in record.items()})
        pipe.zadd(Keys.tenant_batches(record["tenant"]), {record["id"]: record["created_at"]})
        pipe.execute()

    def get(self, batch_id: str, tenant: str | None = None) -> dict[str, str] | None:
        raw = self.r.hgetall(Keys.batch(batch_id))
        record = {k.decode(): v.decode() for k, v in raw.items()}
        if not record or (tenant is not None and record.get("tenant") != tenant):
            return None
        return record

    def list(self, tenant: str, after: str | None, limit: int) -> tuple[list[dict[str, str]], bool]:
        """Newest first; ``after`` is the last id of the previous page."""
        key = Keys.tenant_batches(tenant)
        start = 0
        if after:
            rank = self.r.zrevrank(key, after)
            start = 0 if rank is None else rank + 1
        ids = self.r.zrevrange(key, start, start + limit)
        records = [b for b in (self.get(i.decode(), tenant) for i in ids[:limit]) if b]
        return records, len(ids) > limit

    def transition(self, batch_id: str, from_: list[str], **fields: Any) -> bool:
        """Set fields (status among them) only if the status is one of from_."""
        flat: list[Any] = []
        for k, v in fields.items():
            flat += [k, _enc(v)]
        return bool(self._transition(keys=[Keys.batch(batch_id)], args=[len(from_), *from_, *flat]))

    def update(self, batch_id: str, **fields: Any) -> None:
        self.r.hset(Keys.batch(batch_id), mapping={k: _enc(v) for k, v in fields.items()})


def _enc(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, int | float):
        return str(v)
    return json.dumps(v)


def _int(record: dict[str, str], key: str) -> int | None:
    return int(float(record[key])) if record.get(key) else None


def public_batch(record: dict[str, str]) -> dict[str, Any]:
    """The OpenAI Batch object."""
    errors = json.loads(record["errors"]) if record.get("errors") else None
    return {
        "id": record["id"],
        "object": "batch",
        "endpoint": record["endpoint"],
        "errors": {"object": "list", "data": errors} if errors else None,
        "input_file_id": record["input_file_id"],
        "completion_window": record["completion_window"],
        "status": record["status"],
        "output_file_id": record.get("output_file_id") or None,
        "error_file_id": record.get("error_file_id") or None,
        "created_at": _int(record, "created_at"),
        "in_progress_at": _int(record, "in_progress_at"),
        "expires_at": _int(record, "expires_at"),
        "finalizing_at": _int(record, "finalizing_at"),
        "completed_at": _int(record, "completed_at"),
        "failed_at": _int(record, "failed_at"),
        "expired_at": _int(record, "expired_at"),
        "cancelling_at": _int(record, "cancelling_at"),
        "cancelled_at": _int(record, "cancelled_at"),
        "request_counts": {
            "total": int(record.get("total") or 0),
            "completed": int(record.get("completed") or 0),
            "failed": int(record.get("failed") or 0),
        },
        "metadata": json.loads(record["metadata"]) if record.get("metadata") else None,
    }


# -- process-wide handles for the tasks --------------------------------------------------


@functools.cache
def _handles() -> tuple[Settings, redis.Redis, BatchStore, FileStore, JobStore]:
    settings = get_settings()
    client = redis.Redis.from_url(settings.redis_url or "")
    return (
        settings,
        client,
        BatchStore(client),
        FileStore(client, make_storage(settings)),
        JobStore(client),
    )


@functools.cache
def _model(name: str) -> ModelInfo:
    return ModelInfo.load(name)


# -- validation and fan-out -------------------------------------------------------------


def _lines(files: FileStore, file: dict[str, str]) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, bytes) of non-blank lines, streamed."""
    with files.storage.open(file["storage_key"]) as f:
        for n, raw in enumerate(f, 1):
            if raw.strip():
                yield n, raw


def check_envelopes(
    files: FileStore, file: dict[str, str], endpoint: str, max_lines: int
) -> list[dict[str, Any]]:
    """File-level problems (each names its line); an empty list means the file is good."""
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    count = 0

    def err(n: int, code: str, message: str) -> None:
        errors.append({"code": code, "line": n, "message": f"line {n}: {message}", "param": None})

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
    return errors


def _job_body(endpoint: str, body: dict[str, Any]) -> JobCreate:
    request = ENDPOINTS[endpoint].model_validate(body)
    if isinstance(request, ChatCompletionCreate):
        return JobCreate(**request.sampling(), messages=request.messages, priority=Priority.BATCH)
    return JobCreate(**request.sampling(), prompt=request.prompt, priority=Priority.BATCH)


def _refusal(status: int, message: str, line: dict[str, Any]) -> str:
    """A refused line's entry in the batch's line table (it has no job record)."""
    return "error:" + json.dumps(
        {"status": status, "message": message, "custom_id": line["custom_id"]}
    )


def fan_out(batch: dict[str, str], file: dict[str, str]) -> int:
    """One job per line at batch priority, written in pipelines; returns the request count."""
    settings, client, _, files, jobs = _handles()
    info = _model(settings.model)
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

    index = -1
    for index, (_n, raw) in enumerate(_lines(files, file)):
        obj = json.loads(raw)
        try:
            job = build_job(
                settings, info, tenant, _job_body(endpoint, obj["body"]),
                idempotency_key=f"batch:{batch_id}:{index}", priority=Priority.BATCH,
                extra_fields={
                    "batch_id": batch_id, "batch_line": index, "custom_id": obj["custom_id"],
                },
            )  # fmt: skip
            job.max_active = job.max_queue_length = job.max_rate = NO_LIMIT
            pending.append((index, job))
        except ValidationError as e:
            first = e.errors()[0]
            field = ".".join(str(p) for p in first.get("loc", ()))
            refused[str(index)] = _refusal(400, f"body.{field}: {first.get('msg')}", obj)
        except SubmissionError as e:
            refused[str(index)] = _refusal(e.status, e.message, obj)
        if len(pending) >= FANOUT_CHUNK:
            flush()
    flush()
    return index + 1


@celery_app.task(name="tide.batch.validate")
def validate_batch(batch_id: str) -> str:
    settings, client, batches, files, _ = _handles()
    batch = batches.get(batch_id)
    if batch is not None and batch["status"] == "cancelling" and not batch.get("total"):
        batches.transition(batch_id, ["cancelling"], status="cancelled", cancelled_at=time.time())
        return "cancelled"
    if batch is None or batch["status"] != "validating":
        return "skipped"
    file = files.get(batch["input_file_id"])
    if file is None:
        errors = [
            {"code": "missing_file", "line": None, "message": "input file not found", "param": None}
        ]
    else:
        errors = check_envelopes(files, file, batch["endpoint"], settings.file_max_lines)
    if errors:
        batches.transition(
            batch_id, ["validating"], status="failed", failed_at=time.time(), errors=errors
        )
        return "failed"
    total = fan_out(batch, file)  # type: ignore[arg-type]
    refused = sum(1 for v in client.hvals(Keys.batch_lines(batch_id)) if v.startswith(b"error:"))
    client.sadd(Keys.active_batches, batch_id)
    batches.transition(
        batch_id, ["validating"], status="in_progress", in_progress_at=time.time(), total=total,
        refused=refused,
    )  # fmt: skip
    return "in_progress"


# -- following and finalizing -----------------------------------------------------------------


def _line_states(client: redis.Redis, batch_id: str, total: int) -> list[str]:
    """Per line, in input order: a job status, or 'error' for a line refused at fan-out."""
    lines = {int(k): v.decode() for k, v in client.hgetall(Keys.batch_lines(batch_id)).items()}
    ids = [lines.get(i, "error:") for i in range(total)]
    pipe = client.pipeline(transaction=False)
    for v in ids:
        if not v.startswith("error:"):
            pipe.hget(Keys.job(v), "status")
    statuses = iter(pipe.execute())
    out = []
    for v in ids:
        if v.startswith("error:"):
            out.append("error")
        else:
            st = next(statuses)
            out.append(st.decode() if st else "expired")
    return out


def _cancel_queued(client: redis.Redis, jobs: JobStore, batch_id: str, tenant: str) -> None:
    """Cancel the batch's jobs that have not started; running ones finish."""
    for raw in client.hvals(Keys.batch_lines(batch_id)):
        job_id = raw.decode()
        if not job_id.startswith("error:") and client.hget(Keys.job(job_id), "status") == b"queued":
            jobs.cancel(job_id, tenant)


FULL_PASS_SECONDS = 30.0  # read every line's status at least this often (counters' check)
_last_full_pass: dict[str, float] = {}


def supervise_batches(now: float | None = None) -> None:
    """One pass over active batches: counts, cancel, expiry, and the start of finalization."""
    settings, client, batches, _, jobs = _handles()
    now = time.time() if now is None else now
    retry = settings.batch_retry_seconds
    for raw in client.smembers(Keys.active_batches):
        batch_id = raw.decode()
        batch = batches.get(batch_id)
        if batch is None:
            client.srem(Keys.active_batches, batch_id)
            _last_full_pass.pop(batch_id, None)
            continue
        status = batch["status"]
        if status in ("validating", "cancelling") and not batch.get("total"):
            # Not fanned out yet. A validate task lost with a killed Celery worker would
            # only come back after the broker's visibility timeout: send it again.
            if now - float(batch.get("validate_sent_at") or now) > retry:
                batches.update(batch_id, validate_sent_at=now)
                validate_batch.delay(batch_id)
            continue
        if status in ("failed", "cancelled"):
            client.srem(Keys.active_batches, batch_id)
            _last_full_pass.pop(batch_id, None)
            continue
        total = int(batch.get("total") or 0)
        counted = int(batch.get("jobs_terminal") or 0) + int(batch.get("refused") or 0)
        if counted < total and now - _last_full_pass.get(batch_id, 0.0) < FULL_PASS_SECONDS:
            # The job scripts count terminal jobs: no need to read every line's status.
            completed, terminal = int(batch.get("jobs_completed") or 0), counted
        else:  # done by the counters, or time to check them against the records
            _last_full_pass[batch_id] = now
            states = _line_states(client, batch_id, total)
            completed = states.count("completed")
            terminal = sum(1 for s in states if s == "error" or JobStatus(s).is_terminal)
        batches.update(batch_id, completed=completed, failed=terminal - completed)
        if terminal == total and status in ("in_progress", "cancelling"):
            moved = batches.transition(
                batch_id, [status], status="finalizing", finalizing_at=now, finalize_sent_at=now
            )
            if moved:
                finalize_batch.delay(batch_id)
        elif status in ("cancelling", "in_progress") and batch.get("stop") != "1":
            expired = status == "in_progress" and now > float(batch["expires_at"])
            if status == "cancelling" or expired:
                final = "cancelled" if status == "cancelling" else "expired"
                batches.update(batch_id, stop="1", final_status=final)
                _cancel_queued(client, jobs, batch_id, batch["tenant"])
        elif status == "finalizing" and now - float(batch.get("finalize_sent_at") or now) > retry:
            batches.update(batch_id, finalize_sent_at=now)
            finalize_batch.delay(batch_id)  # a finalize task was lost: run it again


def _output_lines(batch: dict[str, str], client: redis.Redis, want_errors: bool) -> Iterator[bytes]:
    """The output (or error) file's lines, in input order, streamed in chunks of jobs."""
    settings = _handles()[0]
    batch_id, total = batch["id"], int(batch.get("total") or 0)
    lines = {int(k): v.decode() for k, v in client.hgetall(Keys.batch_lines(batch_id)).items()}
    make_body = chat_body if batch["endpoint"] == "/v1/chat/completions" else completion_body
    lost = _refusal(500, "line lost", {"custom_id": ""})
    for start in range(0, total, FANOUT_CHUNK):
        chunk = [lines.get(i, lost) for i in range(start, min(total, start + FANOUT_CHUNK))]
        job_ids = [v for v in chunk if not v.startswith("error:")]
        pipe = client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hgetall(Keys.job(job_id))
        records = dict(zip(job_ids, pipe.execute(), strict=True))
        out = []
        for i, v in enumerate(chunk, start):
            line: dict[str, Any] = {"id": f"batch_req_{batch_id}_{i}"}
            if v.startswith("error:"):
                refused = json.loads(v.removeprefix("error:"))
                line |= {
                    "custom_id": refused["custom_id"],
                    "response": {
                        "status_code": refused["status"],
                        "request_id": None,
                        "body": None,
                    },
                    "error": {"code": "invalid_request", "message": refused["message"]},
                }
            else:
                job = {k.decode(): x.decode() for k, x in records[v].items()}
                line["custom_id"] = job.get("custom_id", "")
                if job.get("status") == JobStatus.COMPLETED:
                    body = make_body(job, settings.model)
                    line |= {
                        "response": {"status_code": 200, "request_id": job["id"], "body": body},
                        "error": None,
                    }
                else:
                    status = job.get("status") or "expired"
                    message = job.get("error") or f"job {status}"
                    line |= {
                        "response": None,
                        "error": {"code": f"job_{status}", "message": message},
                    }
            if (line["error"] is not None) == want_errors:
                out.append(json.dumps(line, ensure_ascii=False).encode() + b"\n")
        if out:
            yield b"".join(out)


@celery_app.task(name="tide.batch.finalize")
def finalize_batch(batch_id: str) -> str:
    _, client, batches, files, _ = _handles()
    batch = batches.get(batch_id)
    if batch is None or batch["status"] != "finalizing":
        return "skipped"
    tenant = batch["tenant"]
    output = files.create(
        tenant, f"{batch_id}_output.jsonl", "batch_output",
        _output_lines(batch, client, want_errors=False), file_id=f"file-{batch_id}-output",
    )  # fmt: skip
    fields: dict[str, Any] = {"output_file_id": output["id"]}
    if int(batch.get("failed") or 0) or batch.get("final_status"):
        errors = files.create(
            tenant, f"{batch_id}_errors.jsonl", "batch_output",
            _output_lines(batch, client, want_errors=True), file_id=f"file-{batch_id}-errors",
        )  # fmt: skip
        if int(errors["bytes"]):
            fields["error_file_id"] = errors["id"]
    final = batch.get("final_status") or "completed"
    now = time.time()
    fields |= {"status": final, f"{final}_at": now}
    if final != "completed":
        fields["completed_at"] = ""
    won = batches.transition(batch_id, ["finalizing"], **fields)
    client.srem(Keys.active_batches, batch_id)
    if won and batch.get("webhook_url"):
        from infra.jobs.webhooks import enqueue_webhook

        enqueue_webhook(batch_id, final, kind="batch")
    return final
