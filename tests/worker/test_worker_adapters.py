"""The worker's adapter registry against a stand-in engine: lookups, the parent check, a
failed load remembered, an adapter replaced or unloaded at run time."""

from __future__ import annotations

from typing import Any

import pytest

from tide_fleet.infra.wire.adapters import ADAPTERS_KEY, AdapterRef
from tide_fleet.infra.wire.models import served
from tide_fleet.worker import adapters as worker_adapters
from tide_fleet.worker.adapters import AdapterRefused, WorkerAdapters


class Engine:
    """register/unregister as LLMEngine's: a path that starts with 'bad' fails to load; an
    adapter with running requests cannot be unregistered."""

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}
        self.busy: set[str] = set()
        self.registrations = 0

    def register_adapter(self, name: str, path: str) -> Any:
        if path.startswith("bad"):
            raise ValueError(f"adapter {path!r}: no adapter_config.json")
        self.registrations += 1
        self.paths[name] = path

    def unregister_adapter(self, name: str) -> bool:
        if name in self.busy:
            raise ValueError(f"adapter {name!r} has 1 unfinished requests")
        return self.paths.pop(name, None) is not None

    def stats(self) -> dict[str, Any]:
        return {"lora": {"on_device": [], "in_host": sorted(self.paths)}}


@pytest.fixture
def registry(redis_client, monkeypatch) -> tuple[WorkerAdapters, Engine]:
    monkeypatch.setattr(worker_adapters, "RECHECK_SECONDS", 0.0)
    cat = served([{"name": "m", "model": "/m", "lora": {"decl": "/a/decl"}},
                  {"name": "other", "model": "/o"}], "/m")  # fmt: skip
    engine = Engine()
    return WorkerAdapters(engine, redis_client, cat, "m"), engine  # type: ignore[arg-type]


def _load(r, name: str, path: str, parent: str = "m") -> None:  # type: ignore[no-untyped-def]
    r.hset(ADAPTERS_KEY, name, AdapterRef(name, parent, path).to_json())


def test_declared_and_loaded_adapters_register_once(registry, redis_client):
    adapters, engine = registry
    _load(redis_client, "live", "/a/live")
    assert adapters.prepare("decl") and adapters.prepare("decl") and adapters.prepare("live")
    assert engine.paths == {"decl": "/a/decl", "live": "/a/live"} and engine.registrations == 2
    assert adapters.held() == ["decl", "live"]


def test_refusals_name_the_adapter_and_why(registry, redis_client):
    adapters, engine = registry
    _load(redis_client, "theirs", "/a/t", parent="other")
    _load(redis_client, "broken", "bad/path")
    with pytest.raises(AdapterRefused, match="adapter 'nope' is not served"):
        adapters.prepare("nope")
    with pytest.raises(AdapterRefused, match="'theirs' is an adapter of 'other'; this worker"):
        adapters.prepare("theirs")
    for _ in range(2):  # the second answer is remembered: no second load
        with pytest.raises(AdapterRefused, match="'broken' failed to load from 'bad/path': "):
            adapters.prepare("broken")
    assert engine.registrations == 0


def test_unloaded_or_replaced_adapters_leave_the_engine_once_unused(registry, redis_client):
    adapters, engine = registry
    _load(redis_client, "live", "/a/v1")
    assert adapters.prepare("live")
    _load(redis_client, "live", "/a/v2")  # replaced under the same name
    engine.busy.add("live")
    assert adapters.prepare("live") is False  # its jobs wait while the old files run
    engine.busy.clear()
    assert adapters.prepare("live") and engine.paths["live"] == "/a/v2"
    redis_client.hdel(ADAPTERS_KEY, "live")
    adapters.sweep()
    assert engine.paths == {}
    with pytest.raises(AdapterRefused, match="not served"):
        adapters.prepare("live")
