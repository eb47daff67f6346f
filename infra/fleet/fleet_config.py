"""``fleet.toml``: the one declaration of worker pools, read by the controller, the simulator
and ``tide infra tfvars`` (which renders Terraform's variables from it).

Torch-free. Example (the seed's heterogeneous fleet, shipped as ``fleet.example.toml``)::

    [controller]
    poll_interval_s = 5

    [pools.small]
    buckets = ["short"]                 # served in this order of preference
    device = "l4"
    instance_types = ["g6.xlarge", "g5.xlarge"]
    max_workers = 8

    [pools.big]
    buckets = ["medium", "long", "short"]   # steals short jobs only when idle
    device = "a100-80gb"
    instance_types = ["p4de.24xlarge"]

Each bucket has one *home* pool, the pool that lists it earliest in its preference order
(file order breaks ties): the controller sizes that pool for the bucket's backlog. Other
pools that list the bucket only help drain it when their own buckets are empty.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from infra.plan.devices import get_device
from infra.wire.protocol import BUCKETS

DEFAULT_FLEET_FILE = "fleet.toml"


class PoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = ""
    buckets: list[str] = Field(min_length=1, description="buckets served, in preference order")
    device: str = Field("cpu", description="device kind (infra/plan/devices.py): planner, MBU")
    instance_types: list[str] = Field(
        default_factory=list, description="EC2 types, first preferred"
    )
    min_workers: int = Field(0, ge=0)
    max_workers: int = Field(4, ge=0)
    target_wait_s: float = Field(30.0, gt=0, description="SLO: queue wait to aim under")
    idle_s: float = Field(300.0, ge=0, description="idle time before scaling to min_workers")
    cold_start_s: float = Field(120.0, ge=0, description="expected launch-to-ready time")
    drain_timeout_s: float = Field(300.0, gt=0, description="max wait for a draining worker")
    tokens_per_s: float | None = Field(
        None, gt=0, description="service rate per worker before measurements exist"
    )
    model: str | None = Field(None, description="model path or s3:// URI (default: settings)")
    worker_args: list[str] = Field(default_factory=list, description="extra `tide worker` flags")
    # AWS only.
    spot: bool = Field(False, description="capacity-optimized spot through a mixed policy")
    on_demand_base: int = Field(0, ge=0, description="on-demand instances before spot")
    warm_pool_size: int = Field(0, ge=0, description="stopped pre-initialised instances")
    target_tracking: bool = Field(False, description="also attach a BacklogPerInstance policy")
    target_backlog_per_instance: float = Field(
        4.0, gt=0, description="target tracking: queued home-bucket jobs per instance"
    )

    @field_validator("buckets")
    @classmethod
    def _known_buckets(cls, v: list[str]) -> list[str]:
        for b in v:
            if b not in BUCKETS:
                raise ValueError(f"unknown bucket {b!r}; buckets are {', '.join(BUCKETS)}")
        if len(set(v)) != len(v):
            raise ValueError(f"buckets listed twice: {v}")
        return v

    @field_validator("device")
    @classmethod
    def _known_device(cls, v: str) -> str:
        return get_device(v).name

    @model_validator(mode="after")
    def _sizes(self) -> PoolConfig:
        if self.min_workers > self.max_workers:
            raise ValueError(
                f"min_workers ({self.min_workers}) exceeds max_workers ({self.max_workers})"
            )
        if self.warm_pool_size and (self.spot or len(self.instance_types) > 1):
            raise ValueError("warm_pool_size needs on-demand capacity of one instance type")
        return self


class ControllerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    poll_interval_s: float = Field(5.0, gt=0)
    scale_out_cooldown_s: float = Field(0.0, ge=0, description="between scale-outs of a pool")
    scale_in_cooldown_s: float = Field(
        60.0, ge=0, description="after any change, before a scale-in"
    )
    scale_in_hysteresis: float = Field(
        0.85, gt=0, le=1, description="scale in only when demand < this x (current - 1)"
    )
    actuator: str = Field("local", description="local | aws")


class AwsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    region: str = "us-east-1"
    name_prefix: str = "tide"
    ami_id: str = "ami-00000000000000000"
    subnet_ids: list[str] = Field(default_factory=list)
    cloudwatch_namespace: str = "Tide"
    tide_package: str = Field("tide", description="pip requirement the user data installs")


class FleetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    controller: ControllerConfig = Field(default_factory=ControllerConfig)  # type: ignore[arg-type]
    aws: AwsConfig = Field(default_factory=AwsConfig)  # type: ignore[arg-type]
    pools: dict[str, PoolConfig]

    @model_validator(mode="after")
    def _names_and_coverage(self) -> FleetConfig:
        if not self.pools:
            raise ValueError("pools: declare at least one pool")
        for name, pool in self.pools.items():
            if not name.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"pools.{name}: names are letters, digits, '-' and '_'")
            pool.name = name
        served = {b for p in self.pools.values() for b in p.buckets}
        missing = [b for b in BUCKETS if b not in served]
        if missing:
            raise ValueError(f"no pool serves bucket(s) {', '.join(missing)}")
        return self

    def home_pool(self, bucket: str) -> PoolConfig:
        """The pool sized for this bucket's backlog: the one preferring it most."""
        best = min(
            (p for p in self.pools.values() if bucket in p.buckets),
            key=lambda p: p.buckets.index(bucket),
        )
        return best

    def home_buckets(self, pool: str) -> list[str]:
        return [b for b in BUCKETS if self.home_pool(b).name == pool]


def parse_fleet(data: dict[str, Any], source: str = "fleet config") -> FleetConfig:
    try:
        return FleetConfig.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in err['loc']) or '(top)'}: {err['msg']}" for err in e.errors()
        )
        raise ValueError(f"{source}: {problems}") from None


def load_fleet(path: str | Path) -> FleetConfig:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"fleet config {p} not found (copy fleet.example.toml to start)")
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{p}: not valid TOML: {e}") from None
    return parse_fleet(data, str(p))


def local_default_fleet(min_workers: int = 1, max_workers: int | None = None) -> FleetConfig:
    """What `tide up` runs without a fleet file: one CPU pool serving every bucket
    (min = max unless max_workers is given); bad sizes raise ValueError naming them."""
    return parse_fleet(
        {
            "controller": {"poll_interval_s": 1.0, "scale_in_cooldown_s": 10.0},
            "pools": {
                "default": {
                    "buckets": list(BUCKETS),
                    "device": "cpu",
                    "min_workers": min_workers,
                    "max_workers": max(min_workers, 1) if max_workers is None else max_workers,
                    "idle_s": 60.0,
                    "cold_start_s": 5.0,
                }
            },
        }
    )
