"""A batch world on the test Redis: the tasks' handles, a local file store, file helpers."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tide_fleet.infra.batches import finalize, supervise, validate
from tide_fleet.infra.batches.store import BatchStore, Handles, new_batch_id
from tide_fleet.infra.jobs.files import FileStore
from tide_fleet.infra.jobs.storage import LocalStorage
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.protocol import JobStatus, Keys


def line(custom_id: str, body: dict[str, Any], url: str = "/v1/completions") -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


@dataclass
class BatchWorld:
    h: Handles

    def upload(self, text: str, tenant: str = "t") -> dict[str, Any]:
        return self.h.files.create(tenant, "in.jsonl", "batch", [text.encode()])

    def new_batch(self, text: str, tenant: str = "t", **fields: Any) -> str:
        file = self.upload(text, tenant)
        now = time.time()
        record = {
            "id": new_batch_id(), "tenant": tenant, "endpoint": "/v1/completions",
            "input_file_id": file["id"], "completion_window": "24h", "status": "validating",
            "created_at": now, "expires_at": now + 86400, "metadata": None, "webhook_url": "",
            "total": "", "completed": 0, "failed": 0, "validate_sent_at": now,
        } | fields  # fmt: skip
        self.h.batches.create(record)
        self.h.client.sadd(Keys.active_batches, record["id"])
        return record["id"]

    def job_ids(self, batch_id: str) -> list[str]:
        lines = self.h.batches.lines(batch_id)
        return [lines[i] for i in sorted(lines) if not lines[i].startswith("error:")]

    def finish(self, job_id: str, status: JobStatus = JobStatus.COMPLETED, **fields: Any) -> None:
        state, token, record = self.h.jobs.acquire(job_id, "w1", lease_seconds=30)
        assert state == "acquired"
        done = {"text": f"out-{job_id}", "finish_reason": "length", "completion_tokens": 2}
        if status is not JobStatus.COMPLETED:
            done = {"error": "it broke"}
        assert self.h.jobs.finish(job_id, token, record["tenant"], status, **(done | fields))


@pytest.fixture
def make_world(redis_client, tmp_path, monkeypatch) -> Callable[[Settings], BatchWorld]:
    """A batch world whose tasks see `settings` (say, a fleet serving several models)."""

    def make(settings: Settings) -> BatchWorld:
        h = Handles(
            settings, redis_client, BatchStore(redis_client),
            FileStore(redis_client, LocalStorage(tmp_path / "files")), JobStore(redis_client),
        )  # fmt: skip
        for module in (validate, supervise, finalize):
            monkeypatch.setattr(module, "handles", lambda: h)
        return BatchWorld(h)

    return make


@pytest.fixture
def world(make_world, tiny_path) -> BatchWorld:
    return make_world(Settings(model=str(tiny_path), batch_retry_seconds=60.0))
