"""One scenario arm's fleet: embedded Redis, a uvicorn gateway and ``tide worker`` processes
with the arm's flags, started as the local fleet starts its children, warmed up, stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from tide_fleet.infra.fleet.local_fleet import wait_ready
from tide_fleet.infra.fleet.redis_server import EmbeddedRedis, free_port
from tide_fleet.infra.fleet.supervisor import spawn

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class WorkerSpec:
    buckets: str = "short,medium,long"
    flags: tuple[str, ...] = ()


@dataclass
class Arm:
    name: str
    workers: list[WorkerSpec]
    env: dict[str, str] = field(default_factory=dict)
    warmup_max_tokens: tuple[int, ...] = (8,)  # one warm-up job each, to reach every pool


class ScenarioFleet:
    """One arm's fleet: embedded Redis, gateway and workers as child processes."""

    def __init__(
        self, arm: Arm, model: str, workdir: Path, max_num_seqs: int, dtype: str | None
    ) -> None:
        self.arm = arm
        self.model = model
        self.workdir = workdir
        self.max_num_seqs = max_num_seqs
        self.dtype = dtype
        self.redis = EmbeddedRedis(workdir / "redis")
        self.url = f"http://127.0.0.1:{free_port()}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> ScenarioFleet:
        self.redis.start()
        env = {k: v for k, v in os.environ.items() if k != "TIDE_API_KEYS"}  # open access
        env |= {
            "REDIS_URL": self.redis.url,
            "TIDE_MODEL": self.model,
            "TIDE_DATA_DIR": str(self.workdir / "data"),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
            **self.arm.env,
        }
        py = sys.executable
        port = self.url.rsplit(":", 1)[1]
        self._spawn(
            "gateway",
            [
                py,
                "-m",
                "uvicorn",
                "tide_fleet.gateway.app:app",
                "--port",
                port,
                "--log-level",
                "warning",
            ],
            env,
        )
        for i, w in enumerate(self.arm.workers):
            argv = [
                py,
                "-m",
                "tide_fleet.infra.cli",
                "worker",
                "--buckets",
                w.buckets,
                "--max-num-seqs",
                str(self.max_num_seqs),
                *w.flags,
            ]
            self._spawn(f"worker-{i}", argv + (["--dtype", self.dtype] if self.dtype else []), env)
        wait_ready(self.url, timeout=120)
        client = redis.Redis.from_url(self.redis.url)
        deadline = time.monotonic() + 120
        while client.zcard("tide:workers") < len(self.arm.workers):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                tails = [f"--- {p.name}\n" + "\n".join(p.read_text().splitlines()[-15:])
                         for p in sorted(self.workdir.glob("*.log"))]  # fmt: skip
                raise RuntimeError(f"{self.arm.name}: the fleet did not start\n" + "\n".join(tails))
            time.sleep(0.2)
        client.close()
        return self

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.procs.append(spawn(argv, env=env, cwd=ROOT, log_file=self.workdir / f"{name}.log"))

    def warm_up(self) -> None:
        """A few jobs through every pool, so no arm pays first-step costs in its figures."""
        with httpx.Client(base_url=self.url, timeout=60) as client:
            ids = [
                client.post(
                    "/v1/jobs",
                    json={
                        "prompt": "Once upon a time",
                        "max_tokens": n,
                        "temperature": 0,
                        "ignore_eos": True,
                    },
                ).json()["id"]
                for n in self.arm.warmup_max_tokens
                for _ in range(2)
            ]
            for job_id in ids:
                deadline = time.monotonic() + 120
                while client.get(f"/v1/jobs/{job_id}").json()["status"] in (
                    "queued",
                    "in_progress",
                ):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{self.arm.name}: warm-up job {job_id} never finished")
                    time.sleep(0.05)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.redis.stop()
