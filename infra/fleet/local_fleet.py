"""``tide up``: the embedded fleet as supervised child processes, stopped cleanly on Ctrl-C.

Without a fleet file, ``tide up`` runs ``local_default_fleet``: one CPU pool per model of its
``--model`` flags, each with the LoRA adapters its ``--lora NAME=PATH`` flags declare (a
``--lora`` belongs to the ``--model`` before it; before any, to the first), its workers
taking ``--tensor-parallel-size`` GPUs each (the pools' ``gpus_per_worker``). Declared
adapters are checked against their base before anything starts
(infra/fleet/fleet_adapters.py).
"""

from __future__ import annotations

import argparse
import functools
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from tide_fleet.infra.fleet.controller import Controller
from tide_fleet.infra.fleet.fleet_adapters import check_declared
from tide_fleet.infra.fleet.fleet_config import (
    FleetConfig,
    load_fleet,
    parse_fleet,
    split_model_spec,
)
from tide_fleet.infra.fleet.local_actuator import LocalActuator
from tide_fleet.infra.fleet.pool_gpus import check_flag_agrees
from tide_fleet.infra.fleet.redis_server import EmbeddedRedis
from tide_fleet.infra.fleet.supervisor import Supervisor, ThreadProc, spawn
from tide_fleet.infra.jobs.celery_app import use_broker
from tide_fleet.infra.settings import REDIS_URL_FILE, Settings, child_env, use_settings
from tide_fleet.infra.wire.models import catalog
from tide_fleet.infra.wire.protocol import BUCKETS

CELERY_APP = "tide_fleet.infra.jobs.celery_app:celery_app"


class LocalFleet:
    """Redis (embedded unless REDIS_URL is set), gateway, Celery and the controller, each
    supervised (infra/fleet/supervisor.py): restarted with back-off when it dies; `tide up`
    exits non-zero when it gives up. SIGINT or SIGTERM stops the whole tree.

    `settings` already hold the model and data folder of the flags (the Redis URL is set
    here when the embedded server starts); `worker_argv` are the engine flags every
    ``tide worker`` gets."""

    def __init__(
        self, args: argparse.Namespace, settings: Settings, worker_argv: list[str]
    ) -> None:
        self.args = args
        self.settings = settings
        self.worker_argv = worker_argv
        self.redis: EmbeddedRedis | None = None
        self.stop = threading.Event()
        self.supervisor = Supervisor()
        self.adapter_ranks: dict[str, int] = {}  # declared adapters, checked at start

    @staticmethod
    def _spawner(argv: list[str], env: dict[str, str]) -> Callable[[], subprocess.Popen[bytes]]:
        return functools.partial(spawn, argv, env)

    def run(self) -> int:
        a = self.args
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        # Started with SIGINT ignored (`tide up &` from a shell without job control), Python
        # installs no KeyboardInterrupt handler and Ctrl-C's signal would be dropped.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sup = self.supervisor
        fleet = self.prepare()
        settings = self.settings
        try:
            if not settings.redis_url:
                self.redis = EmbeddedRedis(settings.data_dir / "redis")
                embedded = self.redis
                sup.add("redis", lambda: embedded.start().proc)
                # So tools run from this folder (tide doctor) find the fleet without flags.
                (settings.data_dir / REDIS_URL_FILE).write_text(self.redis.url)
                settings = settings.model_copy(update={"redis_url": self.redis.url})
                self.settings = settings
            # The reaper and batch supervisor run in this process: they, and the Celery tasks
            # they send, use this fleet's settings; the children get them in their env.
            use_settings(settings)
            use_broker(settings.redis_url)
            env = child_env(settings)
            py = sys.executable
            gateway = [py, "-m", "uvicorn", "tide_fleet.gateway.app:app", "--host", a.host,
                       "--port", str(a.port), "--log-level", "warning"]  # fmt: skip
            sup.add("gateway", self._spawner(gateway, env))
            sup.add("webhooks", self._spawner(celery_argv(), env))
            # The controller (it hosts the reaper and batch supervisor) scales the workers.
            self.actuator = LocalActuator(fleet, env=env, worker_argv=self.worker_argv)
            self.controller = Controller(fleet, settings, self.actuator)
            # Metrics on a free port, advertised in Redis for tide doctor.
            run_controller = functools.partial(self.controller.run, self.stop, 0, close=False)
            sup.add("controller", lambda: ThreadProc(run_controller, "controller"))
            url = f"http://{a.host}:{a.port}"
            try:
                wait_ready(url, stop=self.stop, alive=sup.check)
            except RuntimeError as e:
                print(f"tide up: {e}", flush=True)
                return 1
            self._banner(url, settings)
            while not self.stop.is_set():
                if not sup.check():
                    return 1
                self.stop.wait(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            self.shutdown()
        return 1 if sup.gave_up else 0

    def prepare(self) -> FleetConfig:
        """The fleet to run, its served models in the settings, and its declared adapters
        checked: before anything starts. SystemExit names what is wrong, on one line."""
        fleet = self._fleet_config()
        if fleet.needs_served_models():  # every process learns the served models
            self.settings = self.settings.model_copy(
                update={"served_models": fleet.served_models(self.settings.model)}
            )
        self._check_adapters(self.settings)
        return fleet

    def _fleet_config(self) -> FleetConfig:
        a = self.args
        tp = getattr(a, "tensor_parallel_size", 1)
        try:
            if a.fleet:
                if getattr(a, "lora", None):
                    raise ValueError(
                        "--lora: with --fleet, declare adapters in the fleet file (a pool's "
                        "lora table)"
                    )
                fleet = load_fleet(a.fleet)
                check_flag_agrees({p.name: p.gpus_per_worker for p in fleet.pools.values()}, tp)
                return fleet
            models = a.model if len(a.model or []) > 1 else None
            lora = lora_tables(getattr(a, "lora", None) or [], len(a.model or []))
            if a.min_workers is None and a.max_workers is None:
                return local_default_fleet(a.workers, models=models, lora=lora, gpus_per_worker=tp)
            low = a.min_workers if a.min_workers is not None else 0
            high = a.max_workers if a.max_workers is not None else max(a.workers, 1)
            if high < 1:
                raise ValueError(f"--max-workers must be at least 1, got {high}")
            return local_default_fleet(low, high, models=models, lora=lora, gpus_per_worker=tp)
        except ValueError as e:  # names the field and the limit
            raise SystemExit(f"tide up: {e}") from None

    def _check_adapters(self, settings: Settings) -> None:
        """Each declared adapter read against its base; a mismatch stops `tide up`, naming
        the adapter and the mismatch on one line."""
        try:
            specs, unchecked = check_declared(catalog(settings), settings.cache_dir)
        except ValueError as e:  # an AdapterError: the adapter, its model, the mismatch
            raise SystemExit(f"tide up: {' '.join(str(e).split())}") from None
        self.adapter_ranks = {name: spec.rank for name, spec in specs.items()}
        if unchecked:
            print(f"tide up: adapters {', '.join(unchecked)} are checked by their workers "
                  "(their base's config is not on this machine)", flush=True)  # fmt: skip

    def _banner(self, url: str, settings: Settings) -> None:
        model = settings.model
        pools = ", ".join(
            f"{p.name} {p.min_workers}-{p.max_workers} on {'/'.join(p.buckets)}"
            for p in self.controller.fleet.pools.values()
        )
        names = [m["name"] for m in settings.served_models] or [model]
        on = names[0] if len(names) == 1 else f"{', '.join(names)} (default {names[0]})"
        lines = [
            f"Tide is up on {on}: worker pools {pools} (scaled by the controller)",
            f"  gateway  {url}   (API docs: {url}/docs, metrics: {url}/metrics)",
            f"  console  {url}/console",
            f"  redis    {settings.redis_url}" + ("   (embedded, AOF)" if self.redis else ""),
            f'  try      tide submit "Once upon a time" --wait --url {url}',
        ]
        adapters = [f"{a} on {m.name} (rank {self.adapter_ranks.get(a, '?')})"
                    for m in catalog(settings).models for a, _ in m.adapters]  # fmt: skip
        if adapters:
            lines.insert(2, f"  lora     {', '.join(adapters)}")
        if model.startswith("dummy:"):
            lines.append(f"  note     {model} has random weights: its text is meaningless")
        lines.append("Ctrl-C stops everything.")
        print("\n".join(lines), flush=True)

    def shutdown(self) -> None:
        self.stop.set()
        if getattr(self, "actuator", None) is not None:
            self.actuator.close()  # workers drain first, into the Redis still running
        self.supervisor.stop(["gateway", "webhooks"])
        if self.redis is not None:
            self.redis.stop()
            (self.settings.data_dir / REDIS_URL_FILE).unlink(missing_ok=True)


def local_default_fleet(
    min_workers: int = 1, max_workers: int | None = None, models: list[str] | None = None,
    lora: list[dict[str, str]] | None = None, gpus_per_worker: int = 1,
) -> FleetConfig:  # fmt: skip
    """What `tide up` runs without a fleet file: one CPU pool serving every bucket
    (min = max unless max_workers is given); bad sizes raise ValueError naming them. With
    two or more `models` (``PATH`` or ``NAME=PATH``, the first the default), one such pool
    per model, named after it. `lora`: each model's LoRA adapters, in the order of `models`
    (one model: the first table). Every worker takes `gpus_per_worker` GPUs (where the
    machine has GPUs)."""
    tables = lora or []
    pool = {
        "buckets": list(BUCKETS),
        "device": "cpu",
        "min_workers": min_workers,
        "max_workers": max(min_workers, 1) if max_workers is None else max_workers,
        "idle_s": 60.0,
        "cold_start_s": 5.0,
        "gpus_per_worker": gpus_per_worker,
    }
    pools: dict[str, dict[str, Any]] = {"default": pool | {"lora": tables[0] if tables else {}}}
    if models is not None and len(models) > 1:
        pools = {}
        for i, spec in enumerate(models):
            name, path = split_model_spec(spec)
            key = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[-40:].strip("-")
            while not key or key in pools:
                key = f"{key or 'model'}-{len(pools) + 1}"
            lora_i = tables[i] if i < len(tables) else {}
            pools[key] = {**pool, "model": path, "served_name": name, "lora": lora_i}
    return parse_fleet(
        {
            "controller": {"poll_interval_s": 1.0, "scale_in_cooldown_s": 10.0},
            "pools": pools,
        }
    )


def lora_tables(declared: list[tuple[int, str, str]], num_models: int) -> list[dict[str, str]]:
    """`tide up --lora`: (model index, name, path) each, as one table per model; ValueError
    for a name given twice."""
    tables: list[dict[str, str]] = [{} for _ in range(max(num_models, 1))]
    for i, name, path in declared:
        if any(name in t for t in tables):
            raise ValueError(f"--lora {name}: the name is given twice")
        tables[min(i, len(tables) - 1)][name] = path
    return tables


def celery_argv() -> list[str]:
    """The Celery worker for webhooks and batch tasks (its pool and concurrency are in
    infra/jobs/celery_app.py)."""
    return [sys.executable, "-m", "celery", "-A", CELERY_APP, "worker",
            "-Q", "tide.webhooks,tide.batches", "--loglevel=WARNING", "--without-heartbeat",
            "--without-gossip", "--without-mingle"]  # fmt: skip


def wait_ready(
    url: str,
    timeout: float = 120.0,
    stop: threading.Event | None = None,
    alive: Callable[[], bool] | None = None,
) -> None:
    """Block until the gateway at url answers /readyz with 200 (Redis and tokenizer ready).
    `alive` is asked on every try (the supervisor restarting what died); False ends it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (stop and stop.is_set()):
        if alive is not None and not alive():
            raise RuntimeError("gave up starting the fleet")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the gateway at {url} did not become ready")
