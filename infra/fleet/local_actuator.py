"""``LocalActuator``: workers as ``tide worker`` child processes on this machine.

What ``tide up`` uses, so a laptop fleet also scales 0 -> N -> 0: it spawns workers and
removes them once they have drained and exited.
"""

from __future__ import annotations

import logging
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tide_fleet.infra.fleet.actuator import ActuatedWorker
from tide_fleet.infra.fleet.fleet_config import FleetConfig, PoolConfig, model_key
from tide_fleet.infra.fleet.gpus import VISIBLE, free_group, visible_gpus
from tide_fleet.infra.fleet.pool_gpus import TP_FLAG, tensor_parallel_argv, without_flag
from tide_fleet.infra.fleet.supervisor import spawn
from tide_fleet.infra.settings import child_env, get_settings

log = logging.getLogger("tide.controller")

# How a drained worker ends: 0 when it finished its drain, -SIGTERM when the drain's
# SIGTERM found it still loading its model (before its handler was installed).
_DRAINED_EXITS = (0, -signal.SIGTERM)


@dataclass
class _Proc:
    worker_id: str
    proc: subprocess.Popen[bytes]
    started: float
    draining: bool = False
    gpus: tuple[str, ...] = ()  # its CUDA_VISIBLE_DEVICES, when this machine has GPUs


class LocalActuator:
    """``tide worker`` child processes, one per worker, ids ``<pool>-local-<run>-<n>``: the
    run part is new for every actuator, so no id (nor its drain flag) is ever reused.

    Every live process counts against ``max_workers``, draining ones included; draining a
    local worker sends it SIGTERM, which a serving worker takes as a drain (finish what it
    holds, hand back the rest, exit) and a worker still loading its model as an exit, so a
    worker drained while starting never counts as capacity. After ``close`` nothing is
    launched again (the controller thread may still be mid-decision). Workers get `env`
    (default: ``child_env`` of this process's settings), their output goes to
    ``<log_dir>/<worker id>.log`` when a `log_dir` is given. A worker runs with its pool's
    ``--tensor-parallel-size`` (``gpus_per_worker``; the same flag in `worker_argv` gives
    way). On a machine with GPUs each worker gets that many to itself
    (``CUDA_VISIBLE_DEVICES``; infra/fleet/gpus.py): a worker whose GPUs are not free is
    not started, so workers never share a GPU, over every pool."""

    def __init__(
        self,
        fleet: FleetConfig,
        env: dict[str, str] | None = None,
        worker_argv: list[str] | None = None,
        log_dir: str | None = None,
    ) -> None:
        self.fleet = fleet
        self.env = dict(child_env(get_settings()) if env is None else env)
        # Engine flags shared by every pool; each pool's own GPUs per worker set the TP size.
        self.worker_argv = without_flag(worker_argv or [], TP_FLAG)
        self.log_dir = log_dir
        self.procs: dict[str, dict[str, _Proc]] = {name: {} for name in fleet.pools}
        self.run_id = secrets.token_hex(3)
        self._seq = 0
        self._lock = threading.Lock()
        self.closed = False
        self.launched = 0  # worker processes started, over the actuator's life
        self.gpus = visible_gpus(self.env)

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
                if not self._spawn(pool):
                    break

    def _held_gpus(self) -> set[str]:
        procs = (p for pool in self.procs.values() for p in pool.values())
        return {g for p in procs if p.proc.poll() is None for g in p.gpus}

    def _spawn(self, pool: PoolConfig) -> bool:
        env, gpus = self.env, None
        if self.gpus:
            n, held = pool.gpus_per_worker, self._held_gpus()
            gpus = free_group(self.gpus, held, n)
            if gpus is None:
                log.warning("pool %s: a worker takes %d GPU(s) and %d of the %d (%s) are "
                            "free; not starting another", pool.name, n,
                            len(self.gpus) - len(held), len(self.gpus),
                            ",".join(self.gpus))  # fmt: skip
                return False
            env = {**self.env, VISIBLE: ",".join(gpus)}
        self._seq += 1
        self.launched += 1
        worker_id = f"{pool.name}-local-{self.run_id}-{self._seq}"
        argv = [
            sys.executable, "-m", "tide_fleet.infra.cli", "worker", "--pool", pool.name,
            "--buckets", ",".join(pool.buckets), "--worker-id", worker_id,
            *self.worker_argv, *tensor_parallel_argv(pool.gpus_per_worker), *pool.worker_args,
        ]  # fmt: skip
        if pool.model:
            argv += ["--model", pool.model]
        if len(self.fleet.model_keys()) > 1:  # many models: each worker takes its model's
            default = self.env.get("TIDE_MODEL") or get_settings().model
            argv += ["--served-model", model_key(pool) or default]
        log_file = Path(self.log_dir) / f"{worker_id}.log" if self.log_dir else None
        proc = spawn(argv, env=env, log_file=log_file)
        self.procs[pool.name][worker_id] = _Proc(
            worker_id, proc, time.time(), gpus=tuple(gpus or ())
        )
        on = f" on GPU {','.join(gpus)}" if gpus else ""
        log.info("pool %s: started worker %s (pid %d)%s", pool.name, worker_id, proc.pid, on)
        return True

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
            elif code not in _DRAINED_EXITS:  # killed mid-drain: its held jobs go by lease
                log.warning("worker %s exited unexpectedly with %s while draining", worker_id, code)
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
