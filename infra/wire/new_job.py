"""A job to create: the create script's keys and arguments, and what its answer means.

Built by the gateway and written by ``JobStore.create`` in one script call
(``tide_fleet.infra.wire.job_scripts``), so an accepted job is never half-written.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from tide_fleet.infra.wire.codec import encode_value
from tide_fleet.infra.wire.protocol import Keys


@dataclass
class NewJob:
    """Everything the create script needs; built by the gateway, written in one call."""

    fields: dict[str, Any]
    queue: str
    message: str
    idempotency_key: str | None
    max_active: int
    max_queue_length: int
    max_rate: int
    ttl_seconds: int

    def script_call(self) -> tuple[list[str], list[Any]]:
        job_id, tenant = self.fields["id"], self.fields["tenant"]
        flat: list[Any] = []
        for k, v in {**self.fields, "queue": self.queue, "message": self.message}.items():
            flat += [k, encode_value(v)]
        keys = [
            Keys.job(job_id),
            Keys.idempotency(tenant, self.idempotency_key or "-"),
            Keys.tenant_active(tenant),
            self.queue,
            Keys.tenant_rate(tenant, int(time.time())),
            Keys.wakeup,
            Keys.tenant_jobs(tenant),
        ]
        args = [
            self.idempotency_key or "", job_id, self.max_rate, self.ttl_seconds,
            self.max_active, self.max_queue_length, self.message, *flat,
        ]  # fmt: skip
        return keys, args

    def result(self, raw: list[Any]) -> dict[str, str]:
        """{id, status, bucket, created_at} of the new (or idempotently found) job, and a new
        job's deadline, ttl and expire_at where it has them."""
        out = [v.decode() if isinstance(v, bytes) else v for v in raw]
        if out[0] in ("rate", "tenant_full", "queue_full"):
            raise LimitExceeded(out[0])
        if out[0] == "exists":
            return {"id": out[1], "status": out[2], "bucket": out[3], "created_at": out[4]}
        f = self.fields
        return {
            "id": f["id"],
            "status": f["status"],
            "bucket": f["bucket"],
            "created_at": repr(f["created_at"]),
            **{k: repr(f[k]) for k in ("deadline", "ttl", "expire_at") if k in f},
        }


class LimitExceeded(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def new_job_id() -> str:
    return "job_" + uuid.uuid4().hex
