"""What a Terraform apply against moto left in AWS, read back with boto3: the pools' Auto
Scaling groups and launch templates, the control plane's hosts, bucket and roles, and the
Tide wheel every host installs (tests/terraform/test_terraform.py applies, then calls these)."""

from __future__ import annotations

import base64
import hashlib
import subprocess
from pathlib import Path
from typing import Any

import boto3

from tests.infra.fleet.wheel_files import WHEEL_NAME
from tests.terraform.test_user_data import assert_installs_the_deployed_build

REGION = "us-east-1"


def aws(service: str, url: str) -> Any:
    keys = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    return boto3.client(service, region_name=REGION, endpoint_url=url, **keys)


def check_pools(url: str, tfvars: dict[str, Any]) -> None:
    asg, ec2 = aws("autoscaling", url), aws("ec2", url)
    prefix = tfvars["name_prefix"]
    for name, pool in tfvars["pools"].items():
        group_name = f"{prefix}-{name}"
        (group,) = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group_name])[
            "AutoScalingGroups"
        ]
        assert (group["MinSize"], group["MaxSize"]) == (0, pool["max_size"])
        tags = {t["Key"]: t["Value"] for t in group["Tags"]}
        assert tags["Pool"] == name and tags["Name"] == f"{group_name}-worker"
        if len(pool["instance_types"]) > 1 or pool["spot"]:
            mixed = group["MixedInstancesPolicy"]
            spec = mixed["LaunchTemplate"]["LaunchTemplateSpecification"]
            types = [o["InstanceType"] for o in mixed["LaunchTemplate"]["Overrides"]]
            assert types == pool["instance_types"]
            dist = mixed["InstancesDistribution"]
            assert dist["SpotAllocationStrategy"] == "capacity-optimized"
            assert dist["OnDemandBaseCapacity"] == pool["on_demand_base"]
            assert dist["OnDemandPercentageAboveBaseCapacity"] == (0 if pool["spot"] else 100)
        else:
            spec = group["LaunchTemplate"]
        assert spec["LaunchTemplateName"] == group_name
        version = ec2.describe_launch_template_versions(LaunchTemplateName=group_name)
        data = version["LaunchTemplateVersions"][0]["LaunchTemplateData"]
        if "MixedInstancesPolicy" not in group:
            assert data["InstanceType"] == pool["instance_types"][0]
        user_data = base64.b64decode(data["UserData"]).decode()
        command = f"tide worker --pool {name} --buckets {','.join(pool['buckets'])}"
        assert command in user_data and "REDIS_URL='redis://" in user_data
        assert_tensor_parallel_size(user_data, pool["gpus_per_worker"])
        assert_bash_syntax(user_data)
        (hook,) = asg.describe_lifecycle_hooks(AutoScalingGroupName=group_name)["LifecycleHooks"]
        assert hook["LifecycleHookName"] == "tide-drain"
        assert hook["LifecycleTransition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
        assert hook["HeartbeatTimeout"] == pool["drain_timeout_s"]
        warm = asg.describe_warm_pool(AutoScalingGroupName=group_name).get("WarmPoolConfiguration")
        if pool["warm_pool_size"]:
            assert warm["MinSize"] == pool["warm_pool_size"] and warm["PoolState"] == "Stopped"
        else:
            assert not warm
        policies = asg.describe_policies(AutoScalingGroupName=group_name)["ScalingPolicies"]
        assert len(policies) == int(pool["target_tracking"])


def assert_tensor_parallel_size(user_data: str, gpus_per_worker: int) -> None:
    """The worker unit runs `tide worker` with the pool's GPUs per worker as its TP size."""
    (line,) = [x for x in user_data.splitlines() if x.startswith("ExecStart=") and " worker " in x]
    assert f" --tensor-parallel-size {gpus_per_worker} " in f"{line} ", line


def check_control_plane(url: str, tfvars: dict[str, Any], outputs: dict[str, Any]) -> None:
    ec2, s3, iam = aws("ec2", url), aws("s3", url), aws("iam", url)
    bucket = outputs["bucket_name"]["value"]
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    block = s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"]
    assert all(block.values())
    for name in tfvars["pools"]:
        role = f"{tfvars['name_prefix']}-{name}-worker"
        profile = iam.get_instance_profile(InstanceProfileName=role)["InstanceProfile"]
        assert [r["RoleName"] for r in profile["Roles"]] == [role]
    running = ec2.describe_instances(Filters=[{"Name": "instance-state-name",
                                               "Values": ["running", "pending"]}])  # fmt: skip
    roles = {}
    for reservation in running["Reservations"]:
        for inst in reservation["Instances"]:
            tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
            roles[tags.get("Role")] = inst
    assert {"gateway", "controller", "redis"} <= set(roles)
    # The controller host carries the fleet file itself, base64 in its user data.
    versions = ec2.describe_launch_template_versions(
        LaunchTemplateName=f"{tfvars['name_prefix']}-controller"
    )
    user_data = base64.b64decode(
        versions["LaunchTemplateVersions"][0]["LaunchTemplateData"]["UserData"]
    ).decode()
    assert_bash_syntax(user_data)
    fleet_b64 = base64.b64encode(tfvars["fleet_toml"].encode()).decode()
    assert f"echo '{fleet_b64}' | base64 -d >'/etc/tide/fleet.toml'" in user_data
    assert f"REDIS_URL='redis://{roles['redis']['PrivateIpAddress']}:6379/0'" in user_data


def assert_bash_syntax(script: str) -> None:
    proc = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert proc.returncode == 0, f"user data is not valid bash: {proc.stderr}"


def check_tide_wheel(url: str, tfvars: dict[str, Any], outputs: dict[str, Any]) -> None:
    """The wheel is in the bucket under its hash, every host's user data installs that object
    checked by the hash, and every host's role may read it."""
    ec2, s3, iam = aws("ec2", url), aws("s3", url), aws("iam", url)
    bucket, sha = outputs["bucket_name"]["value"], tfvars["tide_wheel_sha256"]
    key = f"releases/{sha}/{WHEEL_NAME}"
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert body == Path(tfvars["tide_wheel"]).read_bytes()
    assert hashlib.sha256(body).hexdigest() == sha
    uri, arn = f"s3://{bucket}/{key}", f"arn:aws:s3:::{bucket}/{key}"
    prefix = tfvars["name_prefix"]
    hosts = {f"{prefix}-{p}": f"{prefix}-{p}-worker" for p in tfvars["pools"]}
    hosts |= {f"{prefix}-{h}": f"{prefix}-{h}" for h in ("gateway", "controller")}
    for template, role in hosts.items():
        versions = ec2.describe_launch_template_versions(LaunchTemplateName=template)
        data = versions["LaunchTemplateVersions"][0]["LaunchTemplateData"]
        assert_installs_the_deployed_build(base64.b64decode(data["UserData"]).decode(), sha, uri)
        (policy_name,) = iam.list_role_policies(RoleName=role)["PolicyNames"]
        document = iam.get_role_policy(RoleName=role, PolicyName=policy_name)["PolicyDocument"]
        statements = {st.get("Sid"): st for st in document["Statement"]}
        read = statements["ReadTideWheel"]
        assert (read["Action"], read["Resource"]) == ("s3:GetObject", arn), role
