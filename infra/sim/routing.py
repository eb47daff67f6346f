"""Where a simulated job goes: for each (model, bucket) queue, its home pool (the one sized
for its backlog) and the pools that serve it, most preferring first. One model's pools
never take or size for another model's queue, as in the live fleet
(infra/fleet/fleet_config.py, infra/fleet/controller.py; docs/simulator.md).

A queue is named as the backlog keys name it (infra/wire/protocol.py backlog_field): the
bucket for the model of pools without a served name, ``<model>:<bucket>`` for the others,
so a one-model fleet's queues are its buckets, as before models had names.
"""

from __future__ import annotations

from tide_fleet.infra.fleet.fleet_config import FleetConfig, PoolConfig, model_key
from tide_fleet.infra.sim.models import FleetModels
from tide_fleet.infra.sim.traces import Job
from tide_fleet.infra.wire.protocol import BUCKETS, backlog_field


class Routing:
    """The fleet's queues, their home pools and servers, and each job's queue."""

    def __init__(self, fleet: FleetConfig, models: FleetModels | None = None) -> None:
        self.fleet = fleet
        self.models = models or FleetModels(fleet)
        self.default_key = self.models.default.key
        keys = list(self.models.by_key)
        self.pool_model = {name: model_key(p) for name, p in fleet.pools.items()}
        # A worker's queues, in its pool's preference order; its pool's home queues.
        self.queues = {name: [backlog_field(b, model_key(p)) for b in p.buckets]
                       for name, p in fleet.pools.items()}  # fmt: skip
        self.home_queues = {
            name: [backlog_field(b, self.pool_model[name]) for b in fleet.home_buckets(name)]
            for name in fleet.pools
        }
        self.home = {q: pool for pool, qs in self.home_queues.items() for q in qs}
        self.all_queues = [backlog_field(b, key) for key in keys for b in BUCKETS]
        # Per queue: the pools serving it, most preferring first, each with the queues its
        # workers take before this one.
        self.servers: dict[str, list[tuple[PoolConfig, list[str]]]] = {}
        for key in keys:
            for b in BUCKETS:
                pools = sorted(
                    (p for p in fleet.pools.values() if model_key(p) == key and b in p.buckets),
                    key=lambda p: p.buckets.index(b),
                )
                self.servers[backlog_field(b, key)] = [
                    (p, self.queues[p.name][: p.buckets.index(b)]) for p in pools
                ]

    def check_jobs(self, jobs: list[Job], kv_tokens: dict[str, int]) -> None:
        """Refuse, before a run, a job of a model no pool serves, or one whose prompt +
        max_tokens fits the KV room (per pool) of no pool serving its queue."""
        for n, job in enumerate(jobs, 1):
            if self.key_of(job) not in self.models.by_key:
                raise ValueError(
                    f"job {n} (arrival {job.arrival:g}s): model {job.model!r} is served by no "
                    f"pool (the fleet serves {', '.join(self.models.names())})"
                )
            room = max(kv_tokens[p.name] for p, _ in self.servers[self.queue_of(job)])
            if job.work > room:
                raise ValueError(
                    f"job {n} (arrival {job.arrival:g}s): prompt + max_tokens = {job.work} "
                    f"exceeds the KV room of every pool serving {job.bucket} (at most {room})"
                )

    def key_of(self, job: Job) -> str:
        """The job's model key: its own, or the default model's (a job that names none)."""
        return self.default_key if job.model is None else job.model

    def queue_of(self, job: Job) -> str:
        return backlog_field(job.bucket, self.key_of(job))

    def name_of(self, key: str) -> str:
        return self.models.by_key[key].name
