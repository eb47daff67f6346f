"""``tide up``: the embedded fleet as supervised child processes, stopped cleanly on Ctrl-C."""

from __future__ import annotations

import argparse
import functools
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import httpx

from tide_fleet.infra.fleet.controller import Controller
from tide_fleet.infra.fleet.fleet_config import FleetConfig, load_fleet, local_default_fleet
from tide_fleet.infra.fleet.local_actuator import LocalActuator
from tide_fleet.infra.fleet.redis_server import EmbeddedRedis
from tide_fleet.infra.fleet.supervisor import Supervisor, ThreadProc, spawn
from tide_fleet.infra.jobs.celery_app import use_broker
from tide_fleet.infra.settings import REDIS_URL_FILE, Settings, child_env, use_settings

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

    @staticmethod
    def _spawner(argv: list[str], env: dict[str, str]) -> Callable[[], subprocess.Popen[bytes]]:
        return functools.partial(spawn, argv, env)

    def run(self) -> int:
        a, settings = self.args, self.settings
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        # Started with SIGINT ignored (`tide up &` from a shell without job control), Python
        # installs no KeyboardInterrupt handler and Ctrl-C's signal would be dropped.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sup = self.supervisor
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
            fleet = self._fleet_config()
            if len(fleet.model_keys()) > 1:  # every process learns the served models
                settings = settings.model_copy(
                    update={"served_models": fleet.served_models(settings.model)}
                )
                self.settings = settings
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

    def _fleet_config(self) -> FleetConfig:
        a = self.args
        try:
            if a.fleet:
                return load_fleet(a.fleet)
            models = a.model if len(a.model or []) > 1 else None
            if a.min_workers is None and a.max_workers is None:
                return local_default_fleet(a.workers, models=models)
            low = a.min_workers if a.min_workers is not None else 0
            high = a.max_workers if a.max_workers is not None else max(a.workers, 1)
            if high < 1:
                raise ValueError(f"--max-workers must be at least 1, got {high}")
            return local_default_fleet(low, high, models=models)
        except ValueError as e:  # names the field and the limit
            raise SystemExit(f"tide up: {e}") from None

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
