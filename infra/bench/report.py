"""What a ``tide bench`` run comes to: latency distributions (TTFT, TPOT, inter-token,
end-to-end, queue), throughput and goodput, overall and per length class; the JSON report,
its summary lines, and where both go."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tide_fleet.infra.bench.load import RequestRecord, RunResult
from tide_fleet.infra.bench.plots import write_plots
from tide_fleet.infra.bench.workload import WorkloadSpec
from tide_fleet.infra.stats import percentile

PERCENTILES = (50, 90, 99)
SLO_METRICS = ("ttft", "tpot", "e2e")
CONFIG_KEYS = ("url", "api", "priority", "scenario", "model", "request_rate", "burstiness",
               "num_requests", "duration", "seed", "trace", "sigma", "temperature", "ignore_eos",
               "goodput")  # fmt: skip


def distribution_ms(values: list[float]) -> dict[str, float | int | None]:
    """Mean, p50/p90/p99 and max in milliseconds of values in seconds."""
    out: dict[str, float | int | None] = {"count": len(values)}
    ms = [v * 1000 for v in values]
    out["mean"] = round(sum(ms) / len(ms), 3) if ms else None
    for p in PERCENTILES:
        out[f"p{p}"] = round(percentile(ms, p), 3) if ms else None
    out["max"] = round(max(ms), 3) if ms else None
    return out


def parse_slos(specs: list[str]) -> dict[str, float]:
    """['ttft:500', 'tpot:50'] -> {'ttft': 500.0, 'tpot': 50.0} (milliseconds)."""
    slos: dict[str, float] = {}
    for spec in specs:
        name, _, value = spec.partition(":")
        if name not in SLO_METRICS:
            raise ValueError(
                f"--goodput: unknown metric {name!r} in {spec!r} (use {', '.join(SLO_METRICS)})"
            )
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if not ms > 0 or math.isinf(ms):
            raise ValueError(
                f"--goodput: {name} needs a positive number of milliseconds, got {value!r}"
            )
        slos[name] = ms
    return slos


def meets_slos(rec: RequestRecord, slos: dict[str, float]) -> bool:
    if not rec.ok:
        return False
    for name, limit_ms in slos.items():
        value = getattr(rec, name)
        if value is not None and value * 1000 > limit_ms:  # tpot of a 1-token answer: none
            return False
    return True


def summarize(
    records: list[RequestRecord], duration: float, slos: dict[str, float]
) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    span = duration if duration > 0 else float("nan")
    out_tokens = sum(r.output_tokens for r in ok)
    summary: dict[str, Any] = {
        "requests": {"sent": len(records), "completed": len(ok), "failed": len(records) - len(ok)},
        "duration_s": round(duration, 3),
        "throughput": {
            "requests_per_s": round(len(ok) / span, 3),
            "output_tokens_per_s": round(out_tokens / span, 3),
            "total_tokens_per_s": round((out_tokens + sum(r.prompt_tokens for r in ok)) / span, 3),
        },
        "ttft_ms": distribution_ms([r.ttft for r in ok if r.ttft is not None]),
        "tpot_ms": distribution_ms([r.tpot for r in ok if r.tpot is not None]),
        "itl_ms": distribution_ms([x for r in ok for x in r.itls]),
        "e2e_ms": distribution_ms([r.e2e for r in ok if r.e2e is not None]),
        "queue_ms": distribution_ms([r.queue_s for r in ok if r.queue_s is not None]),
    }
    if slos:
        good = sum(meets_slos(r, slos) for r in records)
        summary["goodput"] = {
            "slos_ms": slos,
            "requests_per_s": round(good / span, 3),
            "fraction": round(good / len(records), 4) if records else None,
        }
    errors = sorted({r.error for r in records if r.error})
    if errors:
        summary["errors"] = errors[:10]
    return summary


def build_report(
    result: RunResult, slos: dict[str, float], config: dict[str, Any]
) -> dict[str, Any]:
    """The JSON report: config, summary, per-kind summaries, queue samples and requests."""
    kinds = sorted({r.kind for r in result.records})
    return {
        "config": config,
        "summary": summarize(result.records, result.duration, slos),
        "by_kind": {
            k: summarize([r for r in result.records if r.kind == k], result.duration, slos)
            for k in kinds
        },
        "queue_depth": result.queue_depth,
        "requests": [asdict(r) for r in result.records],
    }


def summary_lines(summary: dict[str, Any]) -> list[str]:
    r, t = summary["requests"], summary["throughput"]
    lines = [
        f"requests      {r['completed']}/{r['sent']} completed in {summary['duration_s']:.1f} s",
        f"throughput    {t['requests_per_s']:.2f} req/s, "
        f"{t['output_tokens_per_s']:.1f} output tok/s, {t['total_tokens_per_s']:.1f} total tok/s",
    ]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"):
        d = summary[key]
        if d["count"]:
            cells = "  ".join(f"p{p} {d[f'p{p}']:9.1f}" for p in PERCENTILES)
            lines.append(f"{key[:-3]:<6}ms    mean {d['mean']:9.1f}  {cells}")
    if "goodput" in summary:
        g = summary["goodput"]
        slo = ", ".join(f"{k} <= {v:g} ms" for k, v in g["slos_ms"].items())
        lines.append(
            f"goodput       {g['requests_per_s']:.2f} req/s "
            f"({g['fraction']:.0%} of requests; {slo})"
        )
    for error in summary.get("errors", []):
        lines.append(f"error         {error}")
    return lines


def report_config(args: argparse.Namespace, spec: WorkloadSpec) -> dict[str, Any]:
    """The report's config section: the flags that shape the run and the workload drawn."""
    config = {
        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k in CONFIG_KEYS
    }
    config["request_rate"] = spec.request_rate
    config["burstiness"] = spec.burstiness
    config["num_requests"] = spec.num_requests
    config["length_classes"] = [vars(c) for c in spec.classes]
    config["shared_prefix_len"] = spec.shared_prefix_len
    config["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return config


def emit(report: dict[str, Any], args: argparse.Namespace, name: str, runs: dict[str, Any]) -> None:
    """Print the summary; write the JSON report and plots when --out-dir is given."""
    if args.json:
        print(json.dumps(report.get("summary", report.get("comparison")), indent=2))
    elif "summary" in report:
        print("\n".join(summary_lines(report["summary"])))
        for kind, summary in report["by_kind"].items():
            if len(report["by_kind"]) > 1:
                ttft = summary["ttft_ms"]
                if ttft["count"]:
                    print(
                        f"  {kind:<6} TTFT ms p50 {ttft['p50']:.1f}  p99 {ttft['p99']:.1f}  "
                        f"({summary['requests']['completed']} requests)"
                    )
    if args.out_dir is None:
        return
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / name
    path.write_text(json.dumps(report, indent=1))
    written = [path]
    if not args.no_plots:
        written += write_plots(runs, args.out_dir)
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
