"""The FastAPI application. It only wires routers, state and error handling.

Never imports torch: token counting uses the `tokenizers` library on the same
tokenizer.json the workers load (tests/gateway/test_no_torch.py proves it).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis
import redis.asyncio
from fastapi import FastAPI

from tide_fleet.gateway.console import install_console
from tide_fleet.gateway.deps import GatewayState
from tide_fleet.gateway.errors import install_error_handlers
from tide_fleet.gateway.limits import BodySizeLimit
from tide_fleet.gateway.metrics import RequestMetrics
from tide_fleet.gateway.routes import (
    adapters,
    batches,
    files,
    health,
    jobs,
    models,
    openai,
    tokenize,
)
from tide_fleet.gateway.served import load_models
from tide_fleet.infra.batches.store import BatchStore
from tide_fleet.infra.jobs.files import FileStore
from tide_fleet.infra.jobs.storage import make_storage
from tide_fleet.infra.settings import Settings, get_settings
from tide_fleet.infra.wire.jobstore import JobStore

log = logging.getLogger(__name__)


def _async_pool(settings: Settings) -> redis.asyncio.BlockingConnectionPool:
    """Each open event stream holds a connection while it blocks in XREAD: a blocking pool
    makes request number N+1 wait for a free connection instead of failing with a 500."""
    return redis.asyncio.BlockingConnectionPool.from_url(
        settings.redis_url or "",
        max_connections=settings.gateway_redis_connections,
        timeout=settings.gateway_redis_wait_seconds,
    )


def load_state(settings: Settings) -> GatewayState:
    if not settings.redis_url:
        raise RuntimeError("the gateway needs REDIS_URL (tide up starts an embedded Redis)")
    client = redis.Redis.from_url(settings.redis_url)
    state = GatewayState(
        settings, client, JobStore(client), None, settings.model,
        aredis=redis.asyncio.Redis(connection_pool=_async_pool(settings)),
        files=FileStore(client, make_storage(settings)),
        batches=BatchStore(client),
    )  # fmt: skip
    load_models(state)  # every served model's tokenizer (gateway/served.py)
    return state


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.tide = load_state(settings)
        # Long-lived start-up objects (tokenizer, schemas) need no more GC scans: this
        # keeps collections short on the request path.
        gc.collect()
        gc.freeze()
        yield
        app.state.tide.redis.close()
        await app.state.tide.aredis.aclose()

    app = FastAPI(
        title="Tide",
        version="0.1.0",
        description="Queue-driven LLM inference: submit jobs, poll or stream them, get webhooks.",
        lifespan=lifespan,
        docs_url=None,  # /docs and /redoc come from installed assets (gateway/console)
        redoc_url=None,
    )
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestMetrics)  # outermost: it also counts the 413s of the limit
    for module in (jobs, openai, models, adapters, tokenize, files, batches, health):
        app.include_router(module.router)
    install_console(app)  # /console, /console/api/*, /docs and /redoc (offline)

    install_error_handlers(app)
    return app


app = create_app()
