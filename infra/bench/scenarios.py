"""Scenario presets for ``tide bench --scenario``: the design's claims, measured side by side.

Each scenario has two arms. Each arm starts its own local fleet (embedded Redis, a
uvicorn gateway, ``tide worker`` processes with the arm's flags), warms it up, runs the
same seeded open-loop workload, and stops it; then both arms and their ratio are
printed. On a shared CPU the absolute figures drift; the ratio from one run is the result.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tide_fleet.infra.bench.load import RunConfig, RunResult, run_load
from tide_fleet.infra.bench.report import build_report, emit, report_config
from tide_fleet.infra.bench.scenario_fleet import ROOT, Arm, ScenarioFleet, WorkerSpec
from tide_fleet.infra.bench.workload import WorkItem, build_workload, workload_spec

# stories260K's prefill is too cheap for prefix caching to show through the fleet's
# per-request overhead; dummy:small (2,048-token context) makes prefill cost something.
SCENARIO_MODELS = {"prefix": "dummy:small"}
EVERYTHING_SHORT = {"TIDE_BUCKET_SHORT_MAX": "1000000", "TIDE_BUCKET_MEDIUM_MAX": "2000000"}


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


def run_scenario(
    args: argparse.Namespace, slos: dict[str, float], model: str, tokenizer: Any, max_len: int
) -> int:
    """Both arms of args.scenario serving `model` (materialised already; its tokenizer and
    context length size the prompts), compared and reported; 0 when every round completed
    requests."""
    scenario = build(args.scenario, max_len)
    spec = workload_spec(args, max_len, scenario.workload)
    items = build_workload(spec, tokenizer)
    seqs = args.max_num_seqs or scenario.max_num_seqs
    repeat = args.repeat or scenario.repeat
    print(
        f"scenario {scenario.name}: {scenario.claim}\n  model {model}, {len(items)} requests "
        f"at {spec.request_rate:g} req/s, max_num_seqs {seqs} per worker",
        file=sys.stderr,
    )
    base = Path(tempfile.mkdtemp(prefix=f"tide-bench-{scenario.name}-"))
    reports: dict[str, list[dict[str, Any]]] = {arm.name: [] for arm in scenario.arms}
    runs: dict[str, RunResult] = {}
    try:
        for k in range(repeat):
            # Alternate the order each round, so slow drift on a shared machine cancels.
            for arm in scenario.arms if k % 2 == 0 else scenario.arms[::-1]:
                label = arm.name if repeat == 1 else f"{arm.name} #{k + 1}"
                workdir = base / label.replace(" #", "-")
                workdir.mkdir()
                print(f"  {label}: starting {len(arm.workers)} worker(s)", file=sys.stderr)
                runs[label] = _run_arm(arm, model, workdir, seqs, items, args, scenario.priority)
                reports[arm.name].append(build_report(runs[label], slos, {}))
    finally:
        if args.keep_logs and args.out_dir:
            shutil.copytree(base, args.out_dir / "logs", dirs_exist_ok=True, ignore=_no_redis)
        shutil.rmtree(base, ignore_errors=True)
    extra = {"max_num_seqs": seqs, "model": model, "priority": args.priority or scenario.priority}
    report = compare(scenario, reports, report_config(args, spec) | extra | {"repeat": repeat})
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
    items: list[WorkItem],
    args: argparse.Namespace,
    priority: str,
) -> RunResult:
    fleet = ScenarioFleet(arm, model, workdir, seqs, args.dtype).start()
    try:
        fleet.warm_up()
        cfg = RunConfig(
            url=fleet.url,
            duration=args.duration,
            request_timeout=args.request_timeout,
            temperature=args.temperature,
            ignore_eos=args.ignore_eos,
            priority=args.priority or priority,
            progress=not args.no_progress and sys.stderr.isatty(),
        )
        return run_load(items, cfg)
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
