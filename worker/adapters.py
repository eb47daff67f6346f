"""The LoRA adapters a worker serves: looked up by name, loaded into its engine on first sight.

A job on an adapter carries its name (the record's ``lora``; the take returns it with the
message). Before the worker asks the engine whether such a job fits, ``prepare`` makes sure
the engine has the adapter: it looks the name up (``infra/wire/adapters.py``: declared in
the catalog, else loaded at run time into ``tide:adapters``) and registers its files with
the engine once. What cannot be served raises ``AdapterRefused`` naming the adapter and
why, and the worker fails that job and goes on: a name no one serves, an adapter of another
model, files that do not load. A load that failed is not tried again for
``RETRY_FAILED_SECONDS`` (the jobs of a broken adapter fail fast).

A run-time adapter can be unloaded while its jobs wait: the worker looks it up again at
most every ``RECHECK_SECONDS`` when a job asks for it, and refuses the job once the name is
gone. One loaded again under the same name from other files replaces the old registration
once no request runs on the old one (until then its jobs wait). ``sweep`` drops the
adapters no longer served from the engine once nothing runs on them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from tide_fleet.infra.wire.adapters import lookup
from tide_fleet.infra.wire.models import ModelCatalog

if TYPE_CHECKING:  # annotations only: importing the engine loads torch
    from tide_fleet.worker.engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)

RECHECK_SECONDS = 1.0  # a run-time adapter's record is read again at most this often
RETRY_FAILED_SECONDS = 30.0  # an adapter whose load failed is not tried again sooner


class AdapterRefused(Exception):
    """A job's adapter cannot run on this worker; the message names the adapter and why."""


@dataclass
class _Loaded:
    path: str
    declared: bool
    checked_at: float


class WorkerAdapters:
    def __init__(
        self, engine: LLMEngine, client: redis.Redis, catalog: ModelCatalog, model: str
    ) -> None:
        """`model`: the served name of the model this worker runs, an adapter's parent
        ('': the catalog's default model)."""
        self.engine = engine
        self.redis = client
        self.catalog = catalog
        self.model = catalog.runs(model)
        self._loaded: dict[str, _Loaded] = {}
        self._failed: dict[tuple[str, str], tuple[str, float]] = {}  # (name, path) -> why, when

    def prepare(self, name: str) -> bool:
        """True when the engine holds `name` and can take a job on it; False when the job
        must wait (the adapter is being replaced); AdapterRefused when it cannot run here.
        Raises a Redis error as any Redis read does (the worker's outage handling)."""
        now = time.monotonic()
        have = self._loaded.get(name)
        if have is not None and (have.declared or now - have.checked_at < RECHECK_SECONDS):
            return True
        ref = lookup(self.redis, self.catalog, name)
        if ref is None:
            self._forget(name)
            raise AdapterRefused(
                f"adapter {name!r} is not served: not declared, and not loaded (or unloaded)"
            )
        if ref.parent != self.model:
            raise AdapterRefused(
                f"adapter {name!r} is an adapter of {ref.parent!r}; this worker runs {self.model!r}"
            )
        if have is not None and have.path == ref.path:
            have.checked_at = now
            return True
        if have is not None and not self._forget(name):
            return False  # replaced: the old files still run; the new ones once they end
        self._register(name, ref.path, ref.declared, now)
        return True

    def admits(self, num_prompt_tokens: int, max_tokens: int, lora: str) -> bool:
        """Whether the engine can start a job of this size on `lora` ('': the base) now, the
        adapter loaded first (its device slot counts in admission); AdapterRefused as
        `prepare`."""
        if lora and not self.prepare(lora):
            return False
        return self.engine.can_admit(num_prompt_tokens, max_tokens, lora=lora or None)

    def held(self) -> list[str]:
        """The adapters the engine holds now (in a device slot or in host memory): the ones
        a take prefers (infra/wire/queues.py ADAPTER_WINDOW)."""
        lora = self.stats()
        return sorted({*lora.get("on_device", ()), *lora.get("in_host", ())})

    def stats(self) -> dict[str, Any]:
        return dict(self.engine.stats().get("lora") or {})

    def sweep(self) -> None:
        """Unregister the run-time adapters no longer served (or served from other files
        now) that no request runs on; a lookup each (the heartbeat calls it)."""
        for name in [n for n, a in self._loaded.items() if not a.declared]:
            ref = lookup(self.redis, self.catalog, name)
            if ref is None or ref.path != self._loaded[name].path:
                self._forget(name)

    def _register(self, name: str, path: str, declared: bool, now: float) -> None:
        failed = self._failed.get((name, path))
        if failed is not None and now - failed[1] < RETRY_FAILED_SECONDS:
            raise AdapterRefused(failed[0])
        try:
            self.engine.register_adapter(name, path)
        except Exception as e:  # one adapter's files fail its jobs, never the worker
            # AdapterError (a ValueError) names the field or tensor and the limit.
            why = f"adapter {name!r} failed to load from {path!r}: {e}"
            log.warning("%s", why, exc_info=not isinstance(e, ValueError | OSError))
            self._failed = {
                k: v for k, v in self._failed.items() if now - v[1] < RETRY_FAILED_SECONDS
            }
            self._failed[(name, path)] = (why, now)
            raise AdapterRefused(why) from None
        self._failed.pop((name, path), None)
        self._loaded[name] = _Loaded(path, declared, now)
        log.info("adapter %s loaded from %s", name, path)

    def _forget(self, name: str) -> bool:
        """Unregister `name` from the engine unless requests still run on it (then it stays
        registered until a later sweep or prepare); whether it is gone."""
        if name not in self._loaded:
            return True
        try:
            self.engine.unregister_adapter(name)
        except ValueError as e:  # requests still run on it
            log.info("adapter %s stays registered for now: %s", name, e)
            return False
        del self._loaded[name]
        log.info("adapter %s unregistered: no longer served from its files", name)
        return True
