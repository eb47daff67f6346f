"""The worker heartbeat: one typed object, one encoding in Redis.

Every heartbeat interval a worker (worker/service.py) writes ``Heartbeat.to_hash()`` to the
hash ``tide:worker:<id>`` with a TTL of about three intervals and lists the id in the zset
``tide:workers``; an id whose hash has expired is a gone worker. The controller, the AWS
actuator, ``tide doctor`` and the gateway's readiness read it back with ``read_heartbeats``
(or ``read_heartbeats_async``). The field names and their text encoding (infra/wire/codec.py)
are what the Grafana dashboard and saved doctor recordings see, so they do not change.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import cast

import redis
import redis.asyncio as aredis

from tide_fleet.infra.wire.codec import decode_hash, encode_value
from tide_fleet.infra.wire.protocol import Keys


@dataclass(frozen=True)
class Heartbeat:
    """A worker's state as the rest of the fleet sees it; a field an older worker did not
    write reads as its default."""

    worker_id: str = ""
    pool: str = ""
    model: str = ""  # the served name of the model it runs ('' from an older worker)
    buckets: tuple[str, ...] = ()
    pid: int = 0
    host: str = ""
    running: int = 0  # sequences the engine is running
    waiting: int = 0  # sequences waiting in the engine's scheduler
    held: int = 0  # jobs whose lease the worker holds
    free_slots: int = 0
    kv_cache_usage: float = 0.0
    tokens_per_s: float = 0.0  # generated tokens per second since the last heartbeat
    draining: bool = False
    served_work_total: int = 0  # prompt + max tokens of jobs finished (a counter)
    idle_since: float | None = None  # unix time it last became idle; None while busy
    instance_id: str = ""  # EC2 instance id (TIDE_INSTANCE_ID), "" elsewhere
    metrics_url: str = ""
    cold_start_s: float | None = None  # process start to serving (worker/boot.py)
    at: float = 0.0  # unix time of the beat
    # The LoRA adapters its engine holds (in host memory or a device slot), and those of
    # them in a device slot now; empty for a worker serving none (or an older one).
    adapters: tuple[str, ...] = ()
    adapters_on_device: tuple[str, ...] = ()

    @property
    def is_busy(self) -> bool:
        return self.held > 0

    def to_hash(self) -> dict[str, str]:
        """The Redis hash, in the wire's one encoding (infra/wire/codec.py): numbers as their
        repr, draining 1/0, idle_since "" while busy; buckets and adapters comma-separated
        (an adapter name has no comma: infra/contract/adapters.py NAME)."""
        out = {f.name: encode_value(getattr(self, f.name)) for f in fields(self)}
        for name in ("buckets", "adapters", "adapters_on_device"):
            out[name] = ",".join(getattr(self, name))
        # Fields newer than the hash's first form are left out while unset, so a worker
        # that has none writes the hash it always wrote.
        for name in ("model", "cold_start_s", "adapters", "adapters_on_device"):
            if getattr(self, name) in ("", None, ()):
                del out[name]
        return out

    @classmethod
    def from_hash(cls, raw: Mapping[str, str], worker_id: str = "") -> Heartbeat:
        """Decode a hash as read back (text); a missing or empty field takes its default.
        `worker_id` names the worker when the hash does not."""
        f = {k: v for k, v in raw.items() if v != ""}
        return cls(
            worker_id=f.get("worker_id", worker_id),
            pool=f.get("pool", ""),
            model=f.get("model", ""),
            buckets=_names(f.get("buckets", "")),
            pid=int(f.get("pid", 0)),
            host=f.get("host", ""),
            running=int(f.get("running", 0)),
            waiting=int(f.get("waiting", 0)),
            held=int(f.get("held", 0)),
            free_slots=int(f.get("free_slots", 0)),
            kv_cache_usage=float(f.get("kv_cache_usage", 0.0)),
            tokens_per_s=float(f.get("tokens_per_s", 0.0)),
            draining=f.get("draining", "0") != "0",
            served_work_total=int(f.get("served_work_total", 0)),
            idle_since=float(f["idle_since"]) if "idle_since" in f else None,
            instance_id=f.get("instance_id", ""),
            metrics_url=f.get("metrics_url", ""),
            cold_start_s=float(f["cold_start_s"]) if "cold_start_s" in f else None,
            at=float(f.get("at", 0.0)),
            adapters=_names(f.get("adapters", "")),
            adapters_on_device=_names(f.get("adapters_on_device", "")),
        )


def _names(text: str) -> tuple[str, ...]:
    return tuple(n for n in text.split(",") if n)


def read_heartbeats(r: redis.Redis) -> dict[str, Heartbeat]:
    """Worker id -> its heartbeat, for the workers whose heartbeat has not expired (one
    pipeline; a client without decode_responses, as everywhere in Tide)."""
    ids = [w.decode() for w in cast(list[bytes], r.zrange(Keys.workers, 0, -1))]
    pipe = r.pipeline(transaction=False)
    for w in ids:
        pipe.hgetall(Keys.worker(w))
    return _live(ids, pipe.execute())


async def read_heartbeats_async(r: aredis.Redis) -> dict[str, Heartbeat]:
    """The same with redis.asyncio (the gateway)."""
    ids = [w.decode() for w in cast(list[bytes], await r.zrange(Keys.workers, 0, -1))]
    pipe = r.pipeline(transaction=False)
    for w in ids:
        pipe.hgetall(Keys.worker(w))
    return _live(ids, await pipe.execute() if ids else [])


def _live(ids: list[str], hashes: list[dict[bytes, bytes]]) -> dict[str, Heartbeat]:
    return {
        w: Heartbeat.from_hash(decode_hash(h), w) for w, h in zip(ids, hashes, strict=True) if h
    }
