"""AWS: the Auto Scaling actuator against a moto server on loopback, with real `tide worker`
processes standing in for the instances' workers, and the EC2 lifecycle watcher against a
fake instance-metadata service."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis

from tests.conftest import wait_for
from tide_fleet.infra.fleet.aws_actuator import AwsActuator
from tide_fleet.infra.fleet.aws_lifecycle import LifecycleWatcher
from tide_fleet.infra.fleet.controller import Controller
from tide_fleet.infra.fleet.fleet_config import parse_fleet
from tide_fleet.infra.fleet.redis_server import EmbeddedRedis
from tide_fleet.infra.jobs.schemas import JobCreate
from tide_fleet.infra.jobs.submission import ModelInfo, build_job
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire.jobstore import JobStore


def make_group(moto_url: str, name: str, max_size: int = 3) -> None:
    """What Terraform's worker_pool module creates, reduced to what the actuator uses."""
    import boto3

    ec2 = boto3.client("ec2", endpoint_url=moto_url, region_name="us-east-1")
    ami = ec2.describe_images()["Images"][0]["ImageId"]
    ec2.create_launch_template(
        LaunchTemplateName=name, LaunchTemplateData={"ImageId": ami, "InstanceType": "g6.xlarge"}
    )
    asg = boto3.client("autoscaling", endpoint_url=moto_url, region_name="us-east-1")
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateName": name, "Version": "$Latest"},
        MinSize=0, MaxSize=max_size, DesiredCapacity=0, AvailabilityZones=["us-east-1a"],
    )  # fmt: skip


@pytest.mark.slow
def test_a_burst_scales_an_auto_scaling_group_0_n_0(moto_url, tmp_path: Path, tiny_path: Path):
    make_group(moto_url, "tide-gpu")
    run_burst(moto_url, "tide", "gpu", ["short", "medium", "long"], tmp_path, tiny_path)


def run_burst(
    moto_url: str, prefix: str, pool_name: str, buckets: list[str], tmp_path: Path, tiny_path: Path
) -> None:
    """A burst of 14 short jobs scales the group <prefix>-<pool_name> 0 -> 2 -> 0 (also run on
    the group Terraform creates, in test_terraform.py); its workers serve `buckets`."""
    import boto3

    group_name = f"{prefix}-{pool_name}"
    asg = boto3.client("autoscaling", endpoint_url=moto_url, region_name="us-east-1")
    cw = boto3.client("cloudwatch", endpoint_url=moto_url, region_name="us-east-1")
    server = EmbeddedRedis(tmp_path / "redis").start()
    stop = threading.Event()
    booted: dict[str, subprocess.Popen[bytes]] = {}
    try:
        client = redis.Redis.from_url(server.url)
        settings = Settings(
            redis_url=server.url, model=str(tiny_path), worker_heartbeat_seconds=0.3,
            lease_seconds=3, reaper_interval=0.3,
        )  # fmt: skip
        fleet = parse_fleet(
            {
                "controller": {"poll_interval_s": 0.3, "scale_in_cooldown_s": 1.0,
                               "actuator": "aws"},
                "aws": {"name_prefix": prefix, "cloudwatch_namespace": "TideTest"},
                "pools": {
                    pool_name: {  # the only pool, so home to every bucket
                        "buckets": ["short", "medium", "long"], "device": "l4",
                        "instance_types": ["g6.xlarge"], "max_workers": 2,
                        "target_wait_s": 2, "idle_s": 2, "tokens_per_s": 50, "cold_start_s": 1,
                    }
                },
            }
        )  # fmt: skip
        env = dict(os.environ) | {
            "REDIS_URL": server.url, "TIDE_MODEL": str(tiny_path),
            "TIDE_WORKER_HEARTBEAT_SECONDS": "0.3", "TIDE_LEASE_SECONDS": "3",
        }  # fmt: skip

        def instances() -> list[dict]:
            g = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group_name])
            return g["AutoScalingGroups"][0]["Instances"]

        def ec2_boots() -> None:
            """Each new InService instance starts a worker, as the user data would."""
            while not stop.wait(0.2):
                for inst in instances():
                    iid = inst["InstanceId"]
                    if inst["LifecycleState"] == "InService" and iid not in booted:
                        booted[iid] = subprocess.Popen(
                            [sys.executable, "-m", "tide_fleet.infra.cli", "worker",
                             "--pool", pool_name,
                             "--buckets", ",".join(buckets),
                             "--worker-id", f"{pool_name}-{iid}", "--dtype", "float32",
                             "--max-num-seqs", "2"],
                            env=env | {"TIDE_INSTANCE_ID": iid},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        )  # fmt: skip

        actuator = AwsActuator(fleet, client, endpoint_url=moto_url)
        controller = Controller(fleet, settings, actuator, client)
        info = ModelInfo.load(str(tiny_path))
        store = JobStore(client)
        ids = [
            store.create(
                build_job(
                    settings, info, "t",
                    JobCreate(prompt=f"job {i} once upon a time", max_tokens=48, ignore_eos=True),
                    None,
                )
            )["id"]
            for i in range(14)
        ]  # fmt: skip
        peak, protected_seen = 0, False

        def control() -> None:
            nonlocal peak, protected_seen
            while not stop.wait(0.3):
                controller.step()
                insts = instances()
                peak = max(peak, len(insts))
                protected_seen |= any(i.get("ProtectedFromScaleIn") for i in insts)

        threads = [threading.Thread(target=f, daemon=True) for f in (ec2_boots, control)]
        for t in threads:
            t.start()
        wait_for(
            lambda: all(store.get(j)["status"] == "completed" for j in ids),  # type: ignore[index]
            180, what="every job to complete",
        )  # fmt: skip
        assert peak == 2, f"expected the group to grow to max_workers=2, saw {peak}"
        assert protected_seen, "busy instances should have been protected from scale-in"
        assert [store.get(j)["attempts"] for j in ids] == ["1"] * len(ids)  # type: ignore[index]

        def back_to_zero() -> bool:
            g = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group_name])
            group = g["AutoScalingGroups"][0]
            return group["DesiredCapacity"] == 0 and not group["Instances"]

        wait_for(back_to_zero, 60, what="the group to scale back to zero")
        # Workers drained and exited cleanly before their instances were terminated.
        assert all(p.wait(timeout=30) == 0 for p in booted.values())
        metrics = cw.list_metrics(Namespace="TideTest")["Metrics"]
        assert {
            (m["MetricName"], tuple((d["Name"], d["Value"]) for d in m["Dimensions"]))
            for m in metrics
        } == {("BacklogPerInstance", (("Pool", pool_name),))}
    finally:
        stop.set()
        for p in booted.values():
            if p.poll() is None:
                p.kill()
        server.stop()


class _FakeImds:
    """IMDSv2: a token, then autoscaling/target-lifecycle-state (only with the token)."""

    def __init__(self) -> None:
        self.state = "InService"
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                ok = self.path == "/latest/api/token" and self.headers.get(
                    "X-aws-ec2-metadata-token-ttl-seconds"
                )
                self._reply(200 if ok else 400, "tok-123")

            def do_GET(self) -> None:
                if self.headers.get("X-aws-ec2-metadata-token") != "tok-123":
                    self._reply(401, "")
                elif self.path == "/latest/meta-data/autoscaling/target-lifecycle-state":
                    self._reply(200, fake.state)
                else:
                    self._reply(404, "")

            def _reply(self, code: int, body: str) -> None:
                self.send_response(code)
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


def test_lifecycle_watcher_drains_then_completes_the_action():
    import boto3
    from botocore.stub import Stubber

    imds = _FakeImds()
    settings = Settings(
        instance_id="i-0abc", aws_lifecycle_hook="tide-gpu-drain", aws_asg_name="tide-gpu",
        aws_imds_url=imds.url,
    )  # fmt: skip
    client = boto3.client(
        "autoscaling", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    drained = []
    with Stubber(client) as stub:
        # moto does not implement complete_lifecycle_action: check the exact call instead.
        stub.add_response(
            "complete_lifecycle_action", {},
            {"LifecycleHookName": "tide-gpu-drain", "AutoScalingGroupName": "tide-gpu",
             "LifecycleActionResult": "CONTINUE", "InstanceId": "i-0abc"},
        )  # fmt: skip
        watcher = LifecycleWatcher(settings, lambda: drained.append(1), autoscaling=client)
        assert LifecycleWatcher.enabled(settings)
        assert watcher.check() is False and drained == []
        assert watcher.complete() is False  # nothing to complete while in service
        imds.state = "Terminated"
        assert watcher.check() is True and drained == [1]
        assert watcher.check() is True and drained == [1]  # drains once
        assert watcher.complete() is True
        stub.assert_no_pending_responses()
    imds.server.shutdown()
    assert not LifecycleWatcher.enabled(Settings())


class _FakeGroup:
    """describe/set on one Auto Scaling group, with instances that lag DesiredCapacity."""

    def __init__(self, desired: int, instances: list[str], instance_type: str = "g6.xlarge"):
        self.desired, self.instances, self.calls = desired, instances, []
        self.instance_type = instance_type

    def describe_auto_scaling_groups(self, AutoScalingGroupNames):
        insts = [{"InstanceId": i, "LifecycleState": "Pending", "InstanceType": self.instance_type}
                 for i in self.instances]  # fmt: skip
        group = {"DesiredCapacity": self.desired, "MinSize": 0, "MaxSize": 8, "Instances": insts}
        return {"AutoScalingGroups": [group]}

    def set_desired_capacity(self, AutoScalingGroupName, DesiredCapacity, HonorCooldown):
        self.calls.append(DesiredCapacity)
        self.desired = DesiredCapacity


class _BrokenCloudWatch:
    def put_metric_data(self, **kwargs):
        raise RuntimeError("throttled")


def test_capacity_not_listed_yet_counts_so_a_burst_is_not_launched_twice(redis_client):
    from tide_fleet.infra.fleet.autoscale import PoolState, decide

    fleet = parse_fleet({"pools": {"gpu": {"buckets": ["short", "medium", "long"],
                                           "max_workers": 8, "cold_start_s": 0}}})  # fmt: skip
    pool = fleet.pools["gpu"]
    asg = _FakeGroup(desired=3, instances=["i-1"])  # asked for 3, one listed so far
    actuator = AwsActuator(fleet, redis_client, autoscaling=asg, cloudwatch=_BrokenCloudWatch())
    workers = actuator.list_workers(pool)
    assert [w.state for w in workers] == ["starting"] * 3
    actuator.publish(pool, 30, len(workers))  # CloudWatch failing is logged, not raised
    # The controller sees 3 workers starting: a demand of 3 launches nothing more.
    from tide_fleet.infra.fleet.autoscale import PoolObservation, WorkerView

    views = [WorkerView(w.worker_id, w.state) for w in workers]
    # Demand for 5 (15,000 tokens at 100 tok/s within the 30 s target): 2 more, so the
    # group goes to 5, not to 3 + 5 because only one instance was listed.
    obs = PoolObservation(0.0, 30, 15_000, 0.0, 0.0, 100.0, views)
    d = decide(pool, obs, PoolState(), fleet.controller)
    assert (d.action, d.current, d.desired) == ("scale_out", 3, 5)
    actuator.launch(pool, d.desired - d.current)
    assert asg.desired == 5
    # Draining capacity that was never launched just asks for one fewer.
    actuator.drain(pool, "pending-0")
    assert asg.calls[-1] == asg.desired


def test_an_instance_with_too_few_gpus_for_its_pool_is_reported_once(redis_client, caplog):
    """A group whose instance type disagrees with fleet.toml's gpus_per_worker (the fleet file
    itself refuses such a type): named once, scaling goes on."""
    fleet = parse_fleet({"pools": {"gpu": {"buckets": ["short", "medium", "long"],
                                           "instance_types": ["g6.12xlarge"],
                                           "gpus_per_worker": 4}}})  # fmt: skip
    pool = fleet.pools["gpu"]
    asg = _FakeGroup(desired=2, instances=["i-1", "i-2"], instance_type="g6.xlarge")
    actuator = AwsActuator(fleet, redis_client, autoscaling=asg, cloudwatch=_BrokenCloudWatch())
    with caplog.at_level("ERROR", logger="tide.controller"):
        actuator.list_workers(pool)
        actuator.list_workers(pool)
    (record,) = [r.getMessage() for r in caplog.records if "GPU" in r.getMessage()]
    assert record.startswith("pool gpu: instance i-1 is a g6.xlarge with 1 GPU(s) (NVIDIA L4), ")
    assert "but a worker takes 4 (gpus_per_worker)" in record
    caplog.clear()
    asg.instance_type = "g6.12xlarge"  # the group's own type: nothing to say
    with caplog.at_level("ERROR", logger="tide.controller"):
        AwsActuator(
            fleet, redis_client, autoscaling=asg, cloudwatch=_BrokenCloudWatch()
        ).list_workers(pool)
    assert not caplog.records
