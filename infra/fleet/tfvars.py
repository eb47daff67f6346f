"""Render ``terraform.tfvars.json`` for ``terraform/examples/two_pools`` from ``fleet.toml``.

The fleet file stays the one declaration of pools: Terraform creates one Auto Scaling group
per ``[pools.NAME]`` (named ``<name_prefix>-<NAME>``, as the controller's AWS actuator
expects), and the controller host receives the same file. Hosts install the wheel
``[aws] tide_wheel`` names, never a package looked up by name: the tfvars carry its absolute
path (Terraform uploads it) and its SHA-256 (every host checks the download against it).
Torch-free.

Checks here mirror the modules' variable validations, so a fleet that renders is one
Terraform accepts, and the error names the fleet field rather than a module variable.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tide_fleet.infra.fleet.fleet_config import FleetConfig, PoolConfig, load_fleet

# AWS's limits, and what user data can carry unquoted (see terraform/modules/worker_pool).
NAME_PREFIX_RE = re.compile(r"^[a-z][a-z0-9-]{0,19}$")
POOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
AMI_RE = re.compile(r"^ami-[0-9a-f]{8,17}$")
SUBNET_RE = re.compile(r"^subnet-[0-9a-f]{8,17}$")
REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
MODEL_RE = re.compile(r"^[A-Za-z0-9_.,:=/+@-]*$")
WORKER_ARG_RE = re.compile(r"^[A-Za-z0-9_.,:=/+-]+$")
MAX_INSTANCE_TYPES = 20  # overrides in a mixed instances policy
DRAIN_TIMEOUT_RANGE = (30, 7200)  # a lifecycle hook's heartbeat timeout, seconds
# NAME-VERSION[-BUILD]-PY-ABI-PLATFORM.whl, of characters an S3 key and user data carry as-is.
WHEEL_RE = re.compile(
    r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[A-Za-z0-9_.+]+)(-\d[A-Za-z0-9_.]*)?"
    r"-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+\.whl$"
)
DISTRIBUTION = "tide_fleet"  # pyproject's tide-fleet, normalised as wheel names spell it
BUILD_WHEEL = "build it with `pip wheel --no-deps -w dist .` in Tide's checkout"

# The attributes of each entry of the example's `pools` variable, in this order.
POOL_KEYS = (
    "buckets",
    "device",
    "instance_types",
    "min_size",
    "max_size",
    "spot",
    "on_demand_base",
    "warm_pool_size",
    "drain_timeout_s",
    "model",
    "worker_args",
    "gpus_per_worker",
    "target_tracking",
    "target_backlog_per_instance",
)


@dataclass(frozen=True)
class Wheel:
    path: Path  # absolute: Terraform reads it from the example's folder
    sha256: str


def render_tfvars(fleet: FleetConfig, fleet_toml: str, fleet_dir: Path) -> dict[str, Any]:
    """The example's variables for this fleet; ``fleet_toml`` is the file's text and
    ``fleet_dir`` its folder (``[aws] tide_wheel`` is relative to it)."""
    problems = _check_aws(fleet)
    wheel = None
    try:
        wheel = find_wheel(fleet.aws.tide_wheel, fleet_dir)
    except ValueError as e:
        problems.append(str(e))
    pools: dict[str, Any] = {}
    for name, pool in fleet.pools.items():
        problems += _check_pool(name, pool)
        pools[name] = pool_vars(pool)
    if problems or wheel is None:
        raise ValueError("fleet config cannot be deployed with Terraform: " + "; ".join(problems))
    aws = fleet.aws
    return {
        "region": aws.region,
        "name_prefix": aws.name_prefix,
        "ami_id": aws.ami_id,
        "subnet_ids": list(aws.subnet_ids),
        "cloudwatch_namespace": aws.cloudwatch_namespace,
        "tide_wheel": str(wheel.path),
        "tide_wheel_sha256": wheel.sha256,
        "fleet_toml": fleet_toml,
        "pools": pools,
    }


def pool_vars(pool: PoolConfig) -> dict[str, Any]:
    """One entry of the `pools` map: fleet names translated to the worker_pool module's."""
    values = {
        "buckets": list(pool.buckets),
        "device": pool.device,
        "instance_types": list(pool.instance_types),
        "min_size": pool.min_workers,
        "max_size": pool.max_workers,
        "spot": pool.spot,
        "on_demand_base": pool.on_demand_base,
        "warm_pool_size": pool.warm_pool_size,
        "drain_timeout_s": math.ceil(pool.drain_timeout_s),
        "model": pool.model or "",
        "worker_args": list(pool.worker_args),
        "gpus_per_worker": pool.gpus_per_worker,
        "target_tracking": pool.target_tracking,
        "target_backlog_per_instance": pool.target_backlog_per_instance,
    }
    return {k: values[k] for k in POOL_KEYS}


def _check_aws(fleet: FleetConfig) -> list[str]:
    aws, problems = fleet.aws, []
    if not NAME_PREFIX_RE.match(aws.name_prefix):
        problems.append(
            f"aws.name_prefix: {aws.name_prefix!r} must be 1-20 lowercase letters, digits or '-', "
            "starting with a letter (it names S3 buckets and IAM roles)"
        )
    if not AMI_RE.match(aws.ami_id):
        problems.append(f"aws.ami_id: {aws.ami_id!r} is not an AMI id like ami-0123456789abcdef0")
    if not REGION_RE.match(aws.region):
        problems.append(f"aws.region: {aws.region!r} is not an AWS region like us-east-1")
    for i, subnet in enumerate(aws.subnet_ids):
        if not SUBNET_RE.match(subnet):
            problems.append(
                f"aws.subnet_ids[{i}]: {subnet!r} is not a subnet id like subnet-0abc1234"
            )
    return problems


def find_wheel(name: str | None, fleet_dir: Path) -> Wheel:
    """The wheel ``[aws] tide_wheel`` names, checked to be one of Tide's distribution, with its
    SHA-256; ValueError naming the field otherwise."""
    if not name:
        raise ValueError(
            f"aws.tide_wheel: not set; the hosts install Tide from this wheel ({BUILD_WHEEL}, "
            'then set tide_wheel = "dist/tide_fleet-<version>-py3-none-any.whl")'
        )
    path = (fleet_dir / Path(name).expanduser()).resolve()
    if not path.is_file():
        raise ValueError(
            f"aws.tide_wheel: {path} not found (a path relative to the fleet file's folder; "
            f"{BUILD_WHEEL})"
        )
    match = WHEEL_RE.match(path.name)
    if match is None:
        raise ValueError(
            f"aws.tide_wheel: {path.name!r} is not a wheel file name "
            "(NAME-VERSION-PYTHON-ABI-PLATFORM.whl of letters, digits and _ . +)"
        )
    dist = re.sub(r"[-_.]+", "_", match["name"]).lower()
    if dist != DISTRIBUTION:
        raise ValueError(
            f"aws.tide_wheel: {path.name} is a wheel of {match['name']}, not of Tide's "
            f"distribution tide-fleet ({BUILD_WHEEL})"
        )
    metadata = f"{match['name']}-{match['version']}.dist-info/METADATA"
    try:
        with zipfile.ZipFile(path) as zf:
            text = zf.read(metadata).decode("utf-8", "replace")
    except (zipfile.BadZipFile, KeyError, OSError):
        raise ValueError(f"aws.tide_wheel: {path} is not a wheel (no {metadata})") from None
    names = re.findall(r"^Name:\s*(\S+)", text, re.M)
    if not names or re.sub(r"[-_.]+", "_", names[0]).lower() != DISTRIBUTION:
        raise ValueError(
            f"aws.tide_wheel: {path}'s metadata names {names[0] if names else 'no'} "
            "distribution, not tide-fleet"
        )
    with path.open("rb") as f:
        sha256 = hashlib.file_digest(f, "sha256").hexdigest()
    return Wheel(path, sha256)


def _check_pool(name: str, pool: PoolConfig) -> list[str]:
    where, problems = f"pools.{name}", []
    if not POOL_NAME_RE.match(name):
        problems.append(f"{where}: pool names are at most 32 characters on AWS")
    n_types = len(pool.instance_types)
    if not 1 <= n_types <= MAX_INSTANCE_TYPES:
        problems.append(
            f"{where}.instance_types: needs 1 to {MAX_INSTANCE_TYPES} EC2 instance types "
            f"(has {n_types})"
        )
    low, high = DRAIN_TIMEOUT_RANGE
    if not low <= pool.drain_timeout_s <= high:
        problems.append(
            f"{where}.drain_timeout_s: {pool.drain_timeout_s:g} is outside {low}-{high} s "
            "(the termination lifecycle hook's heartbeat timeout)"
        )
    if pool.spot and pool.on_demand_base > pool.max_workers:
        problems.append(
            f"{where}.on_demand_base: {pool.on_demand_base} exceeds "
            f"max_workers ({pool.max_workers})"
        )
    if pool.model and not MODEL_RE.match(pool.model):
        problems.append(f"{where}.model: {pool.model!r} may not contain spaces or quotes")
    for i, arg in enumerate(pool.worker_args):
        if not WORKER_ARG_RE.match(arg):
            problems.append(
                f"{where}.worker_args[{i}]: {arg!r} may hold only letters, digits "
                "and _ . , : = / + -"
            )
    return problems


def render_file(fleet_path: str | Path) -> str:
    """The tfvars JSON text for a fleet file (raises ValueError naming the bad field)."""
    path = Path(fleet_path)
    fleet = load_fleet(path)
    return json.dumps(render_tfvars(fleet, path.read_text(), path.parent), indent=2) + "\n"
