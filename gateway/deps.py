"""Shared dependencies of the routes: settings, the job store, the tokenizer, the tenant."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Annotated

import anyio
import redis
import redis.asyncio as aredis
from fastapi import Depends, HTTPException, Request

from tide_fleet.infra.batches.store import BatchStore
from tide_fleet.infra.contract.adapters import AdapterSpec
from tide_fleet.infra.jobs.files import FileStore
from tide_fleet.infra.jobs.submission import ModelInfo
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire import job_scripts
from tide_fleet.infra.wire.codec import decode_hash
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.models import ModelCatalog
from tide_fleet.infra.wire.protocol import Keys


@dataclass
class GatewayState:
    settings: Settings
    redis: redis.Redis
    store: JobStore
    model: ModelInfo | None
    model_name: str
    aredis: aredis.Redis
    files: FileStore
    batches: BatchStore
    load_error: str | None = None
    # Every served model (gateway/served.py); `model`/`model_name` are the default one's.
    catalog: ModelCatalog | None = None
    models: dict[str, ModelInfo] = field(default_factory=dict)  # served name -> loaded
    load_errors: dict[str, str] = field(default_factory=dict)  # served name -> why not
    tokenize_limiter: anyio.CapacityLimiter = field(init=False)
    serving_cache: tuple[float, set[tuple[str, str]]] | None = None  # gateway/capacity.py
    # LoRA adapters read and checked here, by (name, path); None: unreadable here
    # (gateway/adapters.py).
    adapter_specs: dict[tuple[str, str], AdapterSpec | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.create_script = self.aredis.register_script(job_scripts.CREATE)
        self.tokenize_limiter = anyio.CapacityLimiter(tokenize_threads(self.settings))

    async def get_job(self, job_id: str) -> dict[str, str] | None:
        raw = await self.aredis.hgetall(Keys.job(job_id))
        return decode_hash(raw) if raw else None

    async def get_job_parts(self, job_id: str) -> tuple[dict[str, str], bytes | None] | None:
        """The record without its ``choices``, and those as stored (bytes, undecoded: with
        logprobs they can be megabytes, which a read passes through as they are)."""
        raw = await self.aredis.hgetall(Keys.job(job_id))
        if not raw:
            return None
        choices = raw.pop(b"choices", None)
        return decode_hash(raw), choices


def tokenize_threads(settings: Settings) -> int:
    """Threads that may tokenise at once; by default one core is left to the event loop."""
    if settings.gateway_tokenize_threads:
        return settings.gateway_tokenize_threads
    return max(1, len(os.sched_getaffinity(0)) - 1)


async def get_state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.tide
    return state


StateDep = Annotated[GatewayState, Depends(get_state)]


def bearer_token(request: Request) -> str:
    """The key of 'Authorization: Bearer <key>', or ''."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" else ""


def is_operator(settings: Settings, token: str) -> bool:
    """An operator key (TIDE_ADMIN_KEYS); with no keys configured at all, everyone is."""
    if not settings.admin_keys:
        return not settings.api_keys
    return token in settings.admin_keys


async def current_tenant(request: Request, state: StateDep) -> str:
    keys = state.settings.api_keys
    if not keys:
        return "default"
    token = bearer_token(request)
    if token not in keys:
        raise HTTPException(
            status_code=401,
            detail="missing or invalid API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return keys[token]


TenantDep = Annotated[str, Depends(current_tenant)]


async def current_operator(request: Request, state: StateDep) -> str:
    """The operator's key (TIDE_ADMIN_KEYS; none configured and no API keys: anyone); a
    missing or unknown key is a 401, a tenant's key a 403."""
    settings, token = state.settings, bearer_token(request)
    if is_operator(settings, token):
        return token
    if token not in settings.api_keys:
        raise HTTPException(
            status_code=401,
            detail="missing or invalid API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    raise HTTPException(403, detail="this route needs an operator key (TIDE_ADMIN_KEYS)")


OperatorDep = Annotated[str, Depends(current_operator)]
