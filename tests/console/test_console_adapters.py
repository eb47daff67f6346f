"""The console's fleet view on a fleet serving LoRA adapters: a row per adapter (its queued
jobs, the workers holding it, the tokens generated on it) and each worker's adapters."""

from __future__ import annotations

import time

import pytest

from tests.console.test_console_api import OP, make
from tide_fleet.gateway.console.worker_stats import parse_metrics
from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.adapters import ADAPTERS_KEY, AdapterRef
from tide_fleet.infra.wire.heartbeats import Heartbeat
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.new_job import NewJob
from tide_fleet.infra.wire.protocol import JobMessage, Keys, queue_name


@pytest.fixture
def lora_fleet(redis_server, redis_client, tiny_path):
    models = [{"name": "base", "model": str(tiny_path), "lora": {"decl": "/adapters/decl"}}]
    with make(redis_server, str(tiny_path), served_models=models) as c:
        yield c


def _queue_job(redis_client, job_id: str, lora: str) -> None:
    q = queue_name("short", "interactive")
    fields = {"id": job_id, "tenant": "tenant-a", "status": "queued", "bucket": "short",
              "priority": "interactive", "created_at": time.time(), "prompt_tokens": 3,
              "max_tokens": 4, "lora": lora}  # fmt: skip
    message = queues.encode(JobMessage(job_id, "short", "interactive", 3, 4), q)
    JobStore(redis_client).create(NewJob(fields, q, message, None, 100, 100, 100, 3600))


def _beat(redis_client, worker_id: str, adapters=(), on_device=()) -> None:
    now = time.time()
    hb = Heartbeat(worker_id=worker_id, pool="p", model="base", buckets=("short",), at=now,
                   adapters=tuple(adapters), adapters_on_device=tuple(on_device))  # fmt: skip
    redis_client.hset(Keys.worker(worker_id), mapping=hb.to_hash())
    redis_client.zadd(Keys.workers, {worker_id: now})


def test_the_fleet_view_has_a_row_per_adapter_and_each_workers_adapters(lora_fleet, redis_client):
    redis_client.hset(ADAPTERS_KEY, "live", AdapterRef("live", "base", "/adapters/live").to_json())
    for i in range(2):
        _queue_job(redis_client, f"d{i}", "decl")
    _queue_job(redis_client, "gone0", "gone")  # an adapter unloaded while its job waits
    _beat(redis_client, "w-1", adapters=("decl", "live"), on_device=("decl",))
    _beat(redis_client, "w-2", adapters=("decl",))
    _beat(redis_client, "w-3")
    got = lora_fleet.get("/console/api/fleet", headers=OP).json()
    rows = {r["adapter"]: r for r in got["adapters"]}
    assert [r["adapter"] for r in got["adapters"]] == ["decl", "live", "gone"]
    assert rows["decl"] == {"adapter": "decl", "model": "base", "queued": 2, "workers": 2,
                            "on_device": 1, "generated_tokens": 0.0}  # fmt: skip
    assert (rows["live"]["queued"], rows["live"]["workers"]) == (0, 1)
    assert (rows["gone"]["model"], rows["gone"]["queued"]) == (None, 1)
    workers = {w["worker_id"]: w for w in got["workers"]}
    assert workers["w-1"]["adapters"] == ["decl", "live"]
    assert workers["w-1"]["adapters_on_device"] == ["decl"]
    assert workers["w-3"]["adapters"] == []
    assert got["models"][0]["queued"] == 3  # the adapters' jobs are the parent's too


def test_tokens_per_adapter_come_from_the_workers_metrics():
    text = (
        "# TYPE tide:lora_generation_tokens_total counter\n"
        'tide:lora_generation_tokens_total{model="base",pool="p",adapter="decl"} 120.0\n'
        'tide:lora_generation_tokens_total{model="base",pool="p",adapter="base"} 30.0\n'
        "tide:mfu_ema 0.25\n"
    )
    stats = parse_metrics(text)
    assert stats.adapter_tokens == {"decl": 120.0, "base": 30.0} and stats.mfu == 0.25
    assert parse_metrics("tide:mfu_ema 0.1\n").adapter_tokens == {}
