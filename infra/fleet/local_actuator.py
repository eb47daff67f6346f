"""``LocalActuator``: workers as ``tide worker`` child processes on this machine.

What ``tide up`` uses, so a laptop fleet also scales 0 -> N -> 0: it spawns workers and
removes them once they have drained and exited.
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from infra.fleet.actuator import ActuatedWorker
from infra.fleet.fleet_config import FleetConfig, PoolConfig
from infra.fleet.supervisor import orphan_safe

log = logging.getLogger("tide.controller")


@dataclass
class _Proc:
    worker_id: str
    proc: subprocess.Popen[bytes]
    started: float
    draining: bool = False


class LocalActuator:
    """``tide worker`` child processes, one per worker, ids ``<pool>-local-<run>-<n>``: the
    run part is new for every actuator, so no id (nor its drain flag) is ever reused.

    Every live process counts against ``max_workers``, draining ones included; draining a
    local worker sends it SIGTERM, which a serving worker takes as a drain (finish what it
    holds, hand back the rest, exit) and a worker still loading its model as an exit, so a
    worker drained while starting never counts as capacity. After ``close`` nothing is
    launched again (the controller thread may still be mid-decision)."""

    def __init__(
        self,
        fleet: FleetConfig,
        env: dict[str, str] | None = None,
        worker_argv: list[str] | None = None,
        log_dir: str | None = None,
    ) -> None:
        self.fleet = fleet
        self.env = dict(os.environ if env is None else env)
        self.worker_argv = worker_argv or []  # engine flags shared by every pool
        self.log_dir = log_dir
        self.procs: dict[str, dict[str, _Proc]] = {name: {} for name in fleet.pools}
        self.run_id = secrets.token_hex(3)
        self._seq = 0
        self._lock = threading.Lock()
        self.closed = False
        self.launched = 0  # worker processes started, over the actuator's life

    def list_workers(self, pool: PoolConfig) -> list[ActuatedWorker]:
        return [
            ActuatedWorker(p.worker_id, "draining" if p.draining else "starting", p.started)
            for p in self.procs[pool.name].values()
            if p.proc.poll() is None or not p.draining
        ]

    def live(self, pool: PoolConfig) -> int:
        """Worker processes of the pool still running, whatever their state."""
        return sum(p.proc.poll() is None for p in self.procs[pool.name].values())

    def launch(self, pool: PoolConfig, n: int) -> None:
        with self._lock:
            if self.closed:
                return
            for _ in range(max(min(n, pool.max_workers - self.live(pool)), 0)):
                self._spawn(pool)

    def _spawn(self, pool: PoolConfig) -> None:
        self._seq += 1
        self.launched += 1
        worker_id = f"{pool.name}-local-{self.run_id}-{self._seq}"
        argv = [
            sys.executable, "-m", "infra.cli", "worker", "--pool", pool.name,
            "--buckets", ",".join(pool.buckets), "--worker-id", worker_id,
            *self.worker_argv, *pool.worker_args,
        ]  # fmt: skip
        if pool.model:
            argv += ["--model", pool.model]
        out: Any = None
        if self.log_dir:
            out = open(os.path.join(self.log_dir, f"{worker_id}.log"), "ab")  # noqa: SIM115
        proc = subprocess.Popen(orphan_safe(argv), env=self.env, stdout=out, stderr=out)
        self.procs[pool.name][worker_id] = _Proc(worker_id, proc, time.time())
        log.info("pool %s: started worker %s (pid %d)", pool.name, worker_id, proc.pid)

    def drain(self, pool: PoolConfig, worker_id: str) -> None:
        p = self.procs[pool.name].get(worker_id)
        if p is not None and not p.draining:
            p.draining = True
            if p.proc.poll() is None:
                p.proc.terminate()  # SIGTERM: drain (or, still loading, exit)

    def remove_drained(self, pool: PoolConfig) -> list[str]:
        removed = []
        for worker_id, p in list(self.procs[pool.name].items()):
            code = p.proc.poll()
            if code is None:
                continue
            del self.procs[pool.name][worker_id]
            if not p.draining:
                log.warning("worker %s exited unexpectedly with %s", worker_id, code)
            removed.append(worker_id)
        return removed

    def publish(self, pool: PoolConfig, backlog_jobs: int, workers: int) -> None:
        pass  # nothing outside this machine watches a local pool

    def close(self) -> None:
        """Drain everything (SIGTERM: workers hand their jobs back) and wait."""
        with self._lock:
            self.closed = True
        procs = [p.proc for pool in self.procs.values() for p in pool.values()]
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
