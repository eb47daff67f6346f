"""``tide up``: the embedded fleet as child processes, stopped cleanly on Ctrl-C."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from infra.actuators import LocalActuator
from infra.controller import Controller
from infra.fleet_config import FleetConfig, load_fleet, local_default_fleet
from infra.redis_server import EmbeddedRedis
from infra.settings import REDIS_URL_FILE, Settings, get_settings


class LocalFleet:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.redis: EmbeddedRedis | None = None
        self.stop = threading.Event()

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.procs.append((name, subprocess.Popen(argv, env=env)))

    def run(self) -> int:
        from worker.models.dummy import resolve_model_path  # torch: only in this parent

        a = self.args
        env = dict(os.environ)
        if a.model:
            env["TIDE_MODEL"] = a.model
        if a.data_dir:
            env["TIDE_DATA_DIR"] = a.data_dir
        settings = Settings(**({"model": a.model} if a.model else {}))
        model = settings.model
        resolve_model_path(model)  # materialise a dummy model once, before the children start
        if not settings.redis_url:
            data = Path(a.data_dir or settings.data_dir) / "redis"
            self.redis = EmbeddedRedis(data).start()
            env["REDIS_URL"] = self.redis.url
            # So tools run from this folder (tide doctor) find the fleet without flags.
            (Path(a.data_dir or settings.data_dir) / REDIS_URL_FILE).write_text(self.redis.url)
            settings = Settings(redis_url=self.redis.url, model=model)
        # The reaper and batch supervisor run in this process and read the same settings.
        os.environ.update({k: env[k] for k in ("REDIS_URL", "TIDE_MODEL") if k in env})
        get_settings.cache_clear()
        if "infra.celery_app" in sys.modules:  # imported before REDIS_URL was known
            sys.modules["infra.celery_app"].celery_app.conf.broker_url = settings.redis_url
        py = sys.executable
        self._spawn(
            "gateway",
            [py, "-m", "uvicorn", "gateway.app:app", "--host", a.host, "--port", str(a.port),
             "--log-level", "warning"],
            env,
        )  # fmt: skip
        self._spawn(
            "webhooks",
            [py, "-m", "celery", "-A", "infra.celery_app:celery_app", "worker", "--pool=solo",
             "-Q", "tide.webhooks,tide.batches", "--loglevel=WARNING", "--without-heartbeat",
             "--without-gossip", "--without-mingle"],
            env,
        )  # fmt: skip
        # The controller (it hosts the reaper and batch supervisor) scales the local workers.
        fleet = self._fleet_config()
        self.actuator = LocalActuator(fleet, env=env, worker_argv=engine_argv(a))
        self.controller = Controller(fleet, settings, self.actuator)
        ctl = threading.Thread(
            target=self.controller.run, args=(self.stop, 0), daemon=True
        )  # metrics on a free port, advertised in Redis for tide doctor
        ctl.start()
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        url = f"http://{a.host}:{a.port}"
        try:
            wait_ready(url, stop=self.stop)
            self._banner(url, settings, model)
            while not self.stop.is_set():
                for name, proc in self.procs:
                    if proc.poll() is not None:
                        print(
                            f"tide up: {name} exited with {proc.returncode}; stopping", flush=True
                        )
                        self.stop.set()
                self.stop.wait(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            self.shutdown()
        return 0

    def _fleet_config(self) -> FleetConfig:
        a = self.args
        try:
            if a.fleet:
                return load_fleet(a.fleet)
            if a.min_workers is None and a.max_workers is None:
                return local_default_fleet(a.workers)
            low = a.min_workers if a.min_workers is not None else 0
            high = a.max_workers if a.max_workers is not None else max(a.workers, 1)
            if high < 1:
                raise ValueError(f"--max-workers must be at least 1, got {high}")
            return local_default_fleet(low, high)
        except ValueError as e:  # names the field and the limit
            raise SystemExit(f"tide up: {e}") from None

    def _banner(self, url: str, settings: Settings, model: str) -> None:
        pools = ", ".join(
            f"{p.name} {p.min_workers}-{p.max_workers} on {'/'.join(p.buckets)}"
            for p in self.controller.fleet.pools.values()
        )
        lines = [
            f"Tide is up on {model}: worker pools {pools} (scaled by the controller)",
            f"  gateway  {url}   (API docs: {url}/docs, metrics: {url}/metrics)",
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
            self.actuator.close()
        for _, proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.redis is not None:
            self.redis.stop()
            url_file = Path(self.args.data_dir or get_settings().data_dir) / REDIS_URL_FILE
            url_file.unlink(missing_ok=True)


def engine_argv(a: argparse.Namespace) -> list[str]:
    """The engine flags of `tide up`/`tide controller`, passed on to each `tide worker`."""
    argv = ["--device", a.device, "--max-num-seqs", str(a.max_num_seqs)]
    argv += ["--max-num-batched-tokens", str(a.max_num_batched_tokens)]
    argv += ["--attention-backend", a.attention_backend]
    argv += ["--batching", getattr(a, "batching", "continuous")]
    if getattr(a, "no_prefix_caching", False):
        argv.append("--no-prefix-caching")
    if a.dtype:
        argv += ["--dtype", a.dtype]
    if a.kv_cache_memory:
        argv += ["--kv-cache-memory", str(a.kv_cache_memory)]
    return argv


def wait_ready(url: str, timeout: float = 120.0, stop: threading.Event | None = None) -> None:
    """Block until the gateway at url answers /readyz with 200 (Redis and tokenizer ready)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (stop and stop.is_set()):
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the gateway at {url} did not become ready")
