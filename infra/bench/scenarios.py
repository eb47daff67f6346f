"""Scenario presets for ``tide bench --scenario``: the seed's claims, measured side by side.

Each scenario has two arms. Each arm starts its own local fleet (embedded Redis, a
uvicorn gateway, ``tide worker`` processes with the arm's flags), warms it up, runs the
same seeded open-loop workload, and stops it; then both arms and their ratio are
printed. On a shared CPU the absolute figures drift; the ratio from one run is the result.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from infra.fleet.local_fleet import wait_ready
from infra.fleet.redis_server import EmbeddedRedis, free_port

ROOT = Path(__file__).resolve().parents[2]
# stories260K's prefill is too cheap for prefix caching to show through the fleet's
# per-request overhead; dummy:small (2,048-token context) makes prefill cost something.
SCENARIO_MODELS = {"prefix": "dummy:small"}
EVERYTHING_SHORT = {"TIDE_BUCKET_SHORT_MAX": "1000000", "TIDE_BUCKET_MEDIUM_MAX": "2000000"}


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


@dataclass
class Scenario:
    name: str
    claim: str
    arms: tuple[Arm, Arm]  # (the design Tide uses, the baseline)
    metric: str
    value: Callable[[dict[str, Any]], float]
    higher_is_better: bool
    workload: dict[str, Any]  # defaults for the workload flags
    max_num_seqs: int
    priority: str = "interactive"
    repeat: int = 1  # rounds of both arms (alternating order); medians are compared


def default_model(scenario: str | None = None) -> str:
    """The scenario's own model, else stories260K (beside the checkout or in /work/shared)
    when present, else dummy:tiny."""
    if scenario in SCENARIO_MODELS:
        return SCENARIO_MODELS[scenario]
    for c in (ROOT.parent / "shared/models/stories260K", Path("/work/shared/models/stories260K")):
        if (c / "model.safetensors").is_file():
            return str(c)
    return "dummy:tiny"


def build(name: str, max_len: int) -> Scenario:
    """The scenario called name, sized for a model with max_len tokens of context."""
    if name == "batching":
        return Scenario(
            "batching",
            "continuous batching beats static batching on throughput",
            (
                Arm("continuous", [WorkerSpec(flags=("--batching", "continuous"))]),
                Arm("static", [WorkerSpec(flags=("--batching", "static"))]),
            ),
            "output tokens/s",
            lambda r: float(r["summary"]["throughput"]["output_tokens_per_s"]),
            True,
            {
                # A burst the fleet cannot keep up with, so the engine's batching decides
                # throughput; small enough to stay under the gateway's 100 Redis connections
                # (each open event stream holds one).
                "num_requests": 80,
                "request_rate": 50.0,
                "short_len": (24, 24),
                "long_len": (min(192, max_len // 3), min(256, max_len // 2)),
            },
            16,
            # Batch jobs publish no per-token events: on a small CPU the streaming path
            # (worker -> Redis -> gateway -> client) would cap both arms at the same rate.
            "batch",
            3,  # short rounds whose makespan is noisy: three of each, medians compared
        )
    if name == "buckets":
        short_max, medium_max = max_len // 4, max_len // 2
        split = {"TIDE_BUCKET_SHORT_MAX": str(short_max), "TIDE_BUCKET_MEDIUM_MAX": str(medium_max)}
        return Scenario(
            "buckets",
            "length buckets with their own pools cut short jobs' p99 TTFT under an 80/20 mix",
            (
                Arm(
                    "buckets",
                    [WorkerSpec("short"), WorkerSpec("medium,long")],
                    split,
                    (8, short_max + 8),
                ),
                Arm("fifo", [WorkerSpec("short"), WorkerSpec("short")], EVERYTHING_SHORT),
            ),
            "short jobs' p99 TTFT ms",
            lambda r: float(r["by_kind"]["short"]["ttft_ms"]["p99"]),
            False,
            {
                # Bursty arrivals (gap CV about 1.6) at a rate that keeps a shared pool's
                # slots busy: then short jobs wait behind long ones (at 10 req/s the pools
                # were often idle and the ratio swung between 1.0 and 15 run to run).
                "num_requests": 300,
                "request_rate": 20.0,
                "burstiness": 0.4,
                "short_len": (16, 16),
                "long_len": (min(192, max_len // 3), min(256, max_len // 2)),
                "short_cap": short_max,
            },
            4,
        )
    if name == "prefix":
        return Scenario(
            "prefix",
            "prefix caching cuts TTFT when requests share a system prompt",
            (
                Arm("prefix-on", [WorkerSpec()]),
                Arm("prefix-off", [WorkerSpec(flags=("--no-prefix-caching",))]),
            ),
            "p50 TTFT ms",
            lambda r: float(r["summary"]["ttft_ms"]["p50"]),
            False,
            {
                "num_requests": 40,
                "request_rate": 4.0,
                "shared_prefix_len": max_len * 3 // 4,
                "short_len": (16, 8),
                "long_fraction": 0.0,
            },
            16,
        )
    raise ValueError(f"unknown scenario {name!r}")


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
            [py, "-m", "uvicorn", "gateway.app:app", "--port", port, "--log-level", "warning"],
            env,
        )
        for i, w in enumerate(self.arm.workers):
            argv = [
                py,
                "-m",
                "infra.cli",
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
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - lives with the process
        self.procs.append(
            subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        )

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


def run_scenario(args: argparse.Namespace, slos: dict[str, float]) -> int:
    from infra.bench import loadbench
    from infra.cli.bench import _config, emit, workload_spec
    from infra.jobs.submission import ModelInfo
    from worker.models.dummy import resolve_model_path  # torch: only in this parent

    model = args.model or default_model(args.scenario)
    resolve_model_path(model)  # materialise a dummy model once, before the fleets start
    info = ModelInfo.load(model)
    scenario = build(args.scenario, info.config.max_model_len)
    spec = workload_spec(args, info.config.max_model_len, scenario.workload)
    items = loadbench.build_workload(spec, info.tokenizer)
    seqs = args.max_num_seqs or scenario.max_num_seqs
    repeat = args.repeat or scenario.repeat
    print(
        f"scenario {scenario.name}: {scenario.claim}\n  model {model}, {len(items)} requests "
        f"at {spec.request_rate:g} req/s, max_num_seqs {seqs} per worker",
        file=sys.stderr,
    )
    base = Path(tempfile.mkdtemp(prefix=f"tide-bench-{scenario.name}-"))
    reports: dict[str, list[dict[str, Any]]] = {arm.name: [] for arm in scenario.arms}
    runs: dict[str, loadbench.RunResult] = {}
    try:
        for k in range(repeat):
            # Alternate the order each round, so slow drift on a shared machine cancels.
            for arm in scenario.arms if k % 2 == 0 else scenario.arms[::-1]:
                label = arm.name if repeat == 1 else f"{arm.name} #{k + 1}"
                workdir = base / label.replace(" #", "-")
                workdir.mkdir()
                print(f"  {label}: starting {len(arm.workers)} worker(s)", file=sys.stderr)
                runs[label] = _run_arm(arm, model, workdir, seqs, items, args, scenario.priority)
                reports[arm.name].append(loadbench.build_report(runs[label], slos, {}))
    finally:
        if args.keep_logs and args.out_dir:
            shutil.copytree(base, args.out_dir / "logs", dirs_exist_ok=True, ignore=_no_redis)
        shutil.rmtree(base, ignore_errors=True)
    extra = {"max_num_seqs": seqs, "model": model, "priority": args.priority or scenario.priority}
    report = compare(scenario, reports, _config(args, spec) | extra | {"repeat": repeat})
    for line in comparison_lines(report):
        print(line)
    emit(report, args, "scenario.json", runs)
    done = [r["summary"]["requests"]["completed"] for rs in reports.values() for r in rs]
    return 0 if all(done) else 1


def _run_arm(
    arm: Arm,
    model: str,
    workdir: Path,
    seqs: int,
    items: list[Any],
    args: argparse.Namespace,
    priority: str,
) -> Any:
    from infra.bench import loadbench

    fleet = ScenarioFleet(arm, model, workdir, seqs, args.dtype).start()
    try:
        fleet.warm_up()
        cfg = loadbench.RunConfig(
            url=fleet.url,
            duration=args.duration,
            request_timeout=args.request_timeout,
            temperature=args.temperature,
            ignore_eos=args.ignore_eos,
            priority=args.priority or priority,
            progress=not args.no_progress and sys.stderr.isatty(),
        )
        return loadbench.run_load(items, cfg)
    finally:
        fleet.stop()


def _no_redis(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if n in ("redis", "data")]


def compare(
    scenario: Scenario, reports: dict[str, list[dict[str, Any]]], config: dict[str, Any]
) -> dict[str, Any]:
    """Every round's report per arm, the metric's median per arm, and their ratio
    (> 1: the first arm, the design Tide uses, wins)."""
    (a, b) = (arm.name for arm in scenario.arms)
    rounds = {name: [scenario.value(r) for r in reports[name]] for name in (a, b)}
    va, vb = statistics.median(rounds[a]), statistics.median(rounds[b])
    ratio = round(va / vb if scenario.higher_is_better else vb / va, 3)
    return {
        "config": config | {"scenario": scenario.name},
        "comparison": {
            "claim": scenario.claim,
            "metric": scenario.metric,
            a: va,
            b: vb,
            "rounds": rounds,
            "ratio": ratio,
            "ratio_means": f"{a} is {ratio:.2f}x better than {b}",
        },
        "arms": reports,
    }


def comparison_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for name, rounds in report["arms"].items():
        for k, arm in enumerate(rounds):
            label = name if len(rounds) == 1 else f"{name} #{k + 1}"
            s = arm["summary"]
            lines.append(
                f"{label:<13} {s['throughput']['output_tokens_per_s']:8.1f} out tok/s   "
                f"TTFT p50 {s['ttft_ms']['p50'] or 0:8.1f} p99 {s['ttft_ms']['p99'] or 0:8.1f} ms"
                f"   {s['requests']['completed']}/{s['requests']['sent']} done"
            )
            if "short" in arm["by_kind"] and len(arm["by_kind"]) > 1:
                t = arm["by_kind"]["short"]["ttft_ms"]
                lines.append(
                    f"{'':<13} short jobs: TTFT p50 {t['p50'] or 0:.1f} p99 {t['p99'] or 0:.1f} ms"
                )
    c = report["comparison"]
    median = " (median of rounds)" if len(next(iter(c["rounds"].values()))) > 1 else ""
    lines.append(f"{c['metric']}{median}: " + ", ".join(f"{n} {c[n]:.1f}" for n in report["arms"]))
    lines.append(f"ratio {c['ratio']:.2f}: {c['ratio_means']}")
    return lines
