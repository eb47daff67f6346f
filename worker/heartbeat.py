"""The worker's heartbeat: one typed record (``infra.wire.heartbeats``) written with a TTL.

Every heartbeat interval the worker writes what it runs and holds (its LoRA adapters
included), its token rate since the last beat and its served work, lists itself in the
workers set, and reads in the same round trip whether the controller asked it to drain.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import redis

from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire.heartbeats import Heartbeat
from tide_fleet.infra.wire.protocol import Keys


class HeartbeatWriter:
    def __init__(
        self,
        client: redis.Redis,
        settings: Settings,
        worker_id: str,
        pool: str,
        buckets: list[str],
        model: str = "",
    ) -> None:
        self.redis = client
        self.settings = settings
        self.worker_id = worker_id
        self.pool = pool
        self.buckets = buckets
        self.model = model
        self._last_tokens = (time.monotonic(), 0)

    def write(
        self,
        stats: dict[str, Any],
        *,
        held: int,
        free_slots: int,
        draining: bool,
        served_work: int,
        idle_since: float | None,
        metrics_url: str,
        cold_start_s: float | None = None,
    ) -> bool:
        """Write one heartbeat from the engine's stats (its adapters from stats["lora"]);
        True when a drain is requested."""
        now = time.monotonic()
        then, tokens = self._last_tokens
        produced = stats["generation_tokens"] - tokens
        rate = produced / (now - then) if now > then else 0.0
        self._last_tokens = (now, stats["generation_tokens"])
        lora = stats.get("lora") or {}
        on_device = sorted(lora.get("on_device", ()))
        beat = Heartbeat(
            worker_id=self.worker_id,
            pool=self.pool,
            model=self.model,
            buckets=tuple(self.buckets),
            pid=os.getpid(),
            host=socket.gethostname(),
            running=stats["num_running"],
            waiting=stats["num_waiting"],
            held=held,
            free_slots=free_slots,
            kv_cache_usage=round(stats["kv_cache_usage"], 4),
            tokens_per_s=round(rate, 2),
            draining=draining,
            served_work_total=served_work,
            idle_since=idle_since,
            instance_id=self.settings.instance_id,
            metrics_url=metrics_url,
            cold_start_s=cold_start_s,
            at=time.time(),
            adapters=tuple(sorted({*on_device, *lora.get("in_host", ())})),
            adapters_on_device=tuple(on_device),
        )
        ttl = max(int(3 * self.settings.worker_heartbeat_seconds), 2)
        key = Keys.worker(self.worker_id)
        pipe = self.redis.pipeline(transaction=False)
        fields: dict[Any, Any] = beat.to_hash()  # redis' stubs want a wider key type
        pipe.hset(key, mapping=fields)
        pipe.expire(key, ttl)
        pipe.zadd(Keys.workers, {self.worker_id: time.time()})
        pipe.exists(Keys.drain(self.worker_id))
        return bool(pipe.execute()[-1])
