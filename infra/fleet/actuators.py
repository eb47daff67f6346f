"""Actuators: how the controller adds and removes workers.

One interface, two implementations:

- ``LocalActuator`` spawns ``tide worker`` processes and removes them once they have
  drained and exited (what ``tide up`` uses, so a laptop fleet also scales 0 -> N -> 0);
- ``AwsActuator`` drives one EC2 Auto Scaling group per pool: scale out with
  ``set_desired_capacity``; scale in by draining the chosen worker, then
  ``terminate_instance_in_auto_scaling_group`` with ``ShouldDecrementDesiredCapacity``; keeps
  scale-in protection on busy instances (so neither the ASG nor a target-tracking policy
  kills a worker mid-job); publishes ``BacklogPerInstance`` to CloudWatch per pool.

Draining itself is the same everywhere: the controller sets ``tide:drain:<worker>`` in
Redis; the worker sees it with its next heartbeat, stops taking jobs, finishes what it
holds, and exits (deleting its heartbeat).
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
from typing import Any, Protocol

import redis

from infra.fleet.fleet_config import FleetConfig, PoolConfig
from infra.fleet.supervisor import orphan_safe

log = logging.getLogger("tide.controller")


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


# -- local processes ------------------------------------------------------------------


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


# -- AWS Auto Scaling -------------------------------------------------------------------

PROTECT_WHEN_RUNNING = True
LIVE_STATES = ("Pending", "Pending:Wait", "Pending:Proceed", "InService", "Terminating:Wait")
PENDING = "pending-"  # id of capacity the group was asked for but has not listed yet


class AwsActuator:
    """One Auto Scaling group per pool, named ``<name_prefix>-<pool>`` (as Terraform names it).

    A worker on EC2 puts its instance id in its heartbeat (TIDE_INSTANCE_ID, which the user
    data sets from the instance metadata); that is how a worker id maps to an instance.
    """

    def __init__(
        self,
        fleet: FleetConfig,
        client: redis.Redis,
        autoscaling: Any = None,
        cloudwatch: Any = None,
        endpoint_url: str | None = None,
    ) -> None:
        import boto3

        self.fleet = fleet
        self.r = client
        region = fleet.aws.region
        self.asg = autoscaling or boto3.client(
            "autoscaling", region_name=region, endpoint_url=endpoint_url
        )
        self.cw = cloudwatch or boto3.client(
            "cloudwatch", region_name=region, endpoint_url=endpoint_url
        )
        self.draining: dict[str, str] = {}  # instance id -> worker id (or instance id)
        self.protected: dict[str, bool] = {}
        self._beats: dict[str, dict[str, str]] = {}
        self._gone: dict[str, int] = {}  # draining instance -> polls without a heartbeat

    def group_name(self, pool: PoolConfig) -> str:
        return f"{self.fleet.aws.name_prefix}-{pool.name}"

    def _group(self, pool: PoolConfig) -> dict[str, Any]:
        name = self.group_name(pool)
        groups = self.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])
        if not groups["AutoScalingGroups"]:
            raise RuntimeError(f"Auto Scaling group {self.group_name(pool)} not found")
        group: dict[str, Any] = groups["AutoScalingGroups"][0]
        return group

    @staticmethod
    def _live(group: dict[str, Any]) -> list[dict[str, Any]]:
        return [i for i in group["Instances"] if i["LifecycleState"] in LIVE_STATES]

    def _by_instance(self) -> dict[str, tuple[str, dict[str, str]]]:
        from infra.fleet.controller import read_heartbeats

        self._beats = read_heartbeats(self.r)
        return {b["instance_id"]: (w, b) for w, b in self._beats.items() if b.get("instance_id")}

    def list_workers(self, pool: PoolConfig) -> list[ActuatedWorker]:
        beats = self._by_instance()
        group = self._group(pool)
        instances = self._live(group)
        out = []
        # Capacity asked for but not listed yet counts as starting, so the next poll does
        # not launch it again.
        for k in range(max(0, group["DesiredCapacity"] - len(instances))):
            out.append(ActuatedWorker(f"{PENDING}{k}", "starting", time.time()))
        for inst in instances:
            iid = inst["InstanceId"]
            worker_id, beat = beats.get(iid, (iid, None))
            if iid in self.draining or inst["LifecycleState"] == "Terminating:Wait":
                state = "draining"
            else:
                state = "starting" if beat is None else "ready"
            out.append(ActuatedWorker(worker_id, state, time.time()))
            if beat is not None:
                self._protect(pool, iid, int(beat.get("held", 0) or 0) > 0)
        return out

    def launch(self, pool: PoolConfig, n: int) -> None:
        group = self._group(pool)
        desired = min(group["DesiredCapacity"] + n, pool.max_workers, group["MaxSize"])
        self.asg.set_desired_capacity(
            AutoScalingGroupName=self.group_name(pool), DesiredCapacity=desired, HonorCooldown=False
        )
        log.info("pool %s: desired capacity %d -> %d", pool.name, group["DesiredCapacity"], desired)

    def drain(self, pool: PoolConfig, worker_id: str) -> None:
        if worker_id.startswith(PENDING):  # not launched yet: just ask for one fewer
            group = self._group(pool)
            self.asg.set_desired_capacity(
                AutoScalingGroupName=self.group_name(pool),
                DesiredCapacity=max(group["DesiredCapacity"] - 1, group["MinSize"]),
                HonorCooldown=False,
            )
            return
        beats = self._by_instance()
        iid = next((i for i, (w, _) in beats.items() if w == worker_id), worker_id)
        self.draining[iid] = worker_id

    def remove_drained(self, pool: PoolConfig) -> list[str]:
        """Terminate instances whose worker finished draining (its heartbeat is gone) or
        that never started one (nothing to drain)."""
        beats = self._by_instance()
        live = {i["InstanceId"] for i in self._live(self._group(pool))}
        removed = []
        for iid, worker_id in list(self.draining.items()):
            if iid not in live:
                del self.draining[iid]
                continue
            if iid in beats:
                self._gone.pop(iid, None)
                continue  # still draining
            # Gone for two polls in a row (not one missed heartbeat during a Redis blip).
            self._gone[iid] = self._gone.get(iid, 0) + 1
            if self._gone[iid] < 2:
                continue
            del self._gone[iid]
            self._protect(pool, iid, False)
            self.asg.terminate_instance_in_auto_scaling_group(
                InstanceId=iid, ShouldDecrementDesiredCapacity=True
            )
            del self.draining[iid]
            removed.append(worker_id)
        return removed

    def _protect(self, pool: PoolConfig, iid: str, busy: bool) -> None:
        want = busy and PROTECT_WHEN_RUNNING  # a draining worker's jobs are protected too
        if self.protected.get(iid) == want:
            return
        self.asg.set_instance_protection(
            InstanceIds=[iid], AutoScalingGroupName=self.group_name(pool),
            ProtectedFromScaleIn=want,
        )  # fmt: skip
        self.protected[iid] = want

    def publish(self, pool: PoolConfig, backlog_jobs: int, workers: int) -> None:
        """BacklogPerInstance (queued home-bucket jobs per instance, dimension Pool) for
        those who prefer native target tracking. A failure is logged: scaling goes on."""
        try:
            self.cw.put_metric_data(
                Namespace=self.fleet.aws.cloudwatch_namespace,
                MetricData=[
                    {
                        "MetricName": "BacklogPerInstance",
                        "Dimensions": [{"Name": "Pool", "Value": pool.name}],
                        "Value": backlog_jobs / max(workers, 1),
                        "Unit": "Count",
                    }
                ],
            )
        except Exception as e:  # throttling, a missing permission
            log.warning("pool %s: BacklogPerInstance not published: %s", pool.name, e)

    def close(self) -> None:
        pass
