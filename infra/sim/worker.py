"""One simulated worker: its slots, its KV room, and the step time of its batch."""

from __future__ import annotations

import math

from tide_fleet.infra.fleet.fleet_config import PoolConfig
from tide_fleet.infra.sim.service_model import ServiceModel
from tide_fleet.infra.sim.traces import Job


class SimWorker:
    """One worker: processor sharing over its running jobs, tracked in virtual time (output
    tokens per job so far), so a batch change costs one heap push, not a pass over jobs."""

    __slots__ = (
        "flop", "gpus", "heap", "idle_since", "kv_used", "launched", "mem", "model", "pool",
        "prefill", "queues", "ready_at", "removed", "served", "state", "t_last",
        "version", "vt", "wid",
    )  # fmt: skip

    def __init__(
        self, wid: str, pool: PoolConfig, model: ServiceModel, queues: list[str], now: float,
        cold: float,
    ) -> None:  # fmt: skip
        self.wid, self.pool, self.model = wid, pool.name, model
        self.gpus = pool.gpus_per_worker  # it holds (tensor parallel); each one is billed
        self.queues = queues  # its model's queues of its pool's buckets, in preference order
        self.launched, self.ready_at, self.removed = now, now + cold, math.inf
        self.state = "starting" if cold > 0 else "ready"
        self.heap: list[tuple[float, int, Job, tuple[float, float, float]]] = []
        self.mem = self.flop = self.prefill = 0.0  # sums of the running jobs' costs
        self.kv_used = 0
        self.served = 0  # prompt + max tokens of jobs finished, as its heartbeat reports
        self.vt = 0.0
        self.t_last = now
        self.version = 0
        self.idle_since: float | None = None if cold > 0 else now

    @property
    def running(self) -> int:
        return len(self.heap)

    def gpu_seconds(self, end: float) -> float:
        """GPU time billed from launch to removal (or `end`)."""
        return (min(self.removed, end) - self.launched) * self.gpus

    def can_take(self, job: Job) -> bool:
        m = self.model
        return len(self.heap) < m.max_num_seqs and self.kv_used + job.work <= m.kv_tokens

    def step_time(self) -> float:
        return self.model.step_time(self.mem, self.flop, self.prefill)

    def advance(self, now: float) -> None:
        if self.heap:
            self.vt += (now - self.t_last) / self.step_time()
        self.t_last = now
