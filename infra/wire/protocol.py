"""The one definition of the wire: job schema, statuses, buckets, queues, Redis keys.

Torch-free: the gateway, workers, reaper and Celery tasks all import this.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

MESSAGE_VERSION = 1


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def is_terminal(self) -> bool:
        return self not in (JobStatus.QUEUED, JobStatus.IN_PROGRESS)


class Priority(enum.StrEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


BUCKETS = ("short", "medium", "long")


def bucket_for(total_tokens: int, short_max: int, medium_max: int) -> str:
    """The bucket of a job by prompt_tokens + max_tokens."""
    if total_tokens <= short_max:
        return "short"
    if total_tokens <= medium_max:
        return "medium"
    return "long"


# A lane is a served model's name in its queue and backlog names: '' for the fleet's
# default model (the names a one-model fleet always had), its served name for the others
# (infra/wire/models.py). Names parse from the right, so a lane may hold dots.
LANE_MAX_CHARS = 128


def check_lane(lane: str) -> str:
    if not lane or len(lane) > LANE_MAX_CHARS or any(c.isspace() for c in lane):
        raise ValueError(f"model name {lane!r}: 1 to {LANE_MAX_CHARS} characters, no spaces")
    return lane


def queue_name(bucket: str, priority: Priority | str, lane: str = "") -> str:
    """tide.<bucket>.<priority> for the default model, tide.<lane>.<bucket>.<priority> else."""
    middle = f"{lane}.{bucket}" if lane else bucket
    return f"tide.{middle}.{Priority(priority).value}"


def parse_queue(name: str) -> tuple[str, str, str] | None:
    """(lane, bucket, priority) of a job queue's name; None for any other queue (Celery's)."""
    if not name.startswith("tide."):
        return None
    parts = name[len("tide.") :].rsplit(".", 2)
    lane = parts[0] if len(parts) == 3 else ""
    bucket, priority = parts[-2:] if len(parts) >= 2 else ("", "")
    if bucket not in BUCKETS or priority not in {p.value for p in Priority}:
        return None
    return lane, bucket, priority


def consume_order(buckets: list[str], lane: str = "") -> list[str]:
    """Queues a worker polls: its buckets in preference order, interactive before batch."""
    return [queue_name(b, p, lane) for p in Priority for b in buckets]


def backlog_field(bucket: str, lane: str = "") -> str:
    """A (model, bucket)'s name in the backlog keys: the bucket, or <lane>:<bucket>."""
    return f"{lane}:{bucket}" if lane else bucket


class Keys:
    """The Redis key schema, in one place."""

    webhooks_due = "tide:webhooks:due"  # zset webhook-id -> next due time (unix seconds)
    # Counter: tokens the fleet's engines generated and wrote, every attempt included
    # (against the jobs' completion tokens: the work a lost worker cost).
    generated_tokens = "tide:generated_tokens"
    # Counter: tokens a resumed attempt took over from earlier ones instead of generating
    # them again (what restarting from the prompt would have cost on top).
    resumed_tokens = "tide:resumed_tokens"

    @staticmethod
    def webhook(msg_id: str) -> str:
        """Hash: kind, obj_id, ticket (the dispatch count; the current holder's proof)."""
        return f"tide:webhook:{msg_id}"

    @staticmethod
    def webhooks_disabled(tenant: str) -> str:
        """Hash: webhook url -> why and when it was disabled."""
        return f"tide:tenant:{tenant}:webhooks_disabled"

    @staticmethod
    def job(job_id: str) -> str:
        return f"tide:job:{job_id}"

    @staticmethod
    def events(job_id: str) -> str:
        """Stream: delta events {type, text, n, i, t (token ids), lp}, then one done."""
        return f"tide:events:{job_id}"

    @staticmethod
    def idempotency(tenant: str, key: str) -> str:
        return f"tide:idem:{tenant}:{key}"

    @staticmethod
    def tenant_active(tenant: str) -> str:
        """Jobs of the tenant not yet terminal (queued or running)."""
        return f"tide:tenant:{tenant}:active"

    @staticmethod
    def tenant_jobs(tenant: str) -> str:
        """Zset job_id -> created_at: the tenant's most recent API jobs (batch lines are
        not listed), capped and expiring in the create script (infra/wire/job_scripts.py)."""
        return f"tide:tenant:{tenant}:jobs"

    @staticmethod
    def tenant_rate(tenant: str, second: int) -> str:
        return f"tide:tenant:{tenant}:rate:{second}"

    @staticmethod
    def worker(worker_id: str) -> str:
        return f"tide:worker:{worker_id}"

    @staticmethod
    def drain(worker_id: str) -> str:
        """Set by the controller: the worker stops taking jobs, finishes, exits."""
        return f"tide:drain:{worker_id}"

    @staticmethod
    def file(file_id: str) -> str:
        return f"tide:file:{file_id}"

    @staticmethod
    def tenant_files(tenant: str) -> str:
        return f"tide:tenant:{tenant}:files"  # zset file_id -> created_at

    @staticmethod
    def batch(batch_id: str) -> str:
        return f"tide:batch:{batch_id}"

    @staticmethod
    def batch_lines(batch_id: str) -> str:
        """Hash: input line number -> job id, or 'error:<message>' for a refused line."""
        return f"tide:batch:{batch_id}:lines"

    @staticmethod
    def tenant_batches(tenant: str) -> str:
        return f"tide:tenant:{tenant}:batches"  # zset batch_id -> created_at

    @staticmethod
    def backlog(field: str) -> str:
        """Zset of queued job ids (score: created_at) of one `backlog_field` (a bucket of
        the default model, or <lane>:<bucket>); see infra/wire/backlog.py."""
        return f"tide:backlog:{field}"

    @staticmethod
    def deadline_backlog(field: str) -> str:
        """Zset of one `backlog_field`'s queued jobs that have a deadline: member
        '<job id>:<prompt + n x max tokens>', score the deadline; read by
        infra/wire/backlog.py `deadline_backlog`."""
        return f"tide:deadline_backlog:{field}"

    @staticmethod
    def deadline_queue(queue: str) -> str:
        """Zset beside a job queue (a kombu list) holding the messages of its jobs that have
        a deadline, scored by it: taken before the list, earliest first."""
        return f"{queue}:deadlines"

    # A job queue's tenant-fair parts (infra/wire/fair_scripts.py; its Lua builds the same
    # names): one list per tenant, the waiting tenants scored by weighted tokens taken, the
    # counter each waiting tenant joined at, and a count of the messages in those lists.
    @staticmethod
    def tenant_queue(queue: str, tenant: str) -> str:
        return f"{queue}:t:{tenant}"

    @staticmethod
    def queue_tenants(queue: str) -> str:
        return f"{queue}:tenants"

    @staticmethod
    def queue_joined(queue: str) -> str:
        return f"{queue}:joined"

    @staticmethod
    def queue_waiting(queue: str) -> str:
        return f"{queue}:waiting"

    # Zset job_id -> when a queued job expires (its deadline, or created_at + ttl).
    expiries = "tide:expiries"
    # Hashes keyed by backlog_field: prompt + max tokens of queued jobs; tokens and jobs
    # ever enqueued, jobs expired unstarted (counters).
    expired_jobs = "tide:expired_jobs"
    backlog_tokens = "tide:backlog_tokens"
    # Hash: LoRA adapter name -> its queued jobs (kept by the job scripts with the backlog).
    adapter_backlog = "tide:adapter_backlog"
    arrived_tokens = "tide:arrived_tokens"
    arrived_jobs = "tide:arrived_jobs"
    controller = "tide:controller"  # hash: the controller's metrics_url, last decision time
    controller_pools = "tide:controller:pools"  # hash pool -> its last decision (fleet_status.py)
    controller_decisions = "tide:controller:decisions"  # list: recent changes, newest first
    controller_history = "tide:controller:history"  # list: one sample per poll, newest first
    active_batches = "tide:batches:active"  # set of batches the supervisor follows
    leases = "tide:leases"  # zset job_id -> lease expiry (unix seconds)
    workers = "tide:workers"  # zset worker_id -> last heartbeat
    wakeup = "tide:wakeup"  # pub/sub: each new job's queue name, so idle workers wake at once


@dataclass
class JobMessage:
    """What a queue carries: the job id and what admission needs. The record is the truth."""

    job_id: str
    bucket: str
    priority: str
    prompt_tokens: int
    max_tokens: int  # every choice together: n × the per-choice max_tokens
    v: int = MESSAGE_VERSION

    def dumps(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def loads(cls, raw: str | bytes | dict[str, Any]) -> JobMessage:
        data = raw if isinstance(raw, dict) else json.loads(raw)
        if data.get("v") != MESSAGE_VERSION:
            raise ValueError(f"unsupported message version {data.get('v')!r}")
        return cls(**data)
