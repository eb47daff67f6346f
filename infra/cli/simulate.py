"""``tide simulate``: run the fleet simulator (infra/sim/) over a trace with each
scaling policy and report GPU-hours and queue waits (a rich table, --json, --plot)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

# The repository's example fleet, used when there is no fleet.toml where tide runs.
EXAMPLE_FLEET = Path(__file__).resolve().parents[2] / "fleet.example.toml"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate the fleet over a trace: Tide's scaling policy against baselines",
        description=(
            "Discrete-event simulation of the fleet's pools over a job trace, once per policy: "
            "tide (the controller's autoscale.decide), list_length (KEDA-style "
            "queued jobs / target per worker, scale to zero after KEDA's cooldown) and "
            "static_peak (enough always-on workers for the peak hour, raised until each pool "
            "meets its SLO). Reports GPU-hours, queue waits, SLO attainment and peak workers, "
            "in total and per model: a fleet whose pools serve several models (served_name) "
            "routes each job to its model's pools, and each pool scales on its own model's "
            "backlog. See docs/simulator.md."
        ),
    )
    p.add_argument(
        "--trace", default="diurnal",
        help="diurnal (one day, peak 10x trough, bursts), mixed (80/20 short/long, 6 h), "
             "batch-windows (diurnal plus nightly batches with 24 h and 6 h windows) or "
             'FILE.jsonl: one {"arrival_s", "prompt_tokens", "max_tokens", "output_tokens"?, '
             '"model"?} per line; model is a served name or alias of the fleet, absent for '
             "its default model (default diurnal)",
    )  # fmt: skip
    p.add_argument(
        "--models", default=None, metavar="MIX",
        help="built-in traces: split the jobs over the fleet's models by these shares, e.g. "
             "a:0.7,b:0.3 (default: every job is the default model's)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="seed of the built-in traces (default 0)")
    p.add_argument(
        "--fleet", default=None,
        help="fleet.toml (default: ./fleet.toml if present, else the repo's fleet.example.toml)",
    )  # fmt: skip
    p.add_argument(
        "--hours", type=float, default=None,
        help="trace length: built-in traces are generated this long (default 24 for diurnal, "
             "6 for mixed); a file's jobs after this are dropped",
    )  # fmt: skip
    p.add_argument(
        "--service", default=None,
        help='measured service curves, JSON {"pools": {"<pool>": {"tokens_per_s": '
             '{"<batch>": tok/s, ...}, ...}}} (default: the planner\'s roofline of each pool\'s '
             "model, llama-3-8b where it names none, on its device)",
    )  # fmt: skip
    p.add_argument(
        "--policies", default="tide,list_length,static_peak",
        help="comma-separated subset of tide,tide_size_only,list_length,static_peak "
             "(tide_size_only: tide without the queued jobs' deadlines)",
    )  # fmt: skip
    p.add_argument(
        "--list-length", type=int, default=5,
        help="list_length policy: target queued jobs per worker (KEDA's default 5)",
    )  # fmt: skip
    p.add_argument(
        "--tide-rate", choices=["controller", "model"], default="controller",
        help="tide's per-worker rate: learned from heartbeats as the controller does (default), "
             "or the service model's true full-worker rate",
    )  # fmt: skip
    p.add_argument(
        "--json", action="store_true",
        help='print {"policies": {name: figures}}; figures include "models": per model '
             "{jobs, p50_wait_s, p99_wait_s, gpu_hours}",
    )  # fmt: skip
    p.add_argument("--plot", default=None, metavar="FILE", help="write a PNG of workers and waits")
    p.set_defaults(func=cmd_simulate)


def _fleet(path: str | None) -> Any:
    from tide_fleet.infra.fleet.fleet_config import load_fleet

    if path is None:
        if Path("fleet.toml").is_file():
            return load_fleet("fleet.toml"), "fleet.toml"
        return load_fleet(EXAMPLE_FLEET), f"{EXAMPLE_FLEET.name} (the example)"
    return load_fleet(path), path


def _mix(spec: str) -> dict[str, float]:
    """--models a:0.7,b:0.3 -> {"a": 0.7, "b": 0.3} (shares are checked against the fleet)."""
    mix: dict[str, float] = {}
    for item in (i.strip() for i in spec.split(",") if i.strip()):
        name, sep, share = item.rpartition(":")
        try:
            value = float(share)
        except ValueError:
            value = math.nan
        if not sep or not name or math.isnan(value) or name in mix:
            raise ValueError(f"--models: {item!r} is not NAME:SHARE (each model once)")
        mix[name] = value
    if not mix:
        raise ValueError("--models: give NAME:SHARE,... (e.g. a:0.7,b:0.3)")
    return mix


def cmd_simulate(args: argparse.Namespace) -> int:
    from tide_fleet.infra.sim.compare import simulate
    from tide_fleet.infra.sim.models import FleetModels
    from tide_fleet.infra.sim.policies import POLICIES, KedaConfig
    from tide_fleet.infra.sim.service_model import service_models
    from tide_fleet.infra.sim.simulation import SimConfig
    from tide_fleet.infra.sim.traces import TRACES, builtin_trace, load_trace

    try:
        if args.list_length < 1:
            raise ValueError(f"--list-length must be >= 1, got {args.list_length}")
        if args.hours is not None and not args.hours > 0:
            raise ValueError(f"--hours must be > 0, got {args.hours}")
        policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
        for name in policies:
            if name not in POLICIES:
                raise ValueError(f"--policies: unknown {name!r}; choose from {POLICIES}")
        fleet, fleet_path = _fleet(args.fleet)
        models = service_models(fleet, args.service)
        served = FleetModels(fleet)
        mix = _mix(args.models) if args.models is not None else None
        if args.trace in TRACES:
            jobs, span = builtin_trace(args.trace, args.seed, args.hours, mix, served)
        elif mix is not None:
            raise ValueError("--models applies to the built-in traces; a file names each "
                             "job's model in its model field")  # fmt: skip
        elif args.trace.endswith(".jsonl") or Path(args.trace).is_file():
            jobs, span = load_trace(args.trace, args.hours, served)
        else:
            raise ValueError(
                f"--trace {args.trace!r}: not a built-in trace ({', '.join(TRACES)}) "
                "nor a .jsonl file"
            )
        results = simulate(
            fleet, jobs, span, models, policies,
            config=SimConfig(tide_rate=args.tide_rate),
            keda=KedaConfig(list_length=args.list_length),
        )  # fmt: skip
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.plot:
        plot(results, jobs, span, args.plot, title=f"trace {args.trace}, seed {args.seed}")
    if args.json:
        print(json.dumps({"policies": {n: r.summary() for n, r in results.items()}}))
    else:
        _table(results, fleet, fleet_path, models, args, len(jobs), span)
    return 0


def _table(results: Any, fleet: Any, fleet_path: str, models: Any, args: Any, n: int, span: float):  # type: ignore[no-untyped-def]
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console = Console(width=max(console.width, 120))  # the table needs ~100-115 columns
    console.print(f"trace {args.trace} (seed {args.seed}): {n} jobs over {span / 3600:.1f} h")
    console.print(f"fleet {fleet_path}; tide's rate per worker: {args.tide_rate}")
    for name, pool in fleet.pools.items():
        console.print(
            f"  {name}: {pool.device}, {','.join(pool.buckets)}; target wait "
            f"{pool.target_wait_s:g}s, cold start {pool.cold_start_s:g}s, max {pool.max_workers}"
            f"; {models[name].source.replace('planner roofline: ', '')}"
        )
    table = Table(box=box.SIMPLE_HEAD)
    deadlines = any(r.deadline_jobs for r in results.values())
    cols = ("policy", "GPU-h", "vs static", "p50 wait", "p99 wait", "p99 short",
            "in SLO", "SLO met", "peak")  # fmt: skip
    for col in cols + (("on time",) if deadlines else ()):
        table.add_column(
            col, justify="left" if col == "policy" else "right", no_wrap=col == "policy"
        )
    static = results.get("static_peak")
    for name, r in results.items():
        vs = f"{r.gpu_hours / static.gpu_hours - 1:+.0%}" if static and static.gpu_hours else "-"
        table.add_row(
            name, f"{r.gpu_hours:.1f}", vs, f"{r.p50_wait_s:.1f}s", f"{r.p99_wait_s:.1f}s",
            f"{r.p99_wait_short_s:.1f}s", f"{r.slo_attainment:.2%}",
            "yes" if r.slo_met else "no", str(r.peak_workers),
            *([f"{r.deadline_attainment:.2%}"] if deadlines else []),
        )  # fmt: skip
    console.print(table)
    if deadlines:
        console.print("waits and SLOs count jobs without a deadline; on time: the share of")
        n_due = next(iter(results.values())).deadline_jobs
        console.print(f"the {n_due} deadline jobs finished by their deadline.")
    console.print("in SLO: jobs whose wait <= their home pool's target_wait_s; SLO met: every")
    console.print("pool's p99 wait (its home buckets' jobs) <= its target_wait_s. p99 by pool:")
    for name, r in results.items():
        pools = ", ".join(f"{p} {v:.1f}s" for p, v in r.p99_wait_by_pool.items())
        console.print(f"  {name}: {pools}" + (f" (workers: {r.note})" if r.note else ""))
    if len(fleet.model_keys()) > 1:
        console.print("by model (jobs, p50 / p99 wait, GPU-hours of its pools):")
        for name, r in results.items():
            console.print(f"  {name}: " + "; ".join(
                f"{m} {f.jobs} jobs, {f.p50_wait_s:.1f}s / {f.p99_wait_s:.1f}s, "
                f"{f.gpu_hours:.2f} GPU-h" for m, f in r.by_model.items()
            ))  # fmt: skip


def plot(results: Any, jobs: Any, span: float, path: str, title: str = "") -> None:
    """Arrivals, billed workers and p99 queue wait (15-minute windows) over time, per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tide_fleet.infra.stats import percentile

    end = max([span, *(r.end_s for r in results.values())])
    width = 900.0
    bins = max(math.ceil(span / width), 1)
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    counts = [0] * bins
    for job in jobs:
        counts[min(int(job.arrival // width), bins - 1)] += 1
    hours = [(i + 0.5) * width / 3600 for i in range(bins)]
    axes[0].plot(hours, [c / (width / 60) for c in counts], color="gray")
    axes[0].set_ylabel("arrivals / min")
    for name, r in results.items():
        ts = [t / 3600 for t, _ in r.timeline] + [end / 3600]
        axes[1].step(ts, [c for _, c in r.timeline] + [r.timeline[-1][1]], where="post",
                     label=f"{name} ({r.gpu_hours:.0f} GPU-h)")  # fmt: skip
        windows: list[list[float]] = [[] for _ in range(bins)]
        for arrival, wait in r.waits:
            windows[min(int(arrival // width), bins - 1)].append(wait)
        axes[2].plot(hours, [percentile(w, 99) if w else float("nan") for w in windows],
                     label=name)  # fmt: skip
    axes[1].set_ylabel("workers (billed)")
    axes[1].legend(loc="upper left")
    axes[2].set_ylabel("p99 queue wait, s")
    axes[2].set_yscale("symlog", linthresh=1.0)
    axes[2].set_xlabel("hours")
    axes[2].legend(loc="upper left")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
