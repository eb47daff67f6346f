"""Actuators: how the controller adds and removes workers.

One interface, two implementations: ``LocalActuator`` (infra/fleet/local_actuator.py) spawns
``tide worker`` processes, ``AwsActuator`` (infra/fleet/aws_actuator.py) drives one EC2 Auto
Scaling group per pool.

Draining itself is the same everywhere: the controller sets ``tide:drain:<worker>`` in
Redis; the worker sees it with its next heartbeat, stops taking jobs, finishes what it
holds, and exits (deleting its heartbeat).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tide_fleet.infra.fleet.fleet_config import PoolConfig


@dataclass
class ActuatedWorker:
    worker_id: str
    state: str  # starting | ready | draining (the controller refines it from heartbeats)
    since: float


class Actuator(Protocol):
    def list_workers(self, pool: PoolConfig) -> list[ActuatedWorker]: ...

    def launch(self, pool: PoolConfig, n: int) -> None: ...

    def drain(self, pool: PoolConfig, worker_id: str) -> None: ...

    def remove_drained(self, pool: PoolConfig) -> list[str]: ...

    def publish(self, pool: PoolConfig, backlog_jobs: int, workers: int) -> None:
        """After each observation: what the pool's queue looks like (AWS: CloudWatch)."""

    def close(self) -> None: ...
