"""Drive a WorkerService turn by turn against a real Redis (no thread): submit jobs with the
sampling fields a test wants (``n``, ``logprobs``, ...) and run until they end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import redis

from tests.conftest import make_engine
from tide_fleet.infra.jobs.schemas import JobCreate
from tide_fleet.infra.jobs.submission import ModelInfo, build_job
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.protocol import Keys
from tide_fleet.worker.service import WorkerService

DUMMY_SPECIALS = 4  # dummy models: <pad> <s> </s> <unk>, then one token per byte
# Bans the specials and every non-ASCII byte of a dummy model: its text is then ASCII.
ASCII_ONLY = {str(t): -100 for t in [*range(DUMMY_SPECIALS), *range(4 + 128, 4 + 256)]}


def settings(url: str, model: Path) -> Settings:
    return Settings(redis_url=url, model=str(model), worker_metrics_port=-1)


def service(url: str, model: Path, **engine_config: Any) -> WorkerService:
    worker = WorkerService(
        make_engine(model, **engine_config), settings(url, model), "p", ["short"]
    )
    worker._come_back()  # connected (the run loop does this first)
    return worker


def submit(
    client: redis.Redis,
    model: Path,
    prompt: str = "once upon a time",
    priority: str = "interactive",
    **sampling: Any,
) -> str:
    """A job whose record's sampling is exactly `sampling` (max_tokens defaults to 8)."""
    sampling.setdefault("max_tokens", 8)
    body = JobCreate(prompt=prompt, max_tokens=sampling["max_tokens"], priority=priority)
    job = build_job(settings("redis://unused", model), ModelInfo.load(str(model)), "t", body, None)
    job.fields["sampling"] = sampling
    return JobStore(client).create(job)["id"]


def run(worker: WorkerService, client: redis.Redis, job_id: str, turns: int = 2000) -> dict:
    """Turn the loop until the job has a terminal status and the worker let go of it (its
    final write is settled a turn or more after it lands: ``worker.writer``); its record."""
    store = JobStore(client)
    for _ in range(turns):
        worker._iterate()
        record = store.get(job_id) or {}
        if record.get("status") not in ("queued", "in_progress") and job_id not in worker.held:
            return record
    raise AssertionError(f"{job_id} did not end: {store.get(job_id)}")


def choices(record: dict[str, str]) -> list[dict[str, Any]]:
    return list(json.loads(record["choices"]))


def events(client: redis.Redis, job_id: str) -> list[dict[str, str]]:
    return [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _, fields in client.xrange(Keys.events(job_id))
    ]
