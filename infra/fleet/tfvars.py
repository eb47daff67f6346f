"""Render ``terraform.tfvars.json`` for ``terraform/examples/two_pools`` from ``fleet.toml``.

The fleet file stays the one declaration of pools: Terraform creates one Auto Scaling group
per ``[pools.NAME]`` (named ``<name_prefix>-<NAME>``, as the controller's AWS actuator
expects), and the controller host receives the same file. Torch-free.

Checks here mirror the modules' variable validations, so a fleet that renders is one
Terraform accepts, and the error names the fleet field rather than a module variable.
"""

from __future__ import annotations

import json
import math
import re
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
    "target_tracking",
    "target_backlog_per_instance",
)


def render_tfvars(fleet: FleetConfig, fleet_toml: str) -> dict[str, Any]:
    """The example's variables for this fleet; ``fleet_toml`` is the file's text."""
    problems = _check_aws(fleet)
    pools: dict[str, Any] = {}
    for name, pool in fleet.pools.items():
        problems += _check_pool(name, pool)
        pools[name] = pool_vars(pool)
    if problems:
        raise ValueError("fleet config cannot be deployed with Terraform: " + "; ".join(problems))
    aws = fleet.aws
    return {
        "region": aws.region,
        "name_prefix": aws.name_prefix,
        "ami_id": aws.ami_id,
        "subnet_ids": list(aws.subnet_ids),
        "cloudwatch_namespace": aws.cloudwatch_namespace,
        "tide_package": aws.tide_package,
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
    if not aws.tide_package or "'" in aws.tide_package:
        problems.append("aws.tide_package: a non-empty pip requirement without single quotes")
    return problems


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
    return json.dumps(render_tfvars(fleet, path.read_text()), indent=2) + "\n"
