"""``fleet.toml``: the one declaration of worker pools, read by the controller, the simulator
and ``tide infra tfvars`` (which renders Terraform's variables from it).

Torch-free. Example (a heterogeneous fleet, shipped as ``fleet.example.toml``)::

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

Many models: each pool serves one model, named by ``served_name`` (what clients send as
``model``) with ``aliases``; pools without one serve a single model together, named by its
path (a pool's ``model``, else the settings'). The pools of one served name form that
model's fleet, and each model's buckets need a pool
(home pools are per model). ``default_model`` names the model a request without ``model``
gets (default: the first pool's). Per model, ``bucket_short_max``/``bucket_medium_max``
override the settings' thresholds::

    [pools.chat]
    model = "/models/llama-8b"
    served_name = "llama-8b"
    aliases = ["llama"]
    buckets = ["short", "medium", "long"]
    min_workers = 0

    [pools.tiny]
    model = "dummy:tiny"
    served_name = "tiny"
    buckets = ["short", "medium", "long"]
    bucket_short_max = 256
    min_workers = 0

A pool's ``lora`` table declares LoRA adapters on its model (infra/fleet/fleet_adapters.py);
its ``gpus_per_worker`` makes each worker a tensor-parallel engine on that many GPUs
(infra/fleet/pool_gpus.py).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tide_fleet.infra.fleet.fleet_adapters import check_lora_table, merge_lora
from tide_fleet.infra.fleet.pool_gpus import check_pool_gpus
from tide_fleet.infra.plan.devices import get_device
from tide_fleet.infra.wire.models import ModelCatalog, served
from tide_fleet.infra.wire.protocol import BUCKETS

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
    served_name: str | None = Field(
        None, min_length=1, description="the name clients use (needed for a second model)"
    )
    aliases: list[str] = Field(default_factory=list, description="other names clients may use")
    bucket_short_max: int | None = Field(None, gt=0, description="this model's short bucket")
    bucket_medium_max: int | None = Field(None, gt=0, description="this model's medium bucket")
    worker_args: list[str] = Field(default_factory=list, description="extra `tide worker` flags")
    gpus_per_worker: int = Field(1, ge=1, strict=True, description="its --tensor-parallel-size")
    lora: dict[str, str] = Field(
        default_factory=dict, description="LoRA adapters on its model: name -> folder or s3://"
    )
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

    @field_validator("lora")
    @classmethod
    def _lora_names(cls, v: dict[str, str]) -> dict[str, str]:
        return check_lora_table(v)

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
        check_pool_gpus(self.gpus_per_worker, self.worker_args, self.instance_types)
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
    tide_wheel: str | None = Field(None, description="the Tide wheel hosts install (tfvars)")

    @model_validator(mode="before")
    @classmethod
    def _no_package_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and "tide_package" in data:
            raise ValueError(
                "aws.tide_package: replaced by aws.tide_wheel, the path of the Tide wheel "
                "every host installs, from the fleet file's folder (build it with "
                '`pip wheel --no-deps -w dist .`; tide_wheel = "dist/<the .whl file>")'
            )
        return data


class FleetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    controller: ControllerConfig = Field(default_factory=ControllerConfig)  # type: ignore[arg-type]
    aws: AwsConfig = Field(default_factory=AwsConfig)  # type: ignore[arg-type]
    pools: dict[str, PoolConfig]
    default_model: str | None = Field(
        None, description="served name of the model for requests without one (default: first)"
    )

    @model_validator(mode="after")
    def _names_and_coverage(self) -> FleetConfig:
        if not self.pools:
            raise ValueError("pools: declare at least one pool")
        for name, pool in self.pools.items():
            if not name.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"pools.{name}: names are letters, digits, '-' and '_'")
            pool.name = name
        paths: dict[str, str | None] = {}
        for pool in self.pools.values():
            key = model_key(pool)
            if paths.setdefault(key, pool.model) != pool.model and key:
                raise ValueError(
                    f"pools.{pool.name}: served name {key!r} is another pool's model too "
                    f"({paths[key]!r}, not {pool.model!r})"
                )
        if self.default_model is not None and self.default_model not in paths:
            raise ValueError(f"default_model {self.default_model!r} is no pool's served name")
        for key in self.model_keys():
            served = {b for p in self.pools.values() if model_key(p) == key for b in p.buckets}
            missing = [b for b in BUCKETS if b not in served]
            if missing:
                of = f" of model {key!r}" if len(paths) > 1 else ""
                raise ValueError(f"no pool{of} serves bucket(s) {', '.join(missing)}")
        self.lora_tables()
        return self

    def lora_tables(self) -> dict[str, dict[str, str]]:
        """Each model's LoRA adapters (name -> path), by model key; ValueError names a
        clash (infra/fleet/fleet_adapters.py)."""
        pools = self.pools.values()
        taken = {n for p in pools for n in (model_key(p), *p.aliases) if n}
        return merge_lora(((p.name, model_key(p), p.lora) for p in pools), taken)

    def model_keys(self) -> list[str]:
        """The served models, by pool name key (see model_key), the default first."""
        keys = list(dict.fromkeys(model_key(p) for p in self.pools.values()))
        if self.default_model is not None:
            keys.remove(self.default_model)
            keys.insert(0, self.default_model)
        return keys

    def home_pool(self, bucket: str, model: str | None = None) -> PoolConfig:
        """The pool sized for this bucket's backlog of `model` (a model_key; None: the
        default model): the one preferring it most."""
        key = self.model_keys()[0] if model is None else model
        best = min(
            (p for p in self.pools.values() if bucket in p.buckets and model_key(p) == key),
            key=lambda p: p.buckets.index(bucket),
        )
        return best

    def home_buckets(self, pool: str) -> list[str]:
        key = model_key(self.pools[pool])
        return [b for b in BUCKETS if self.home_pool(b, key).name == pool]

    def needs_served_models(self) -> bool:
        """Whether its processes must be told the served models (TIDE_SERVED_MODELS): more
        than one, or LoRA adapters on them."""
        return len(self.model_keys()) > 1 or any(self.lora_tables().values())

    def served_models(self, default_path: str) -> list[dict[str, Any]]:
        """TIDE_SERVED_MODELS for this fleet (infra/wire/models.py), the default first; a
        pool naming no model serves `default_path` (the settings' model)."""
        out = []
        lora = self.lora_tables()
        for key in self.model_keys():
            pools = [p for p in self.pools.values() if model_key(p) == key]
            path = next((p.model for p in pools if p.model), default_path)
            out.append({
                "name": key or path, "model": path,
                "aliases": list(dict.fromkeys(a for p in pools for a in p.aliases)),
                "bucket_short_max": next((p.bucket_short_max for p in pools
                                          if p.bucket_short_max), None),
                "bucket_medium_max": next((p.bucket_medium_max for p in pools
                                           if p.bucket_medium_max), None),
                **({"lora": lora[key]} if lora.get(key) else {}),
            })  # fmt: skip
        return out

    def catalog(self, default_path: str) -> ModelCatalog:
        return served(self.served_models(default_path), default_path)

    def pool_lanes(self, default_path: str) -> dict[str, str]:
        """pool -> the lane of its model's queues and backlog ('' for the default model)."""
        cat = self.catalog(default_path)
        out = {}
        for name, pool in self.pools.items():
            m = cat.resolve(model_key(pool) or default_path)
            assert m is not None
            out[name] = m.lane
        return out


def model_key(pool: PoolConfig) -> str:
    """The served name a pool's model goes by; '' for a pool without one: those serve one
    model together, named by its path (a pool's `model`, else the settings'), as pools
    did before a fleet served many models."""
    return pool.served_name or ""


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


def split_model_spec(spec: str) -> tuple[str, str]:
    """`tide up --model`: ``NAME=PATH`` (the name clients use) or ``PATH`` (its own name)."""
    name, sep, path = spec.partition("=")
    return (name, path) if sep and name and path else (spec, spec)
