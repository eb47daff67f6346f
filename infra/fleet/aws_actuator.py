"""``AwsActuator``: one EC2 Auto Scaling group per pool.

Scale out with ``set_desired_capacity``; scale in by draining the chosen worker, then
``terminate_instance_in_auto_scaling_group`` with ``ShouldDecrementDesiredCapacity``. Keeps
scale-in protection on busy instances (so neither the ASG nor a target-tracking policy kills a
worker mid-job) and publishes ``BacklogPerInstance`` to CloudWatch per pool. An instance whose
type has fewer GPUs than the pool's ``gpus_per_worker`` (a group that disagrees with
fleet.toml, which refuses such types: infra/fleet/instance_gpus.py) is reported once.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

from tide_fleet.infra.fleet.actuator import ActuatedWorker
from tide_fleet.infra.fleet.fleet_config import FleetConfig, PoolConfig
from tide_fleet.infra.fleet.instance_gpus import instance_gpus
from tide_fleet.infra.wire.heartbeats import Heartbeat, read_heartbeats

log = logging.getLogger("tide.controller")

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
        self._beats: dict[str, Heartbeat] = {}
        self._gone: dict[str, int] = {}  # draining instance -> polls without a heartbeat
        self._short_of_gpus: set[tuple[str, str]] = set()  # (pool, instance type) reported

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

    def _by_instance(self) -> dict[str, tuple[str, Heartbeat]]:
        self._beats = read_heartbeats(self.r)
        return {b.instance_id: (w, b) for w, b in self._beats.items() if b.instance_id}

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
            self._check_gpus(pool, iid, inst.get("InstanceType"))
            worker_id, beat = beats.get(iid, (iid, None))
            if iid in self.draining or inst["LifecycleState"] == "Terminating:Wait":
                state = "draining"
            else:
                state = "starting" if beat is None else "ready"
            out.append(ActuatedWorker(worker_id, state, time.time()))
            if beat is not None:
                self._protect(pool, iid, beat.is_busy)
        return out

    def _check_gpus(self, pool: PoolConfig, iid: str, itype: str | None) -> None:
        gpus = instance_gpus(itype) if itype else None
        if gpus is None or gpus.count >= pool.gpus_per_worker:
            return
        if (pool.name, itype) not in self._short_of_gpus:
            self._short_of_gpus.add((pool.name, itype))
            log.error("pool %s: instance %s is a %s with %d GPU(s) (%s), but a worker takes %d "
                      "(gpus_per_worker): the group's instance types disagree with the fleet "
                      "file; render the tfvars again and apply them", pool.name, iid, itype,
                      gpus.count, gpus.model, pool.gpus_per_worker)  # fmt: skip

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
