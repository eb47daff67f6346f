"""Terraform: fmt, init from a local provider mirror (no downloads), validate, and
plan/apply/destroy of terraform/examples/two_pools against a moto server on loopback, fed by
the tfvars `tide infra tfvars` renders.

Skips, saying why, when the terraform binary or a mirror holding
registry.terraform.io/hashicorp/aws is absent. Set TIDE_TF_PLUGIN_MIRROR to the mirror
folder (the one holding registry.terraform.io) to skip the search.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import ROOT
from tests.infra.fleet.test_aws import run_burst
from tests.infra.fleet.wheel_files import WHEEL_NAME, example_fleet
from tests.terraform.apply_checks import (
    REGION,
    aws,
    check_control_plane,
    check_pools,
    check_tide_wheel,
)
from tide_fleet.infra.cli.main import main
from tide_fleet.infra.fleet.tfvars import render_file

TF_SOURCE = ROOT / "terraform"
CONFIG_DIRS = ("modules/worker_pool", "modules/control_plane", "examples/two_pools")
EXAMPLE = "examples/two_pools"
AWS_PROVIDER = Path("registry.terraform.io/hashicorp/aws")
MIRROR_ROOTS = (
    "/opt/tf-plugins",
    "~/.terraform.d/plugins",
    "~/.local/share/terraform/plugins",
    "/usr/local/share/terraform/plugins",
    "/usr/share/terraform/plugins",
    "/opt",
    "/usr/local/share",
    "/usr/share",
)
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_EC2_METADATA_DISABLED": "true",
}
# The example fleet, plus a warm pool, a target-tracking policy and workers of two GPUs on
# the big pool, so the apply exercises them.
BIG_EXTRAS = (
    "warm_pool_size = 1\ntarget_tracking = true\ntarget_backlog_per_instance = 3\n"
    "gpus_per_worker = 2\n"
)


def find_mirror() -> Path | None:
    """The folder holding registry.terraform.io/hashicorp/aws: $TIDE_TF_PLUGIN_MIRROR, else
    a few usual roots and up to two levels below them."""
    if env := os.environ.get("TIDE_TF_PLUGIN_MIRROR"):
        return Path(env) if (Path(env) / AWS_PROVIDER).is_dir() else None
    for root in (Path(r).expanduser() for r in MIRROR_ROOTS):
        if (root / AWS_PROVIDER).is_dir():
            return root
        for pattern in (f"*/{AWS_PROVIDER}", f"*/*/{AWS_PROVIDER}"):
            for hit in sorted(root.glob(pattern)):
                return hit.parents[2]
    return None


def run_tf(
    args: list[str], cwd: Path, env: dict[str, str], timeout: float = 300, stderr: bool = False
) -> str:
    """Standard output (and error, if asked) of a terraform command that must succeed."""
    proc = subprocess.run(
        ["terraform", *args, "-no-color"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        output = f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        pytest.fail(f"terraform {' '.join(args)} failed in {cwd}:\n{output}")
    return proc.stdout + (proc.stderr if stderr else "")


@pytest.fixture(scope="module")
def terraform() -> str:
    exe = shutil.which("terraform")
    if exe is None:
        pytest.skip("terraform is not installed (not on PATH)")
    return exe


@pytest.fixture(scope="module")
def tf_env(terraform: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    mirror = find_mirror()
    if mirror is None:
        pytest.skip(
            f"no Terraform provider mirror holding {AWS_PROVIDER} (set TIDE_TF_PLUGIN_MIRROR)"
        )
    config = tmp_path_factory.mktemp("tf-cli") / "terraform.rc"
    config.write_text(
        "provider_installation {\n"
        f"  filesystem_mirror {{\n    path    = {json.dumps(str(mirror))}\n"
        '    include = ["registry.terraform.io/hashicorp/aws"]\n  }\n'
        '  direct {\n    exclude = ["registry.terraform.io/hashicorp/aws"]\n  }\n}\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "AWS_"))}
    env.update(FAKE_AWS, TF_CLI_CONFIG_FILE=str(config), TF_IN_AUTOMATION="1", TF_INPUT="0")
    env["CHECKPOINT_DISABLE"] = "1"  # no version check over the network
    return env


@pytest.fixture(scope="module")
def tf_root(tf_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of terraform/ with every configuration initialised once, from the mirror."""
    root = tmp_path_factory.mktemp("tf") / "terraform"
    shutil.copytree(
        TF_SOURCE,
        root,
        ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*", "terraform.tfvars.json"),
    )
    for d in CONFIG_DIRS:
        run_tf(["init", "-input=false"], root / d, tf_env, timeout=180)
    return root


def test_fmt(terraform: str) -> None:
    proc = subprocess.run(
        ["terraform", "fmt", "-check", "-recursive", "-diff", "-no-color", str(TF_SOURCE)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CHECKPOINT_DISABLE": "1"},
    )
    assert proc.returncode == 0, f"run `terraform fmt -recursive terraform/`:\n{proc.stdout}"


def test_init_installs_the_provider_from_the_mirror(tf_root: Path) -> None:
    for d in CONFIG_DIRS:
        installed = tf_root / d / ".terraform/providers" / AWS_PROVIDER
        versions = [p.name for p in installed.iterdir()]
        assert versions and all(v.startswith("5.") for v in versions), (d, versions)


@pytest.mark.parametrize("config", CONFIG_DIRS)
def test_validate(tf_root: Path, tf_env: dict[str, str], config: str) -> None:
    result = json.loads(run_tf(["validate", "-json"], tf_root / config, tf_env))
    assert result["valid"], result["diagnostics"]
    assert result["warning_count"] == 0, result["diagnostics"]


# --- against moto ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tfvars(tf_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The rendered variables, written where the example auto-loads them (the fleet file
    beside a stand-in wheel)."""
    fleet = example_fleet(tmp_path_factory.mktemp("fleet"), BIG_EXTRAS)
    out = tf_root / EXAMPLE / "terraform.tfvars.json"
    assert main(["infra", "tfvars", "--fleet", str(fleet), "-o", str(out)]) == 0
    data: dict[str, Any] = json.loads(out.read_text())
    assert data == json.loads(render_file(fleet))
    return data


def moto_vars(url: str, *extra: str) -> list[str]:
    return ["-var", f"aws_endpoint_url={url}", "-var", "aws_skip_checks=true", *extra]


def planned(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Planned resource values by address, across modules."""
    out: dict[str, dict[str, Any]] = {}
    stack = [plan["planned_values"]["root_module"]]
    while stack:
        module = stack.pop()
        out.update({r["address"]: r.get("values", {}) for r in module.get("resources", [])})
        stack += module.get("child_modules", [])
    return out


@pytest.mark.slow
def test_plan_elasticache_fleet(
    tf_root: Path, tf_env: dict[str, str], moto_url: str, tfvars: dict[str, Any]
) -> None:
    """The default Redis backend (ElastiCache, which moto cannot create) plans as intended."""
    cwd = tf_root / EXAMPLE
    log = run_tf(["plan", "-input=false", "-out=elasticache.tfplan", *moto_vars(moto_url)],
                 cwd, tf_env, timeout=300, stderr=True)  # fmt: skip
    assert "undeclared variable" not in log  # every rendered key is a variable
    plan = json.loads(run_tf(["show", "-json", "elasticache.tfplan"], cwd, tf_env))
    res = planned(plan)
    rg = res["module.control_plane.aws_elasticache_replication_group.redis[0]"]
    assert rg["num_cache_clusters"] == 2 and rg["automatic_failover_enabled"]
    assert rg["multi_az_enabled"] and rg["transit_encryption_enabled"]
    assert rg["at_rest_encryption_enabled"]
    params = res["module.control_plane.aws_elasticache_parameter_group.redis[0]"]["parameter"]
    assert {"name": "maxmemory-policy", "value": "noeviction"} in params
    assert "module.control_plane.aws_instance.redis[0]" not in res
    versioning = res["module.control_plane.aws_s3_bucket_versioning.files"]
    assert versioning["versioning_configuration"][0]["status"] == "Enabled"
    block = res["module.control_plane.aws_s3_bucket_public_access_block.files"]
    assert all(block[k] for k in ("block_public_acls", "block_public_policy",
                                  "ignore_public_acls", "restrict_public_buckets"))  # fmt: skip
    (rule,) = res["module.control_plane.aws_s3_bucket_lifecycle_configuration.files[0]"]["rule"]
    assert rule["status"] == "Enabled"
    assert rule["noncurrent_version_expiration"][0]["noncurrent_days"] == 30
    assert rule["abort_incomplete_multipart_upload"][0]["days_after_initiation"] == 7
    for name, pool in tfvars["pools"].items():
        hook = res[f'module.pool["{name}"].aws_autoscaling_lifecycle_hook.drain']
        assert hook["heartbeat_timeout"] == pool["drain_timeout_s"]
        assert hook["lifecycle_transition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
    policy = res['module.pool["big"].aws_autoscaling_policy.backlog[0]']
    spec = policy["target_tracking_configuration"][0]
    metric = spec["customized_metric_specification"][0]
    assert (metric["metric_name"], metric["namespace"]) == ("BacklogPerInstance", "Tide")
    assert metric["metric_dimension"] == [{"name": "Pool", "value": "big"}]
    assert spec["target_value"] == 3
    assert 'module.pool["small"].aws_autoscaling_policy.backlog[0]' not in res
    wheel = res["aws_s3_object.tide_wheel"]
    sha = tfvars["tide_wheel_sha256"]
    assert wheel["key"] == f"releases/{sha}/{WHEEL_NAME}" and wheel["source_hash"] == sha
    assert wheel["source"] == tfvars["tide_wheel"]


@pytest.mark.slow
def test_warm_pool_with_spot_too_few_gpus_and_negative_days_are_refused(
    tf_root: Path, tf_env: dict[str, str], moto_url: str, tfvars: dict[str, Any]
) -> None:
    """The modules' own checks, for hand-written tfvars (the fleet config refuses a warm pool
    with spot, and instance types with too few GPUs, too): one plan reports them all."""
    cwd = tf_root / EXAMPLE
    bad = json.loads(json.dumps({"pools": tfvars["pools"]}))
    bad["pools"]["small"]["warm_pool_size"] = 1
    bad["pools"]["small"]["instance_types"] = ["g6.xlarge", "g5.12xlarge", "x9.huge"]
    bad["pools"]["small"]["gpus_per_worker"] = 2
    (cwd / "bad.tfvars.json").write_text(json.dumps(bad))
    proc = subprocess.run(
        ["terraform", "plan", "-input=false", "-no-color", "-var-file=bad.tfvars.json",
         *moto_vars(moto_url, "-var", "noncurrent_version_days=-1")],
        cwd=cwd, env=tf_env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0
    errors = " ".join(proc.stderr.split())
    assert "pool small: a warm pool needs on-demand capacity of one instance type" in errors
    assert ("pool small: a worker takes 2 GPUs (gpus_per_worker), more than instance types "
            "g6.xlarge (1 GPU), x9.huge (GPU count unknown) hold") in errors  # fmt: skip
    assert "noncurrent_version_days must be a whole number of days, 0 or more" in errors


@pytest.mark.slow
def test_a_wheel_rebuilt_after_tfvars_is_refused(
    tf_root: Path, tf_env: dict[str, str], moto_url: str, tfvars: dict[str, Any]
) -> None:
    """The file at tide_wheel must still be the build whose hash the hosts will check."""
    other = "0" * 64
    proc = subprocess.run(
        ["terraform", "plan", "-input=false", "-no-color",
         *moto_vars(moto_url, "-var", f"tide_wheel_sha256={other}")],
        cwd=tf_root / EXAMPLE, env=tf_env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0
    errors = " ".join(proc.stderr.split())
    assert "is not the build `tide infra tfvars` hashed (tide_wheel_sha256)" in errors, errors


@pytest.mark.slow
def test_apply_and_destroy(
    tf_root: Path,
    tf_env: dict[str, str],
    moto_url: str,
    tfvars: dict[str, Any],
    tmp_path: Path,
    tiny_path: Path,
) -> None:
    cwd = tf_root / EXAMPLE
    # No lifecycle rule: the AWS provider waits about a minute for moto to report one (the
    # plan test checks the rule).
    args = moto_vars(
        moto_url, "-var", "redis_backend=instance", "-var", "bucket_force_destroy=true",
        "-var", "noncurrent_version_days=0",
    )  # fmt: skip
    # moto applies the bucket's TLS-only Deny to every object request (it takes the unmet
    # aws:SecureTransport condition for a match), so the wheel goes up before that policy
    # exists, and the policy is removed before anything reads the object.
    upload = ["-target=aws_s3_object.tide_wheel"]
    run_tf(["apply", "-input=false", "-auto-approve", *upload, *args], cwd, tf_env, timeout=420)
    run_tf(["apply", "-input=false", "-auto-approve", *args], cwd, tf_env, timeout=420)
    try:
        outputs = json.loads(run_tf(["output", "-json"], cwd, tf_env))
        aws("s3", moto_url).delete_bucket_policy(Bucket=outputs["bucket_name"]["value"])
        # Terraform read back exactly what was rendered: same shape, no attribute dropped.
        assert outputs["pools"]["value"] == tfvars["pools"]
        prefix = tfvars["name_prefix"]
        assert outputs["asg_names"]["value"] == {p: f"{prefix}-{p}" for p in tfvars["pools"]}
        check_pools(moto_url, tfvars)
        check_control_plane(moto_url, tfvars, outputs)
        check_tide_wheel(moto_url, tfvars, outputs)
        with pytest.raises(ClientError, match="NoSuchLifecycleConfiguration"):
            aws("s3", moto_url).get_bucket_lifecycle_configuration(
                Bucket=outputs["bucket_name"]["value"]
            )
        # The controller's AWS actuator on the group Terraform made: a burst, 0 -> 2 -> 0.
        small = tfvars["pools"]["small"]
        run_burst(moto_url, prefix, "small", small["buckets"], tmp_path, tiny_path)
    finally:
        run_tf(["destroy", "-input=false", "-auto-approve", *args], cwd, tf_env, timeout=420)
    names = [f"{prefix}-{p}" for p in tfvars["pools"]]
    left = aws("autoscaling", moto_url).describe_auto_scaling_groups(AutoScalingGroupNames=names)
    assert left["AutoScalingGroups"] == []
    assert aws("s3", moto_url).list_buckets()["Buckets"] == []
